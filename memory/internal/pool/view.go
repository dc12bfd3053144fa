package pool

import (
	"encoding/json"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"

	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// The pool in a window. A request that names a pool prefix gets the
// tenant's entries under it in its stable block, newest first (by
// version), as "[SHARED:key] value" lines: a string value as its text, any
// other JSON compacted, each folded onto one line and cut at
// maxShownBytes. The view is made once per pool revision and prefix and
// shared (immutable), and its fingerprint (keys and versions) lets the
// stable block stay byte for byte the same until the pool under the prefix
// changes.

// Bounds of a view.
const (
	maxShownBytes = 1000 // one entry's value as shown
	maxViews      = 32   // views cached per tenant pool
)

// View is what a prefix shows of a pool at one revision. Immutable.
type View struct {
	Rev uint64
	// FP fingerprints the items' keys and versions; 0 for none.
	FP uint64
	// Items are newest first, at most Options.ViewMaxEntries.
	Items []Item
}

// Item is one entry of a View.
type Item struct {
	Key     string
	Version uint64
	Seg     string // "[SHARED:key] value\n"
}

var viewSeed = maphash.MakeSeed()

// segment renders an entry as a stable block segment.
func segment(e *Entry) string {
	var v string
	if json.Unmarshal(e.Value, &v) != nil {
		v = string(e.Value) // stored compacted
	}
	return "[SHARED:" + sanitize.Text(e.Key, maxKeyBytes) + "] " + sanitize.Text(v, maxShownBytes) + "\n"
}

// View returns the view of the tenant's pool under prefix ("": every key);
// nil when no entry matches and the view was just made (a cached view is
// returned as it is, empty or not).
func (ps *Pools) View(tenant, prefix string) (*View, error) {
	p, err := ps.get(tenant)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := ps.syncShared(p); err != nil {
		return nil, err
	}
	if v, ok := p.views[prefix]; ok && v.Rev == p.rev {
		return v, nil // an empty view too, as it always was
	}
	var es []*Entry
	for k, e := range p.entries {
		if strings.HasPrefix(k, prefix) {
			es = append(es, e)
		}
	}
	slices.SortFunc(es, func(a, b *Entry) int {
		switch {
		case a.Version > b.Version:
			return -1
		case a.Version < b.Version:
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	es = es[:min(len(es), ps.o.ViewMaxEntries)]
	v := &View{Rev: p.rev}
	if len(es) > 0 {
		var h maphash.Hash
		h.SetSeed(viewSeed)
		for _, e := range es {
			v.Items = append(v.Items, Item{Key: e.Key, Version: e.Version, Seg: segment(e)})
			h.WriteString(e.Key)
			h.WriteByte(0)
			h.WriteString(strconv.FormatUint(e.Version, 10))
			h.WriteByte(0)
		}
		v.FP = h.Sum64() | 1
	}
	if len(p.views) >= maxViews {
		clear(p.views)
	}
	if p.views == nil {
		p.views = map[string]*View{}
	}
	p.views[prefix] = v
	if len(v.Items) == 0 {
		return nil, nil
	}
	return v, nil
}

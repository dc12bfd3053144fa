package memory

import (
	"math"
	"slices"
	"strings"
	"time"
)

// workingMemory is a session's active set: the memories recalled recently,
// at most Options.Recall.ActiveSetSize, each expiring Recall.ActiveSetDecay after
// its last activation, plus Hebbian links between memories recalled
// together. It lives in memory only (a restart starts with an empty set,
// i.e. one full recall). Guarded by the session's mu.
type workingMemory struct {
	active   map[string]activation // unit id → last activation
	links    map[linkKey]link
	adj      map[string]map[string]struct{} // the links by memory, both ways
	injected []string                       // the recalled ids of the last block, sorted
	seq      uint64                         // activation counter: orders activations at equal times
}

type activation struct {
	t time.Time
	n uint64
}

func (a activation) before(b activation) bool {
	return a.t.Before(b.t) || (a.t.Equal(b.t) && a.n < b.n)
}

type linkKey struct{ a, b string } // a < b

type link struct {
	w float64   // weight at t, in (0, 1]
	t time.Time // last update
}

const (
	linkRate    = 0.3  // Hebbian learning rate: w += rate·(1−w) per co-activation
	linkMin     = 0.2  // weight from which a linked memory is a neighbour
	linkDrop    = 0.01 // weights below this are forgotten
	maxLinks    = 4096 // per session
	recallExtra = 8    // hits asked beyond k, for those filtered out
)

// weight returns the link's weight decayed to now.
func (l link) weight(now time.Time, halfLife time.Duration) float64 {
	age := now.Sub(l.t)
	if age <= 0 {
		return l.w
	}
	return l.w * math.Exp2(-age.Seconds()/halfLife.Seconds())
}

func mkLink(a, b string) linkKey {
	if b < a {
		a, b = b, a
	}
	return linkKey{a, b}
}

// expire drops active memories not activated for ttl.
func (wm *workingMemory) expire(now time.Time, ttl time.Duration) {
	for id, a := range wm.active {
		if now.Sub(a.t) >= ttl {
			delete(wm.active, id)
		}
	}
}

// activate marks ids active at now, evicting the least recently activated
// beyond capacity.
func (wm *workingMemory) activate(ids []string, now time.Time, capacity int) {
	if wm.active == nil {
		wm.active = map[string]activation{}
	}
	wm.seq++
	for _, id := range ids {
		wm.active[id] = activation{now, wm.seq}
	}
	for len(wm.active) > capacity {
		var victim string
		var va activation
		for id, a := range wm.active {
			if victim == "" || a.before(va) || (a == va && id > victim) {
				victim, va = id, a
			}
		}
		delete(wm.active, victim)
	}
}

// coactivate strengthens the links between every pair of ids.
func (wm *workingMemory) coactivate(ids []string, now time.Time, halfLife time.Duration) {
	if len(ids) < 2 {
		return
	}
	if wm.links == nil {
		wm.links = map[linkKey]link{}
	}
	for i := range ids {
		for j := i + 1; j < len(ids); j++ {
			k := mkLink(ids[i], ids[j])
			l, ok := wm.links[k]
			w := l.weight(now, halfLife)
			wm.links[k] = link{w: w + linkRate*(1-w), t: now}
			if !ok {
				wm.addAdj(k.a, k.b)
				wm.addAdj(k.b, k.a)
			}
		}
	}
	if len(wm.links) > maxLinks {
		wm.pruneLinks(now, halfLife)
	}
}

func (wm *workingMemory) addAdj(a, b string) {
	if wm.adj == nil {
		wm.adj = map[string]map[string]struct{}{}
	}
	m := wm.adj[a]
	if m == nil {
		m = map[string]struct{}{}
		wm.adj[a] = m
	}
	m[b] = struct{}{}
}

// dropLink forgets one link.
func (wm *workingMemory) dropLink(k linkKey) {
	delete(wm.links, k)
	for _, p := range [][2]string{{k.a, k.b}, {k.b, k.a}} {
		if m := wm.adj[p[0]]; m != nil {
			delete(m, p[1])
			if len(m) == 0 {
				delete(wm.adj, p[0])
			}
		}
	}
}

// pruneLinks forgets faded links, then the weakest beyond maxLinks·3/4.
func (wm *workingMemory) pruneLinks(now time.Time, halfLife time.Duration) {
	type kw struct {
		k linkKey
		w float64
	}
	var all []kw
	for k, l := range wm.links {
		w := l.weight(now, halfLife)
		if w < linkDrop {
			wm.dropLink(k)
			continue
		}
		all = append(all, kw{k, w})
	}
	if keep := maxLinks * 3 / 4; len(all) > keep {
		slices.SortFunc(all, func(a, b kw) int {
			if a.w != b.w {
				if a.w < b.w {
					return -1
				}
				return 1
			}
			return strings.Compare(a.k.a+"\x00"+a.k.b, b.k.a+"\x00"+b.k.b)
		})
		for _, x := range all[:len(all)-keep] {
			wm.dropLink(x.k)
		}
	}
}

// neighbourhood returns the active ids and the ids linked to one of them
// with a weight of at least linkMin.
func (wm *workingMemory) neighbourhood(now time.Time, halfLife time.Duration) map[string]bool {
	n := make(map[string]bool, len(wm.active)*2)
	for id := range wm.active {
		n[id] = true
		for nb := range wm.adj[id] {
			if wm.links[mkLink(id, nb)].weight(now, halfLife) >= linkMin {
				n[nb] = true
			}
		}
	}
	return n
}

func (wm *workingMemory) isActive(id string) bool { _, ok := wm.active[id]; return ok }

// linkWeight returns the current weight between a and b (0 when unlinked).
func (wm *workingMemory) linkWeight(a, b string, now time.Time, halfLife time.Duration) float64 {
	l, ok := wm.links[mkLink(a, b)]
	if !ok {
		return 0
	}
	return l.weight(now, halfLife)
}

// forget drops a deleted memory from the set, its links and the block.
func (wm *workingMemory) forget(id string) {
	delete(wm.active, id)
	for nb := range wm.adj[id] {
		wm.dropLink(mkLink(id, nb))
	}
	wm.injected = slices.DeleteFunc(wm.injected, func(x string) bool { return x == id })
}

// reset empties the working memory (session deleted or reset).
func (wm *workingMemory) reset() { *wm = workingMemory{} }

// overlap is the share of probe hits in the neighbourhood.
func overlap(probe []string, hood map[string]bool) float64 {
	if len(probe) == 0 {
		return 0
	}
	n := 0
	for _, id := range probe {
		if hood[id] {
			n++
		}
	}
	return float64(n) / float64(len(probe))
}

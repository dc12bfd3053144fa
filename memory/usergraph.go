package memory

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
)

// The user's knowledge graph. The user's cross-session index (users.go)
// gets an index.EntityGraph like a session's own index: the triples of all
// the user's sessions, each link's documents the user-index documents of
// its supporting units (<session hash>|<role>|<unit id>), so a new session
// of the user reaches an earlier session's facts through the entities its
// question names.
//
// It is derived data, kept like the user index: a session's links are
// replaced whenever its triples changed (a new triple, a merge, an
// operator's delete, the cascade of a unit's deletion) at the same sync
// that brings its documents up to date, and dropped with its documents
// when the session is deleted or its log is gone. It is saved beside the
// index (<user hash>.ugraph, JSON, written atomically after the index) and
// reconciled the same way when loaded: sessions whose log changed after
// the older of the two files are synced again; a missing or unreadable
// graph file makes every session of the user sync again. A link whose
// document left the index (deleted, or past Recall.UserMaxDocs) reaches
// nothing: the index ignores graph documents it does not hold.
//
// Bounds: a session keeps at most knowledge.MaxSessionTriples triples; the user's
// graph keeps the newest maxUserTriples links of all the sessions (the
// oldest are dropped when a sync passes it), so memory and the work of
// building the graph (on the first search after a change) stay bounded
// however many sessions the user has.

// maxUserTriples is the most links a user's graph keeps: four sessions'
// worth of triples at their own bound, about 4 MB at the largest texts.
const maxUserTriples = 4 * knowledge.MaxSessionTriples

// maxUserGraphBytes bounds the graph file read at load.
const maxUserGraphBytes = 64 << 20

// userGraphFile is the saved graph: links by session hash.
type userGraphFile struct {
	V     int                         `json:"v"`
	Links map[string][]knowledge.Link `json:"links"`
}

func userGraphPath(indexPath string) string {
	return strings.TrimSuffix(indexPath, ".uidx") + ".ugraph"
}

// userLinksLocked returns the session's triples as links of its user's
// graph, or ok false when they did not change since the last sync (first:
// the first sync since the session loaded). Called with sess.mu held.
func (sess *session) userLinksLocked(first bool) (links []knowledge.Link, ok bool) {
	if !first && sess.uKbVer == sess.kb.Ver {
		return nil, false
	}
	sess.uKbVer = sess.kb.Ver
	return knowledge.Links(knowledge.SortedTriples(sess.kb.Triples), func(id string) string {
		if u := sess.units[id]; u != nil {
			return sess.unitDocID(u)
		}
		return ""
	}), true
}

// setLinks replaces the links of the session hashed h (none: drops them)
// and keeps the newest maxUserTriples of the user's links.
func (um *userMem) setLinks(h string, links []knowledge.Link) {
	um.mu.Lock()
	defer um.mu.Unlock()
	if slices.EqualFunc(links, um.links[h], func(a, b knowledge.Link) bool {
		return a.Subject == b.Subject && a.Predicate == b.Predicate && a.Object == b.Object && a.At.Equal(b.At) && slices.Equal(a.Docs, b.Docs)
	}) {
		return // unchanged (a session's first sync after it loaded)
	}
	if um.links == nil {
		um.links = map[string][]knowledge.Link{}
	}
	um.nLinks += len(links) - len(um.links[h])
	if len(links) == 0 {
		delete(um.links, h)
	} else {
		um.links[h] = links
	}
	um.linksVer++
	um.ver++
	if um.nLinks > maxUserTriples {
		um.trimLinksLocked()
	}
}

// trimLinksLocked keeps the newest maxUserTriples links. Called with um.mu
// held.
func (um *userMem) trimLinksLocked() {
	type ref struct {
		h  string
		at time.Time
		i  int
	}
	all := make([]ref, 0, um.nLinks)
	for h, ls := range um.links {
		for i, l := range ls {
			all = append(all, ref{h, l.At, i})
		}
	}
	slices.SortFunc(all, func(a, b ref) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		if c := cmp.Compare(a.h, b.h); c != 0 {
			return c
		}
		return cmp.Compare(a.i, b.i)
	})
	keep := map[string][]knowledge.Link{}
	for _, r := range all[:min(len(all), maxUserTriples)] {
		keep[r.h] = append(keep[r.h], um.links[r.h][r.i])
	}
	um.links, um.nLinks = keep, min(len(all), maxUserTriples)
}

// attachGraph gives the user's index the graph of the user's links when
// they changed since it was last attached.
func (um *userMem) attachGraph(x *index.Index) {
	um.mu.Lock()
	defer um.mu.Unlock()
	if um.graphSet && um.graphVer == um.linksVer {
		return
	}
	var g *index.EntityGraph
	if um.nLinks > 0 {
		hs := make([]string, 0, len(um.links))
		for h := range um.links {
			hs = append(hs, h)
		}
		slices.Sort(hs)
		var all []knowledge.Link
		for _, h := range hs {
			all = append(all, um.links[h]...)
		}
		g = index.NewEntityGraph(knowledge.IndexLinks(all))
	}
	x.SetGraph(g)
	um.graphSet, um.graphVer = true, um.linksVer
}

// graphLen returns the number of links in the user's graph.
func (um *userMem) graphLen() int {
	um.mu.Lock()
	defer um.mu.Unlock()
	return um.nLinks
}

// loadLinks reads the user's saved graph; an error means it must be
// rebuilt from the logs.
func (um *userMem) loadLinks() (time.Time, error) {
	path := userGraphPath(um.path)
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return time.Time{}, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxUserGraphBytes+1))
	if err != nil {
		return time.Time{}, err
	}
	if len(b) > maxUserGraphBytes {
		return time.Time{}, fmt.Errorf("memory: user graph %s: over %d bytes: %w", path, maxUserGraphBytes, durable.ErrCorrupt)
	}
	var gf userGraphFile
	if err := json.Unmarshal(b, &gf); err != nil || gf.V != 1 {
		return time.Time{}, fmt.Errorf("memory: user graph %s: %v: %w", path, err, durable.ErrCorrupt)
	}
	um.mu.Lock()
	defer um.mu.Unlock()
	um.links, um.nLinks = map[string][]knowledge.Link{}, 0
	for h, ls := range gf.Links {
		if len(ls) > 0 {
			um.links[h] = ls
			um.nLinks += len(ls)
		}
	}
	if um.nLinks > maxUserTriples {
		um.trimLinksLocked()
	}
	um.linksVer++
	return fi.ModTime(), nil
}

// saveLinks writes the user's graph beside its index.
func (um *userMem) saveLinks() error {
	um.mu.Lock()
	gf := userGraphFile{V: 1, Links: make(map[string][]knowledge.Link, len(um.links))}
	for h, ls := range um.links {
		gf.Links[h] = ls // replaced, never changed in place
	}
	um.mu.Unlock()
	b, err := json.Marshal(&gf)
	if err != nil {
		return err
	}
	return durable.WriteFile(userGraphPath(um.path), b)
}

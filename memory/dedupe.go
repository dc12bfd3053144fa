package memory

import (
	"hash/maphash"
	"strings"
)

// Memory units are deduplicated by content: a message that leaves the
// window (eviction), is cut by a diverging full-history request (trunc) or
// arrives after its history moved on (orphan reply) becomes a unit only if
// no unit of the session already holds the same role and text (spaces
// around it ignored), and never when its text is empty. Without it 50
// identical requests made 49 identical units, and 20 full-history clients
// sharing a session multiplied units 47-fold (issue 12 row 12).
//
// An evicted message that gets no unit still leaves the window for good:
// a "drop" record keeps that across restarts. Deduplication happens when a
// unit is created; a restart may show a duplicate pair when the first of
// the two was not yet written by the worker when the second was cut.

// dedupIndex maps a unit's content key to the unit. It is rebuilt from
// the session's units when they changed behind its back (unitsVer moved)
// and kept current by putUnit.
type dedupIndex struct {
	ver uint64
	m   map[uint64]*Unit
}

var dedupSeed = maphash.MakeSeed()

func contentKey(role, text string) uint64 {
	var h maphash.Hash
	h.SetSeed(dedupSeed)
	h.WriteString(role)
	h.WriteByte(0)
	h.WriteString(strings.TrimSpace(text))
	return h.Sum64()
}

// dupUnit returns the unit holding role and text, or nil.
func (s *session) dupUnit(role, text string) *Unit {
	if s.dedup.m == nil || s.dedup.ver != s.unitsVer {
		s.dedup.m = make(map[uint64]*Unit, len(s.units))
		for _, u := range s.units {
			s.dedup.m[contentKey(u.Role, u.Content)] = u
		}
		s.dedup.ver = s.unitsVer
	}
	u := s.dedup.m[contentKey(role, text)]
	if u == nil || s.units[u.ID] != u || u.Role != role || strings.TrimSpace(u.Content) != strings.TrimSpace(text) {
		return nil
	}
	return u
}

// redundant reports whether entry e needs no unit: its text is empty or a
// unit already holds it.
func (s *session) redundant(e *entry) bool {
	text := e.text()
	return strings.TrimSpace(text) == "" || s.dupUnit(e.msg.Role, text) != nil
}

// putUnit adds u to the session's units, keeping the dedup index current.
func (s *session) putUnit(u *Unit) {
	current := s.dedup.m != nil && s.dedup.ver == s.unitsVer
	s.units[u.ID] = u
	s.unitsChanged()
	if current {
		s.dedup.m[contentKey(u.Role, u.Content)] = u
		s.dedup.ver = s.unitsVer
	}
}

package llamacpp

// The slot scheduler: which llama.cpp slot a request goes to and what must
// move first. It does no I/O and owns no lock (the connector holds its
// mutex around every call), so its decisions are tested without a server.

import "time"

// slotInfo is what the connector believes one slot holds.
type slotInfo struct {
	id int
	// sess is the session whose KV the slot holds or is about to hold ("":
	// none: free, or a background call's scratch); a stateless request
	// has a key of its own. owner is whom a state saved from the slot
	// belongs to (the session, or the tenant's stateless requests).
	sess, owner string
	// chain is a prefix of what the slot's KV covers (the prompt of the
	// last request that completed there); empty when unknown. next is the
	// prompt of the newest request in flight there.
	chain, next chain
	// tokens is the slot's token count after that request (engine timings).
	tokens int
	// dirty means the slot holds KV that no stored state covers yet.
	dirty bool
	// version counts changes of the slot's content, so a save that ran
	// while the content changed does not mark the newer content clean.
	version uint64
	// inflight counts requests sent with this id_slot and not yet After'ed;
	// bg those of them that are background calls.
	inflight, bg int
	// clientEnd is when the last client request there ended (zero: none
	// since the connector started); background calls wait for a quiet
	// slot.
	clientEnd time.Time
	// lastUse orders slots for eviction (scheduler sequence number).
	lastUse uint64
	// saveFailed stops background retries of a content that failed to save.
	saveFailed bool
	// computeMs sums the engine's prefill time of the unsaved KV.
	computeMs float64
	// preload is where a predictive preload into the slot stands.
	preload preloadState
}

// preloadState is where a predictive preload into a slot stands.
type preloadState uint8

const (
	// preloadNone: no preload is under way or unused.
	preloadNone preloadState = iota
	// preloadReserved: the connector chose the slot and is fetching the
	// state; the slot still holds its occupant, who keeps it if a request
	// of theirs comes first (the preload is then abandoned). Client
	// requests of other sessions take such a slot only as a last resort.
	preloadReserved
	// preloadRestoring: the slot is the predicted session's and the engine
	// is restoring its state; a request of that session waits for it (the
	// cheaper way: the restore is under way).
	preloadRestoring
	// preloadLoaded: the state is in the slot and its session has not come
	// back yet. A session coming back uses it; a placement of another
	// session, a forget or a restart wastes it.
	preloadLoaded
)

// holds reports whether the slot holds, or is being filled with, KV worth
// keeping for a session.
func (s *slotInfo) holds() bool {
	return s.sess != "" && (s.dirty || s.chain.len() > 0 || s.inflight > 0 && s.next.len() > 0)
}

type scheduler struct {
	slots []*slotInfo
	seq   uint64
	// wasted counts preloaded states dropped unused.
	wasted int64
}

func newScheduler(n int) *scheduler {
	s := &scheduler{}
	for i := range n {
		s.slots = append(s.slots, &slotInfo{id: i})
	}
	return s
}

// placement is the scheduler's answer for one request.
type placement struct {
	slot *slotInfo
	// resident: the session already holds the slot; nothing moves.
	resident bool
	// prevSess and prevDirty describe the occupant the request displaces:
	// when prevDirty, its KV must be saved before anything else uses the
	// slot.
	prevSess  string
	prevOwner string
	prevDirty bool
	prevChain chain
	prevVer   uint64
	// preempt: background calls are in flight on the slot; the client
	// request placed there takes it from them (the connector cancels them).
	preempt bool
}

// place picks the slot for a client request of session sess (a stateless
// request comes with a key of its own) whose prompt is ch, and assigns it:
// a session keeps its slot; otherwise the choice is, in order, an idle
// slot holding no session's KV, the least recently used idle slot whose KV
// is already stored, the least recently used idle slot (its KV to be saved
// first), a slot busy only with background calls (taken from them:
// placement.preempt), then the least recently used slot (the engine queues
// the request behind the one in flight).
func (s *scheduler) place(sess string, ch chain) placement {
	s.seq++
	for _, sl := range s.slots {
		if sess != "" && sl.sess == sess {
			sl.lastUse = s.seq
			sl.inflight++
			sl.next = ch
			return placement{slot: sl, resident: true}
		}
	}
	return s.assign(s.victim(), sess, ch)
}

// placeOn assigns slot id to a request of sess whose prompt is ch,
// whatever it holds (a client that named its id_slot): the occupant is
// displaced as by place.
func (s *scheduler) placeOn(id int, sess string, ch chain) placement {
	s.seq++
	sl := s.slots[id]
	if sess != "" && sl.sess == sess {
		sl.lastUse = s.seq
		sl.inflight++
		sl.next = ch
		return placement{slot: sl, resident: true}
	}
	return s.assign(sl, sess, ch)
}

// placeBackground places a background call (the sidecar's own) whose
// prompt is ch on an idle slot, preferring, like place, one holding no
// session's KV, then one whose KV is stored, then the least recently used
// (its KV to be saved first), and a slot holding a preloaded state, or
// avoid (the slot a preload is about to take; nil: none), only when every
// slot holds or is being given one; and only on a slot where no client
// request ended within quiet(slot) before now. When none qualifies it
// reports false and how long until an idle slot becomes quiet (0: none is
// idle; wait for a request to end). A background call never keeps the
// slot afterwards.
func (s *scheduler) placeBackground(ch chain, now time.Time, quiet func(*slotInfo) time.Duration, avoid *slotInfo) (placement, time.Duration, bool) {
	better := func(cur, cand *slotInfo) *slotInfo {
		if cur == nil || cand.lastUse < cur.lastUse {
			return cand
		}
		return cur
	}
	var free, clean, idle, preloaded *slotInfo
	var wait time.Duration
	for _, sl := range s.slots {
		if sl.inflight > 0 || sl.preload == preloadReserved || sl.preload == preloadRestoring {
			continue
		}
		kept := sl.preload == preloadLoaded || sl == avoid
		if left := sl.clientEnd.Add(quiet(sl)).Sub(now); !sl.clientEnd.IsZero() && left > 0 && !kept {
			if wait == 0 || left < wait {
				wait = left
			}
			continue
		}
		switch {
		case kept:
			preloaded = better(preloaded, sl)
		case !sl.holds():
			free = better(free, sl)
		case !sl.dirty:
			clean = better(clean, sl)
		default:
			idle = better(idle, sl)
		}
	}
	for _, sl := range s.slots {
		if sl.preload == preloadNone && sl != avoid {
			// Another slot will do, now or once it is idle and quiet:
			// leave the state a client is expected back to.
			preloaded = nil
		}
	}
	for _, v := range []*slotInfo{free, clean, idle, preloaded} {
		if v != nil {
			s.seq++
			return s.assign(v, "", ch), 0, true
		}
	}
	return placement{}, wait, false
}

// assign gives slot v to sess ("" for a background call) with prompt ch and
// describes what it displaces.
func (s *scheduler) assign(v *slotInfo, sess string, ch chain) placement {
	p := placement{slot: v, prevSess: v.sess, prevOwner: v.owner, prevDirty: v.holds() && (v.dirty || v.inflight > 0), prevChain: v.chain, prevVer: v.version,
		preempt: sess != "" && v.bg > 0}
	if v.inflight > 0 && v.next.len() > 0 {
		// A request still in flight there adds to the occupant's KV: the
		// engine runs the save once it is done, so the state covers it.
		p.prevChain = v.next
	}
	if v.preload == preloadLoaded {
		s.wasted++
	}
	v.preload = preloadNone // a reservation in progress sees the version change
	v.sess, v.owner = sess, ""
	v.chain, v.next = chain{}, ch
	v.tokens = 0
	v.dirty = false
	v.saveFailed = false
	v.computeMs = 0
	v.version++
	v.lastUse = s.seq
	v.inflight++
	if sess == "" {
		v.bg++
	}
	return p
}

// victim is the slot a client request not resident anywhere takes (see
// place).
func (s *scheduler) victim() *slotInfo {
	better := func(cur, cand *slotInfo) *slotInfo {
		if cur == nil || cand.lastUse < cur.lastUse {
			return cand
		}
		return cur
	}
	var free, clean, idle, bgOnly, preloading, any *slotInfo
	for _, sl := range s.slots {
		any = better(any, sl)
		if sl.preload == preloadReserved || sl.preload == preloadRestoring {
			if sl.inflight == 0 {
				preloading = better(preloading, sl)
			}
			continue
		}
		if sl.inflight > 0 {
			if sl.inflight == sl.bg {
				bgOnly = better(bgOnly, sl)
			}
			continue
		}
		switch {
		case !sl.holds():
			free = better(free, sl)
		case !sl.dirty:
			clean = better(clean, sl)
		default:
			idle = better(idle, sl)
		}
	}
	for _, v := range []*slotInfo{free, clean, idle, bgOnly, preloading} {
		if v != nil {
			return v
		}
	}
	return any
}

// done records the end, at now, of a request placed on sl for sess. ok
// means the engine answered it successfully, so the slot now covers ch and
// holds tokens tokens; bg marks a background call, whose KV is scratch. It
// reports whether the slot now holds unsaved KV of sess.
func (s *scheduler) done(sl *slotInfo, sess string, bg, ok bool, ch chain, tokens int, now time.Time) bool {
	sl.inflight = max(0, sl.inflight-1)
	if bg {
		sl.bg = max(0, sl.bg-1)
	} else {
		sl.clientEnd = now
	}
	if sl.sess != sess {
		return false // another session took the slot meanwhile
	}
	sl.version++
	switch {
	case bg:
		sl.sess, sl.chain, sl.tokens, sl.dirty = "", chain{}, 0, false
	case ok:
		sl.chain, sl.tokens, sl.dirty, sl.saveFailed = ch, tokens, true, false
	default:
		// The engine failed: what the slot holds is unknown, and nothing
		// is saved from it; the session keeps the slot, and the engine
		// reuses whatever still matches.
		sl.chain, sl.dirty = chain{}, false
	}
	return sl.dirty
}

// forget drops every slot of sess; it returns their ids.
func (s *scheduler) forget(sess string) []int {
	var ids []int
	for _, sl := range s.slots {
		if sl.sess == sess {
			s.clear(sl)
			ids = append(ids, sl.id)
		}
	}
	return ids
}

// lose forgets what one slot holds (another client used it); its session
// is placed again, and restored, on its next request.
func (s *scheduler) lose(sl *slotInfo) { s.clear(sl) }

// clear forgets what sl holds; a preloaded state there is wasted.
func (s *scheduler) clear(sl *slotInfo) {
	if sl.preload == preloadLoaded {
		s.wasted++
	}
	sl.preload = preloadNone
	sl.sess, sl.chain, sl.tokens, sl.dirty = "", chain{}, 0, false
	sl.version++
}

// reset forgets what every slot holds (the engine restarted).
func (s *scheduler) reset() {
	for _, sl := range s.slots {
		s.clear(sl)
	}
}

// saveCandidate returns an idle slot with unsaved KV, least recently used
// first, or nil.
func (s *scheduler) saveCandidate() *slotInfo {
	var c *slotInfo
	for _, sl := range s.slots {
		if sl.dirty && !sl.saveFailed && sl.inflight == 0 && sl.holds() && (c == nil || sl.lastUse < c.lastUse) {
			c = sl
		}
	}
	return c
}

// pending counts slots with unsaved KV.
func (s *scheduler) pending() int {
	n := 0
	for _, sl := range s.slots {
		if sl.dirty && !sl.saveFailed {
			n++
		}
	}
	return n
}

// clients counts the client requests in flight on the slots.
func (s *scheduler) clients() int {
	n := 0
	for _, sl := range s.slots {
		n += sl.inflight - sl.bg
	}
	return n
}

// resident reports whether a slot holds session sess's KV.
func (s *scheduler) resident(sess string) bool {
	for _, sl := range s.slots {
		if sl.sess == sess {
			return true
		}
	}
	return false
}

package tiers

// Moving blocks between tiers: the maintenance goroutine and Maintain trim
// tiers above their soft budget by demoting victims (Focus to Working to
// Archive), and a hit in a lower tier promotes the block upward.

// loop is the maintenance goroutine the Store owns: one Maintain per kick
// until Close.
func (s *Store) loop() {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case <-s.kick:
			s.Maintain()
		}
	}
}

// kickIfNeeded wakes the maintenance goroutine when a tier is over its soft
// watermark. It never blocks.
func (s *Store) kickIfNeeded() {
	over := s.working.overSoft() || (s.focus != nil && s.focus.overSoft())
	if !over && s.archive != nil {
		s.archive.mu.Lock()
		over = s.archive.opts.Budget.overSoft(s.archive.bytes, s.archive.tokens)
		s.archive.mu.Unlock()
	}
	if over {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// Maintain runs one maintenance pass now: it demotes blocks from Focus and
// Working until each is under its soft watermark and trims the Archive to
// its soft watermark. The maintenance goroutine calls it when a tier
// crosses its soft watermark; tests and tools may call it directly.
func (s *Store) Maintain() {
	s.maintMu.Lock()
	defer s.maintMu.Unlock()
	if s.focus != nil {
		for s.focus.overSoft() && s.demoteOne(s.focus, "", false) {
		}
	}
	for s.working.overSoft() && s.demoteOne(s.working, "", false) {
	}
	if s.archive != nil {
		s.archive.Trim()
	}
}

func (s *Store) below(t *memTier) *memTier {
	if t == s.focus {
		return s.working
	}
	return nil
}

// makeRoom demotes blocks from t until size bytes and tokens fit under its
// hard watermark. The caller holds the stripe of held. Victims under
// another stripe are taken only with TryLock, so when a victim is busy the
// tier may overshoot until the maintenance goroutine catches up.
func (s *Store) makeRoom(t *memTier, held string, size, tokens int64) {
	for !t.fits(size, tokens) && s.demoteOne(t, held, true) {
	}
}

// demoteOne moves t's policy victim one tier down (Working's to the
// Archive, or nowhere when there is none, or when the Archive already has
// it). It reports whether it made progress. The caller holds the stripe of
// held ("" for none); try makes it give up on a busy victim.
func (s *Store) demoteOne(t *memTier, held string, try bool) bool {
	victim, ok := t.victim()
	if !ok {
		return false
	}
	if mu := s.stripe(victim); held == "" || mu != s.stripe(held) {
		if try {
			if !mu.TryLock() {
				return false
			}
		} else {
			mu.Lock()
		}
		defer mu.Unlock()
	}
	start := s.opts.Clock.Now()
	e, v, ok, err := t.take(victim)
	if !ok {
		return true // removed meanwhile
	}
	if err == nil {
		if next := s.below(t); next != nil {
			if next.fitsEmpty(e.size, e.meta.Tokens) {
				s.makeRoom(next, victim, e.size, e.meta.Tokens)
				_, err = next.insert(victim, v, e.hint, e.lossy, e.hot, false)
			} else if s.archive != nil && !s.archive.Contains(victim) {
				err = s.archive.Put(victim, v, e.lossy)
			}
		} else if s.archive != nil && !s.archive.Contains(victim) {
			err = s.archive.Put(victim, v, e.lossy)
		}
	}
	// On error the block is dropped: a tier over budget must shrink, and a
	// cached block can be computed again. Durable blocks are in the
	// Archive already.
	_ = err
	t.removeEntry(e)
	s.demoteLat[t.tier].Observe(s.opts.Clock.Now().Sub(start))
	t.demotions.Add(1)
	s.moves.Add(1)
	return true
}

// promote moves key from Working to Focus if Focus has room; it gives up
// rather than wait for anything.
func (s *Store) promote(key string) {
	mu := s.stripe(key)
	if !mu.TryLock() {
		return
	}
	defer mu.Unlock()
	e, v, ok, err := s.working.take(key)
	if !ok || err != nil {
		return
	}
	if in, _ := s.focus.insert(key, v, e.hint, e.lossy, e.hot, true); !in {
		return
	}
	s.working.removeEntry(e)
	s.focus.promotions.Add(1)
	s.moves.Add(1)
	s.kickIfNeeded()
}

// promoteFromArchive copies a block read from the Archive into Working if
// Working has room and the block is still the current one.
func (s *Store) promoteFromArchive(key string, v Value, gen uint64) {
	mu := s.stripe(key)
	if !mu.TryLock() {
		return
	}
	defer mu.Unlock()
	if s.archive.genOf(key) != gen || s.working.contains(key) || (s.focus != nil && s.focus.contains(key)) {
		return
	}
	var hot hotScore
	hot.bump(s.opts.Clock.Now(), s.opts.HotHalfLife)
	if in, _ := s.working.insert(key, v, Hint{}, false, hot, true); !in {
		return
	}
	s.working.promotions.Add(1)
	s.moves.Add(1)
	s.kickIfNeeded()
}

package memory

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// Category is the decay class of a memory unit (package
// memory/internal/knowledge owns it).
type Category = knowledge.Category

// The categories (see knowledge.Category).
const (
	CategorySystem  = knowledge.CategorySystem
	CategoryCore    = knowledge.CategoryCore
	CategoryFact    = knowledge.CategoryFact
	CategoryEpisode = knowledge.CategoryEpisode
)

// ParseCategory parses "system", "core", "fact" or "episode".
func ParseCategory(s string) (Category, error) { return knowledge.ParseCategory(s) }

// Decay and boost policy (see package memory/internal/knowledge).
const (
	FactDecay          = knowledge.FactDecay
	FactDecayPeriod    = knowledge.FactDecayPeriod
	FactReviewBelow    = knowledge.FactReviewBelow
	EpisodeDecay       = knowledge.EpisodeDecay
	EpisodeDecayPeriod = knowledge.EpisodeDecayPeriod
	EpisodeTTL         = knowledge.EpisodeTTL
	BoostCooldown      = knowledge.BoostCooldown
	MaxBoostPerDay     = knowledge.MaxBoostPerDay
	PromoteReviewAt    = knowledge.PromoteReviewAt
	DecayReviewAt      = knowledge.DecayReviewAt
)

// ErrBoostLimited: the memory was boosted less than BoostCooldown ago, or
// its boosts reached MaxBoostPerDay in the current 24 h window.
var ErrBoostLimited = errors.New("memory: boost limited")

// ErrMemoryNotFound: no memory unit with that id in the session. It also
// matches ErrNotFound.
var ErrMemoryNotFound = memerr.NotFound("memory: memory unit not found")

// touch records a use of u at now: decay restarts from now.
func touch(u *Unit, now time.Time) {
	if now.After(u.TouchedAt) {
		u.TouchedAt = now
	}
	if now.After(u.DecayedAt) {
		u.DecayedAt = now
	}
}

// setReview updates u.Review from its importance.
func setReview(u *Unit) {
	r := ""
	switch {
	case u.Category == CategorySystem || u.Category == "":
	case u.Importance >= PromoteReviewAt && u.Category != CategoryCore:
		r = "promote"
	case u.Category == CategoryFact && u.Importance < FactReviewBelow:
		r = "expire"
	case u.Category.Decays() && u.Importance <= DecayReviewAt:
		r = "decay"
	}
	u.Review = r
}

// normalizeUnit fills what units written by older versions lack.
func normalizeUnit(u *Unit) {
	if u.Category == "" {
		switch u.Type {
		case UnitFact:
			u.Category = CategoryFact
		case UnitEpisode:
			u.Category = CategoryEpisode
		}
	}
	if u.Category != "" {
		if u.TouchedAt.IsZero() {
			u.TouchedAt = u.CreatedAt
		}
		if u.DecayedAt.IsZero() {
			u.DecayedAt = u.TouchedAt
		}
	}
}

// maybeDecayLocked runs the decay pass when the last one (persisted in the
// log) is Options.DecayEvery old: on the request path and in the worker
// while the process runs, and when a session is loaded, which is how decay
// catches up after a restart. It changes memory only; the worker persists.
// Called with sess.mu held.
func (kn *learner) maybeDecayLocked(sess *session, now time.Time) {
	if !sess.lastDecay.IsZero() && now.Sub(sess.lastDecay) < kn.opts.Decay.Every {
		return
	}
	sess.lastDecay = now
	if kn.decayLocked(sess, now) {
		sess.decayDirty = true
	}
}

// decayLocked applies the decay of every categorized unit up to now and
// deletes expired episodes.
func (kn *learner) decayLocked(sess *session, now time.Time) (changed bool) {
	for _, u := range sess.sortedUnits() {
		var f float64
		var period time.Duration
		switch u.Category {
		case CategoryFact:
			f, period = FactDecay, FactDecayPeriod
		case CategoryEpisode:
			if now.Sub(u.TouchedAt) >= EpisodeTTL {
				sess.deleteUnit(u.ID)
				kn.stats.expired.Add(1)
				changed = true
				continue
			}
			f, period = EpisodeDecay, EpisodeDecayPeriod
		default:
			continue
		}
		n := int64(now.Sub(u.DecayedAt) / period)
		if n <= 0 {
			continue
		}
		u.Importance *= math.Pow(f, float64(n))
		u.DecayedAt = u.DecayedAt.Add(time.Duration(n) * period)
		u.UpdatedAt = now
		setReview(u)
		u.persisted, u.indexed = false, false
		kn.stats.decayed.Add(n)
		changed = true
	}
	return changed
}

// boostLocked raises u's importance by Options.BoostAmount within the
// limits: one boost per BoostCooldown, MaxBoostPerDay per 24 h window.
func (kn *learner) boostLocked(u *Unit, now time.Time) error {
	if !u.LastBoost.IsZero() && now.Sub(u.LastBoost) < BoostCooldown {
		kn.stats.boostsLimited.Add(1)
		return fmt.Errorf("%w: %s boosted %s ago (cooldown %s)", ErrBoostLimited, u.ID, now.Sub(u.LastBoost), BoostCooldown)
	}
	if u.BoostDay.IsZero() || now.Sub(u.BoostDay) >= 24*time.Hour {
		u.BoostDay, u.Boosted = now, 0
	}
	add := min(kn.opts.Decay.BoostAmount, MaxBoostPerDay-u.Boosted)
	if add <= 1e-9 {
		kn.stats.boostsLimited.Add(1)
		return fmt.Errorf("%w: %s gained %.2f today (max %.1f)", ErrBoostLimited, u.ID, u.Boosted, MaxBoostPerDay)
	}
	u.Boosted += add
	u.Importance += add
	u.LastBoost = now
	u.UpdatedAt = now
	touch(u, now)
	setReview(u)
	u.persisted, u.indexed = false, false
	kn.stats.boosts.Add(1)
	return nil
}

// deleteUnit removes a unit from the session, its index and its working
// memory; the worker writes the deletion. Called with sess.mu held.
func (sess *session) deleteUnit(id string) {
	u, ok := sess.units[id]
	if !ok {
		return
	}
	sess.userDel = append(sess.userDel, userDocID(sess, unitRole(u), id))
	delete(sess.units, id)
	delete(sess.accessDirty, id)
	if sess.deleted == nil {
		sess.deleted = map[string]bool{}
	}
	sess.deleted[id] = true
	sess.delDirty = append(sess.delDirty, id)
	if sess.ix != nil && sess.ix.Delete(id) {
		sess.ixVer++
	}
	sess.wm.forget(id)
	sess.kb.UnitDeleted(id)
	sess.unitsChanged()
}

// AddMemory adds a memory of category c to the session (which must exist)
// and returns it. System and core memories are injected on every turn;
// facts and episodes are recalled when relevant. importance ≤ 0 selects 1.
// The memory is written by the background worker, like every unit.
func (s *Store) AddMemory(tenant, sessionID string, c Category, text string, importance float64) (Unit, error) {
	if _, err := ParseCategory(string(c)); err != nil {
		return Unit{}, err
	}
	text = sanitize.Text(text, maxMemoryBytes)
	if text == "" {
		return Unit{}, fmt.Errorf("%w: empty memory text", ErrInvalid)
	}
	if math.IsNaN(importance) || math.IsInf(importance, 0) {
		return Unit{}, fmt.Errorf("%w: importance %v", ErrInvalid, importance)
	}
	if importance <= 0 {
		importance = 1
	}
	sess, err := s.reg.session(tenant, sessionID, false)
	if err != nil {
		return Unit{}, err
	}
	defer s.reg.unpin(sess)
	sess.mu.Lock()
	if !sess.exists || sess.gone.Load() {
		sess.mu.Unlock()
		return Unit{}, fmt.Errorf("%w: %q", ErrNotFound, sessionID)
	}
	now := s.opts.Clock.Now()
	typ := UnitFact
	if c == CategoryEpisode {
		typ = UnitEpisode
	}
	u := &Unit{ID: memUnitID(sess.nextSeq), Type: typ, Tier: PlaceWorking, Role: string(c), Content: text,
		Importance: importance, Tokens: s.tok.Count(sess.lastEnc, text), CreatedAt: now, UpdatedAt: now,
		LastAccess: now, Category: c}
	sess.nextSeq++
	touch(u, now)
	setReview(u)
	sess.units[u.ID] = u
	sess.unitsChanged()
	out := u.clone()
	sess.mu.Unlock()
	s.wk.enqueue(sess)
	return out, nil
}

// DeleteMemory deletes one memory unit of the session: from its units, its
// index and its working memory at once, from its log by the worker.
// Unknown ids are ErrMemoryNotFound (which matches ErrNotFound).
func (s *Store) DeleteMemory(tenant, sessionID, unitID string) error {
	sess, err := s.reg.session(tenant, sessionID, false)
	if err != nil {
		return err
	}
	defer s.reg.unpin(sess)
	sess.mu.Lock()
	if _, ok := sess.units[unitID]; !ok || !sess.exists {
		sess.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrMemoryNotFound, unitID)
	}
	sess.deleteUnit(unitID)
	sess.mu.Unlock()
	s.wk.enqueue(sess)
	return nil
}

// Boost raises a categorized memory's importance by Options.BoostAmount,
// within the limits (ErrBoostLimited). It returns the new importance.
func (s *Store) Boost(tenant, sessionID, unitID string) (float64, error) {
	sess, err := s.reg.session(tenant, sessionID, false)
	if err != nil {
		return 0, err
	}
	defer s.reg.unpin(sess)
	sess.mu.Lock()
	u := sess.units[unitID]
	if u == nil || !sess.exists {
		sess.mu.Unlock()
		return 0, fmt.Errorf("%w: %q", ErrMemoryNotFound, unitID)
	}
	if u.Category == "" {
		sess.mu.Unlock()
		return 0, fmt.Errorf("%w: %q is not a categorized memory", ErrInvalid, unitID)
	}
	err = s.know.boostLocked(u, s.opts.Clock.Now())
	imp := u.Importance
	sess.mu.Unlock()
	if err == nil {
		s.wk.enqueue(sess)
	}
	return imp, err
}

package knowledge

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
)

// Category is the decay class of a memory unit.
type Category string

const (
	// CategorySystem memories are set by the operator (AddMemory); they
	// never decay, are always injected and the Extractor cannot change them.
	CategorySystem Category = "system"
	// CategoryCore memories never decay and are always injected; the
	// Extractor may update and boost them but not delete them.
	CategoryCore Category = "core"
	// CategoryFact memories lose FactDecay of their importance every
	// FactDecayPeriod untouched, and are flagged "expire" below
	// FactReviewBelow.
	CategoryFact Category = "fact"
	// CategoryEpisode memories (episodic summaries) lose EpisodeDecay every
	// EpisodeDecayPeriod untouched and are deleted after EpisodeTTL
	// untouched.
	CategoryEpisode Category = "episode"
)

// ParseCategory parses "system", "core", "fact" or "episode".
func ParseCategory(s string) (Category, error) {
	switch c := Category(strings.ToLower(strings.TrimSpace(s))); c {
	case CategorySystem, CategoryCore, CategoryFact, CategoryEpisode:
		return c, nil
	}
	return "", fmt.Errorf("%w: unknown memory category %q (want system|core|fact|episode)", memerr.ErrInvalid, s)
}

// Decay and boost policy. A memory is "touched" when it is created,
// updated, boosted or recalled; decay counts whole periods since the last
// touch (or the last applied period), so applying it late (after a
// restart) gives the same result as applying it on time.
const (
	FactDecay          = 0.85
	FactDecayPeriod    = 5 * 24 * time.Hour
	FactReviewBelow    = 0.2
	EpisodeDecay       = 0.6
	EpisodeDecayPeriod = 3 * 24 * time.Hour
	EpisodeTTL         = 7 * 24 * time.Hour
	// BoostCooldown is the least time between two boosts of one memory.
	BoostCooldown = 2 * time.Hour
	// MaxBoostPerDay bounds what boosts add to one memory per 24 h.
	MaxBoostPerDay = 1.0
	// PromoteReviewAt flags a memory "promote" (a candidate for core).
	PromoteReviewAt = 2.5
	// DecayReviewAt flags a decaying memory "decay".
	DecayReviewAt = 0.5
)

// Decays reports whether the category decays.
func (c Category) Decays() bool { return c == CategoryFact || c == CategoryEpisode }

// Pinned reports whether the category is always injected.
func (c Category) Pinned() bool { return c == CategorySystem || c == CategoryCore }

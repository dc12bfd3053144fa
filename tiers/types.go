package tiers

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// errCorrupt marks an archive file that failed its checks; callers match
// durable.ErrCorrupt. The file was moved to quarantine and is never served;
// errors carrying this mark also carry ErrNotFound.
var errCorrupt = durable.NewCorrupt("tiers: corrupt block")

// Errors returned by the tiers. Classify them with errors.Is.
var (
	// ErrNotFound means no tier holds the key.
	ErrNotFound = errors.New("tiers: not found")
	// ErrTooLarge means a value does not fit a tier's hard budget even when
	// the tier is empty, or exceeds the archive's block limit.
	ErrTooLarge = errors.New("tiers: value too large")
	// ErrNoArchive means a durable write was asked of a store opened
	// without a directory.
	ErrNoArchive = errors.New("tiers: no archive configured")
	// ErrClosed means the store or tier was closed.
	ErrClosed = errors.New("tiers: closed")
)

// Tier names a level of the store, fastest first.
type Tier uint8

const (
	// TierNone is the zero Tier: nothing served the value.
	TierNone Tier = iota
	// TierFocus is device memory reached through a gpu.Device.
	TierFocus
	// TierWorking is host RAM.
	TierWorking
	// TierArchive is files under the data directory.
	TierArchive
)

// String returns "focus", "working", "archive" or "none".
func (t Tier) String() string {
	switch t {
	case TierFocus:
		return "focus"
	case TierWorking:
		return "working"
	case TierArchive:
		return "archive"
	default:
		return "none"
	}
}

// DType is the element type of a value's bytes. It decides how the archive
// compresses them: 16-bit types are split into byte planes before zstd.
type DType uint8

const (
	// DTypeNone means untyped bytes.
	DTypeNone DType = iota
	// DTypeF16 is IEEE 754 half precision, little endian.
	DTypeF16
	// DTypeBF16 is bfloat16, little endian.
	DTypeBF16
	// DTypeF32 is IEEE 754 single precision, little endian.
	DTypeF32
	// DTypeQ8 is signed 8-bit quantised values.
	DTypeQ8
	numDTypes
)

// String returns "f16", "bf16", "f32", "q8" or "" for DTypeNone.
func (d DType) String() string {
	switch d {
	case DTypeNone:
		return ""
	case DTypeF16:
		return "f16"
	case DTypeBF16:
		return "bf16"
	case DTypeF32:
		return "f32"
	case DTypeQ8:
		return "q8"
	default:
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
}

// ElemSize is the size of one element in bytes; 1 for DTypeNone.
func (d DType) ElemSize() int {
	switch d {
	case DTypeF16, DTypeBF16:
		return 2
	case DTypeF32:
		return 4
	default:
		return 1
	}
}

// Valid reports whether d is one of the defined types.
func (d DType) Valid() bool { return d < numDTypes }

// ParseDType parses "f16", "bf16", "f32", "q8" or "" (DTypeNone).
func ParseDType(s string) (DType, error) {
	switch s {
	case "":
		return DTypeNone, nil
	case "f16":
		return DTypeF16, nil
	case "bf16":
		return DTypeBF16, nil
	case "f32":
		return DTypeF32, nil
	case "q8":
		return DTypeQ8, nil
	}
	return DTypeNone, fmt.Errorf("tiers: unknown dtype %q (want f16, bf16, f32 or q8)", s)
}

// Limits on metadata, enforced by every tier so that any value one tier
// accepts the archive can store.
const (
	MaxKeyLen  = 4096
	MaxAuxLen  = 64 << 10
	MaxShapeNd = 8
)

// Meta describes a value. The store keeps it beside the bytes in every tier
// and in the archive file header.
type Meta struct {
	DType DType
	// Shape is free-form dimensions; nil when unknown. Each is >= 0.
	Shape []int64
	// Tokens counts the tokens the value covers, for token budgets.
	Tokens int64
	// Aux is small opaque metadata of the caller (at most MaxAuxLen bytes).
	Aux []byte
}

func (m *Meta) validate() error {
	if !m.DType.Valid() {
		return fmt.Errorf("tiers: invalid dtype %d", m.DType)
	}
	if len(m.Shape) > MaxShapeNd {
		return fmt.Errorf("tiers: shape has %d dimensions, at most %d", len(m.Shape), MaxShapeNd)
	}
	for _, d := range m.Shape {
		if d < 0 {
			return fmt.Errorf("tiers: negative dimension %d", d)
		}
	}
	if m.Tokens < 0 {
		return fmt.Errorf("tiers: negative token count %d", m.Tokens)
	}
	if len(m.Aux) > MaxAuxLen {
		return fmt.Errorf("tiers: aux of %d bytes, at most %d", len(m.Aux), MaxAuxLen)
	}
	return nil
}

// Value is what tiers hold: bytes and their description. A Value handed to
// a Put belongs to the store from then on, and a Value returned by a Get is
// shared with the store: neither side modifies Data or Meta afterwards.
type Value struct {
	Meta
	Data []byte
}

// Hint carries a value's scores for the eviction policies that use them.
// Both are clamped to [0,1].
type Hint struct {
	// Importance is the α of the weighted strategy.
	Importance float64
	// Semantic is the relevance of the value to current work, used by the
	// hybrid strategy's γ term.
	Semantic float64
}

func clamp01(x float64) float64 {
	if math.IsNaN(x) || x < 0 {
		return 0
	}
	if x > 1 {
		return 1
	}
	return x
}

// Budget bounds a tier. A tier above Soft of a limit is trimmed in the
// background; a Put that would take it above Hard makes room inline first.
type Budget struct {
	// MaxBytes caps the bytes held. Zero means the tier's default.
	MaxBytes int64
	// MaxTokens caps the tokens held. Zero means no token limit.
	MaxTokens int64
	// Soft is the fraction of a limit above which background demotion
	// starts and down to which it trims. Zero means 0.9.
	Soft float64
	// Hard is the fraction of a limit a Put never crosses while it can make
	// room. Zero means 1.0.
	Hard float64
}

// ensureDefaults fills the zero fields: MaxBytes with the tier's default
// defBytes.
func (b *Budget) ensureDefaults(defBytes int64) {
	if b.MaxBytes == 0 {
		b.MaxBytes = defBytes
	}
	if b.Soft == 0 {
		b.Soft = 0.9
	}
	if b.Hard == 0 {
		b.Hard = 1.0
	}
}

func (b *Budget) validate(name string) error {
	if b.MaxBytes < 0 || b.MaxTokens < 0 {
		return fmt.Errorf("tiers: %s budget: negative limit", name)
	}
	if !(b.Soft > 0 && b.Soft <= b.Hard && b.Hard <= 1) {
		return fmt.Errorf("tiers: %s budget: want 0 < soft (%g) <= hard (%g) <= 1", name, b.Soft, b.Hard)
	}
	return nil
}

// overSoft reports whether usage is above the soft watermark.
func (b *Budget) overSoft(bytes, tokens int64) bool {
	if float64(bytes) > b.Soft*float64(b.MaxBytes) {
		return true
	}
	return b.MaxTokens > 0 && float64(tokens) > b.Soft*float64(b.MaxTokens)
}

// fitsHard reports whether usage stays within the hard watermark.
func (b *Budget) fitsHard(bytes, tokens int64) bool {
	if float64(bytes) > b.Hard*float64(b.MaxBytes) {
		return false
	}
	return b.MaxTokens == 0 || float64(tokens) <= b.Hard*float64(b.MaxTokens)
}

// hotScore is an exponentially decayed access count: each access adds one,
// and the sum halves every half-life. It decides promotion.
type hotScore struct {
	score float64
	last  time.Time
}

func (h *hotScore) bump(now time.Time, halfLife time.Duration) float64 {
	if !h.last.IsZero() && halfLife > 0 {
		if dt := now.Sub(h.last); dt > 0 {
			h.score *= math.Exp2(-float64(dt) / float64(halfLife))
		}
	}
	h.score++
	h.last = now
	return h.score
}

package workload

import (
	"fmt"
	"math"
	"os"

	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// benchTiers are the tiers the KV benchmarks measure, fastest first.
var benchTiers = []string{"focus", "working", "archive"}

// scratchDir returns dir, or when it is empty a new temporary folder named
// after pattern (as os.MkdirTemp) and a function that removes it.
func scratchDir(dir, pattern string) (string, func(), error) {
	if dir != "" {
		return dir, func() {}, nil
	}
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	return d, func() { os.RemoveAll(d) }, nil
}

// tierOptions configure a store in which a put block of at most blockBytes
// lands in tier and stays there: that tier has room bytes, Working is too
// small for the block when the tier is the Archive (under dir), promotion
// is off and Close drops what memory holds. dev backs Focus; nil means a
// CPU device the store owns.
func tierOptions(tier, dir string, blockBytes, room int64, dev gpu.Device) (tiers.Options, error) {
	budget := tiers.Budget{MaxBytes: room}
	o := tiers.Options{Dir: dir, Device: dev, Focus: budget, Working: budget,
		PromoteThreshold: math.MaxFloat64, NoFlushOnClose: true}
	switch tier {
	case "focus":
	case "working":
		o.DisableFocus = true
	case "archive":
		o.DisableFocus = true
		o.Working = tiers.Budget{MaxBytes: blockBytes / 2}
	default:
		return o, fmt.Errorf("unknown tier %q", tier)
	}
	return o, nil
}

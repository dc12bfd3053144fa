package workload

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/kvsidecar/kvsidecar/gpu"
	"github.com/kvsidecar/kvsidecar/gpu/probe"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// FocusLatency puts and gets blocks through a Focus tier on dev, two keys
// in turn (a put replaces the older one), and checks that the Focus tier
// served every get. It is the probe.Options.Latency of `sidecar bench gpu`.
func FocusLatency(dev gpu.Device, data []byte, ops int) (probe.Latency, error) {
	size := len(data)
	st, err := tiers.Open(tiers.Options{
		Device:         dev,
		Focus:          tiers.Budget{MaxBytes: int64(3*size) + 1<<20},
		Working:        tiers.Budget{MaxBytes: int64(3*size) + 1<<20},
		NoFlushOnClose: true,
	})
	if err != nil {
		return probe.Latency{}, fmt.Errorf("probe: %w", err)
	}
	defer st.Close()
	row := probe.Latency{BlockSize: size, Ops: ops}
	meta := tiers.Meta{DType: tiers.DTypeF16, Tokens: int64(size / (128 << 10))}
	var puts, gets []time.Duration
	for i := -1; i < ops; i++ {
		key := "gpu-bench-" + strconv.Itoa(i&1)
		t0 := time.Now()
		if err := st.Put(key, tiers.Value{Meta: meta, Data: data}, tiers.PutOptions{}); err != nil {
			return row, fmt.Errorf("probe: focus put %s: %w", probe.SizeName(size), err)
		}
		p := time.Since(t0)
		t0 = time.Now()
		v, tier, err := st.Get(key)
		g := time.Since(t0)
		if err != nil {
			return row, fmt.Errorf("probe: focus get %s: %w", probe.SizeName(size), err)
		}
		if tier != tiers.TierFocus {
			return row, fmt.Errorf("probe: focus get %s served by %s (device full?)", probe.SizeName(size), tier)
		}
		if i == -1 && !slices.Equal(v.Data, data) {
			return row, errors.New("probe: focus get returned other bytes")
		}
		if i >= 0 {
			puts, gets = append(puts, p), append(gets, g)
		}
	}
	row.PutP50Ms, row.PutP99Ms = percentileMs(puts, 0.5), percentileMs(puts, 0.99)
	row.GetP50Ms, row.GetP99Ms = percentileMs(gets, 0.5), percentileMs(gets, 0.99)
	return row, nil
}

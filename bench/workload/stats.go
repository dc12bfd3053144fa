package workload

import (
	"math"
	"slices"
	"time"
)

// percentileMs returns the q-quantile of d (nearest rank) in milliseconds,
// 0 for no samples.
func percentileMs(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return float64(s[max(0, min(i, len(s)-1))]) / 1e6
}

// meanMs is the mean of d in milliseconds, 0 for no samples.
func meanMs(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	var s time.Duration
	for _, x := range d {
		s += x
	}
	return float64(s) / float64(len(d)) / 1e6
}

// ratio is a/b, 0 when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

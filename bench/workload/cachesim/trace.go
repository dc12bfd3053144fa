package cachesim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kvsidecar/kvsidecar/tiers"
	"github.com/kvsidecar/kvsidecar/tiers/tracefile"
)

// Trace is a sequence of accesses to keys, and of deletions in recorded
// traces.
type Trace struct {
	Name string
	// Items is the number of keys the trace draws from (for a recorded
	// trace, the most alive at once); cache sizes are percentages of it.
	Items int
	Keys  []uint64
	// Deleted marks the positions of Keys that delete the key rather than
	// access it; nil when none do.
	Deleted []bool
}

func (t *Trace) deleted(i int) bool { return t.Deleted != nil && t.Deleted[i] }

// Accesses counts the accesses of t, deletions aside.
func (t *Trace) Accesses() int {
	n := len(t.Keys)
	for _, d := range t.Deleted {
		if d {
			n--
		}
	}
	return n
}

// Uniform8020 draws accesses from n items: 80% go to a hot fifth of them,
// 20% to the rest, uniformly within each part. The hot items are scattered
// over the key space.
func Uniform8020(n, accesses int, rng *rand.Rand) Trace {
	hot := n / 5
	perm := rng.Perm(n)
	t := Trace{Name: "80-20", Items: n, Keys: make([]uint64, accesses)}
	for i := range t.Keys {
		if rng.Float64() < 0.8 {
			t.Keys[i] = uint64(perm[rng.IntN(hot)])
		} else {
			t.Keys[i] = uint64(perm[hot+rng.IntN(n-hot)])
		}
	}
	return t
}

// Zipf draws accesses from n items with P(rank k) ∝ 1/k^s, by inverting the
// CDF (math/rand's Zipf needs s > 1).
func Zipf(n, accesses int, s float64, rng *rand.Rand) Trace {
	cdf := make([]float64, n)
	sum := 0.0
	for k := range n {
		sum += 1 / math.Pow(float64(k+1), s)
		cdf[k] = sum
	}
	perm := rng.Perm(n)
	t := Trace{Name: "zipf-" + strconv.FormatFloat(s, 'f', -1, 64), Items: n, Keys: make([]uint64, accesses)}
	for i := range t.Keys {
		k, _ := slices.BinarySearch(cdf, rng.Float64()*sum)
		t.Keys[i] = uint64(perm[min(k, n-1)])
	}
	return t
}

// TraceStats describes a recorded trace as the store served it.
type TraceStats struct {
	Gets, Puts, Deletes int
	// Hits counts the gets a tier served.
	Hits int
}

// ReadTrace reads a recorded trace (the text tiers/tracefile writes for
// `sidecar serve --kv-trace FILE`) and turns it into accesses and
// deletions: every get is an access, and so is every put except the one
// that fills a key right after a get of it missed.
func ReadTrace(name string, r io.Reader) (Trace, TraceStats, error) {
	t := Trace{Name: name}
	var st TraceStats
	var lastMiss uint64
	missed := false
	var del []bool
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if tracefile.Skip(line) {
			continue
		}
		a, err := tracefile.Parse(line)
		if err != nil {
			return t, st, fmt.Errorf("cachesim: %s:%d: %w", name, n, err)
		}
		k := a.Key
		fill := missed && lastMiss == k
		missed = false
		switch a.Op {
		case tiers.TraceGet:
			st.Gets++
			t.Keys = append(t.Keys, k)
			del = append(del, false)
			if !a.Hit() {
				missed, lastMiss = true, k
			} else {
				st.Hits++
			}
		case tiers.TracePut:
			st.Puts++
			if !fill {
				t.Keys = append(t.Keys, k)
				del = append(del, false)
			}
		case tiers.TraceDelete:
			st.Deletes++
			t.Keys = append(t.Keys, k)
			del = append(del, true)
		}
	}
	if err := sc.Err(); err != nil {
		return t, st, fmt.Errorf("cachesim: %s: %w", name, err)
	}
	if st.Deletes > 0 {
		t.Deleted = del
	}
	// Sizes are shares of the most keys alive at once (accessed and not
	// yet deleted): a trace that deletes what it is done with, as engine
	// states are, needs no room for the dead.
	live := map[uint64]bool{}
	for i, k := range t.Keys {
		if t.deleted(i) {
			delete(live, k)
		} else {
			live[k] = true
		}
		t.Items = max(t.Items, len(live))
	}
	return t, st, nil
}

// ReadTraceFile reads a recorded trace from a file named after it.
func ReadTraceFile(path string) (Trace, TraceStats, error) {
	f, err := os.Open(path)
	if err != nil {
		return Trace{}, TraceStats{}, fmt.Errorf("cachesim: %w", err)
	}
	defer f.Close()
	return ReadTrace(strings.TrimSuffix(filepath.Base(path), ".trace"), f)
}

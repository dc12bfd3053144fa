package cachesim

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/kvsidecar/kvsidecar/tiers"
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

// Recorded traces are text, one access a line, as a tiers.Store saw it:
//
//	g 9f3c0a1b2c3d4e5f 14680064 working
//	p 0a1b2c3d4e5f6071 2097152 none
//	d 0a1b2c3d4e5f6071 0 none
//
// operation (g get, p put, d delete), the FNV-1a 64 hash of the store key
// in hex (keys hold session ids, so the file never does), the value's size
// in bytes, and the tier that served a get (none: a miss). Lines starting
// with # are comments.

// TraceWriter appends a store's accesses to a file in the recorded form.
// It writes each line with one write(2) on a file opened for appending, so
// a trace survives kill -9 of the process and restarts append to it.
type TraceWriter struct {
	mu  sync.Mutex
	f   *os.File
	buf []byte
	err error
}

// CreateTraceWriter opens path for appending, creating it if needed.
func CreateTraceWriter(path string) (*TraceWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cachesim: trace: %w", err)
	}
	return &TraceWriter{f: f}, nil
}

// Record writes one access; it is a tiers.Options.Trace. The first write
// error stops recording and is returned by Close.
func (w *TraceWriter) Record(ev tiers.TraceEvent) {
	h := fnv.New64a()
	h.Write([]byte(ev.Key))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return
	}
	b := append(w.buf[:0], byte(ev.Op), ' ')
	b = fmt.Appendf(b, "%016x ", h.Sum64())
	b = strconv.AppendInt(b, ev.Size, 10)
	b = append(b, ' ')
	b = append(b, ev.Tier.String()...)
	b = append(b, '\n')
	w.buf = b
	_, w.err = w.f.Write(b)
}

// Close closes the file.
func (w *TraceWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := errors.Join(w.err, w.f.Close()); err != nil {
		return fmt.Errorf("cachesim: trace: %w", err)
	}
	return nil
}

// TraceStats describes a recorded trace as the store served it.
type TraceStats struct {
	Gets, Puts, Deletes int
	// Hits counts the gets a tier served.
	Hits int
}

// ReadTrace reads a recorded trace and turns it into accesses and
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
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 4 || len(f[0]) != 1 {
			return t, st, fmt.Errorf("cachesim: %s:%d: want 'op key size tier'", name, n)
		}
		k, err := strconv.ParseUint(f[1], 16, 64)
		if err != nil {
			return t, st, fmt.Errorf("cachesim: %s:%d: key: %w", name, n, err)
		}
		fill := missed && lastMiss == k
		missed = false
		switch tiers.TraceOp(f[0][0]) {
		case tiers.TraceGet:
			st.Gets++
			t.Keys = append(t.Keys, k)
			del = append(del, false)
			if f[3] == tiers.TierNone.String() {
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
		default:
			return t, st, fmt.Errorf("cachesim: %s:%d: unknown operation %q", name, n, f[0])
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

// Package tracefile records the accesses a tiers.Store serves
// (tiers.Options.Trace) in a text file, and parses that file's lines back.
// `sidecar serve --kv-trace FILE` records with a Writer; the hit-ratio
// simulator (bench/simulator, over internal cachesim) replays what it
// recorded. It lives beside tiers, not with the simulator, so the serving
// binary records traces without linking any benchmark code.
//
// A recorded trace is text, one access a line, as the store saw it:
//
//	g 9f3c0a1b2c3d4e5f 14680064 working
//	p 0a1b2c3d4e5f6071 2097152 none
//	d 0a1b2c3d4e5f6071 0 none
//
// operation (g get, p put, d delete), the FNV-1a 64 hash of the store key
// in hex (keys hold session ids, so the file never does), the value's size
// in bytes, and the tier that served a get (none: a miss). Lines starting
// with # are comments.
//
// Invariants: a Writer writes each line with one write(2) on a file opened
// for appending, so a trace survives kill -9 of the process and a restart
// appends to it; no key is ever written as it is.
package tracefile

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/kvsidecar/kvsidecar/tiers"
)

// Writer appends a store's accesses to a file in the recorded form. Its
// Record is a tiers.Options.Trace; it is safe for concurrent use.
type Writer struct {
	// mu protects the fields below.
	mu  sync.Mutex
	f   *os.File
	buf []byte
	err error
}

// Create opens path for appending, creating it if needed. The caller
// closes the Writer.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("tracefile: %w", err)
	}
	return &Writer{f: f}, nil
}

// Record writes one access. The first write error stops recording and is
// returned by Close.
func (w *Writer) Record(ev tiers.TraceEvent) {
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

// Close closes the file; what was recorded is already in it.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := errors.Join(w.err, w.f.Close()); err != nil {
		return fmt.Errorf("tracefile: %w", err)
	}
	return nil
}

// Access is one recorded line.
type Access struct {
	Op tiers.TraceOp
	// Key is the hash of the store key.
	Key uint64
	// Tier names the tier that served a get ("none": a miss), as
	// tiers.Tier.String spells it.
	Tier string
}

// Hit reports whether a get was served by a tier.
func (a Access) Hit() bool { return a.Tier != tiers.TierNone.String() }

// Parse parses one line that is neither empty nor a comment. The size field
// must be there but is not read: replays count entries, not bytes.
func Parse(line string) (Access, error) {
	f := strings.Fields(line)
	if len(f) != 4 || len(f[0]) != 1 {
		return Access{}, errors.New("want 'op key size tier'")
	}
	k, err := strconv.ParseUint(f[1], 16, 64)
	if err != nil {
		return Access{}, fmt.Errorf("key: %w", err)
	}
	a := Access{Op: tiers.TraceOp(f[0][0]), Key: k, Tier: f[3]}
	switch a.Op {
	case tiers.TraceGet, tiers.TracePut, tiers.TraceDelete:
	default:
		return Access{}, fmt.Errorf("unknown operation %q", f[0])
	}
	return a, nil
}

// Skip reports whether a line holds no access: empty, or a comment.
func Skip(line string) bool { return line == "" || line[0] == '#' }

package tiers

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Scripts in testdata/ drive policies and stores one command a line:
//
//	# comment
//	command arg key=value ...
//
// and fail the test at the first line whose expectation does not hold.

type scriptLine struct {
	pos  string // file:line
	cmd  string
	args []string
	kv   map[string]string
}

func readScript(t *testing.T, file string) []scriptLine {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []scriptLine
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		l := scriptLine{pos: fmt.Sprintf("%s:%d", filepath.Base(file), n), cmd: fields[0], kv: map[string]string{}}
		for _, f := range fields[1:] {
			if k, v, ok := strings.Cut(f, "="); ok {
				l.kv[k] = v
			} else {
				l.args = append(l.args, f)
			}
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (l scriptLine) float(t *testing.T, k string, def float64) float64 {
	t.Helper()
	s, ok := l.kv[k]
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("%s: %s=%q: %v", l.pos, k, s, err)
	}
	return f
}

func (l scriptLine) int(t *testing.T, k string, def int64) int64 {
	t.Helper()
	return int64(l.float(t, k, float64(def)))
}

// arrow splits "get a -> hit" arguments into ("a", "hit").
func (l scriptLine) arrow(t *testing.T) (string, string) {
	t.Helper()
	if len(l.args) == 3 && l.args[1] == "->" {
		return l.args[0], l.args[2]
	}
	if len(l.args) == 1 {
		return l.args[0], ""
	}
	t.Fatalf("%s: want %q KEY [-> RESULT]", l.pos, l.cmd)
	return "", ""
}

// policySim is a cache of cap entries over a Policy, as a tier uses it.
type policySim struct {
	pol     Policy
	cap     int
	present map[string]bool
	evicted []string
}

func (s *policySim) access(key string, h Hint) bool {
	if s.present[key] {
		s.pol.Access(key)
		return true
	}
	for s.pol.Len() >= s.cap {
		v, ok := s.pol.Victim()
		if !ok {
			break
		}
		s.pol.Remove(v)
		delete(s.present, v)
		s.evicted = append(s.evicted, v)
	}
	s.pol.Add(key, h)
	s.present[key] = true
	return false
}

func TestPolicyScripts(t *testing.T) {
	files, _ := filepath.Glob("testdata/policy/*.txt")
	if len(files) == 0 {
		t.Fatal("no scripts")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			var sim *policySim
			for _, l := range readScript(t, file) {
				if sim == nil && l.cmd != "new" {
					t.Fatalf("%s: script must start with new", l.pos)
				}
				switch l.cmd {
				case "new":
					pol, err := NewPolicy(l.kv["strategy"])
					if err != nil {
						t.Fatalf("%s: %v", l.pos, err)
					}
					sim = &policySim{pol: pol, cap: int(l.int(t, "cap", 0)), present: map[string]bool{}}
				case "put":
					sim.access(l.args[0], Hint{Importance: l.float(t, "imp", 0), Semantic: l.float(t, "sem", 0)})
				case "get":
					key, want := l.arrow(t)
					got := "miss"
					if sim.present[key] {
						sim.pol.Access(key)
						got = "hit"
					}
					if want != "" && got != want {
						t.Fatalf("%s: get %s = %s, want %s", l.pos, key, got, want)
					}
				case "remove":
					sim.pol.Remove(l.args[0])
					delete(sim.present, l.args[0])
				case "expect-evicted":
					if !slices.Equal(sim.evicted, l.args) && !(len(sim.evicted) == 0 && len(l.args) == 0) {
						t.Fatalf("%s: evicted %v, want %v", l.pos, sim.evicted, l.args)
					}
					sim.evicted = nil
				case "expect-victim":
					v, ok := sim.pol.Victim()
					if !ok || v != l.args[0] {
						t.Fatalf("%s: victim %q (%v), want %q", l.pos, v, ok, l.args[0])
					}
				case "expect-contents":
					var got []string
					for k := range sim.present {
						got = append(got, k)
					}
					slices.Sort(got)
					want := slices.Sorted(slices.Values(l.args))
					if !slices.Equal(got, want) || sim.pol.Len() != len(want) {
						t.Fatalf("%s: contents %v (policy len %d), want %v", l.pos, got, sim.pol.Len(), want)
					}
				default:
					t.Fatalf("%s: unknown command %q", l.pos, l.cmd)
				}
			}
		})
	}
}

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

// value makes deterministic bytes for key of size n.
func value(key string, n int) []byte {
	b := make([]byte, n)
	x := uint32(2166136261)
	for i := range len(key) {
		x = (x ^ uint32(key[i])) * 16777619
	}
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

func TestStoreScripts(t *testing.T) {
	files, _ := filepath.Glob("testdata/store/*.txt")
	if len(files) == 0 {
		t.Fatal("no scripts")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			dir := t.TempDir()
			clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
			var s *Store
			var opts Options
			want := map[string][]byte{}
			defer func() {
				if s != nil {
					s.Close()
				}
			}()
			for _, l := range readScript(t, file) {
				if s == nil && l.cmd != "open" {
					t.Fatalf("%s: script must start with open", l.pos)
				}
				switch l.cmd {
				case "open":
					if s != nil {
						s.Close()
						dir = t.TempDir()
						want = map[string][]byte{}
					}
					off := l.kv["focus"] == "off"
					if off {
						delete(l.kv, "focus")
					}
					soft := l.float(t, "soft", 0)
					opts = Options{
						Dir:              dir,
						Focus:            Budget{MaxBytes: l.int(t, "focus", 0), MaxTokens: l.int(t, "focus-tokens", 0), Soft: soft},
						Working:          Budget{MaxBytes: l.int(t, "working", 0), Soft: soft},
						Archive:          Budget{MaxBytes: l.int(t, "archive", 0), Soft: soft},
						DisableFocus:     off,
						Strategy:         l.kv["strategy"],
						PromoteThreshold: l.float(t, "promote", 0),
						HotHalfLife:      time.Duration(l.int(t, "halflife-s", 60)) * time.Second,
						Clock:            clock,
					}
					var err error
					if s, err = open(opts, false); err != nil {
						t.Fatalf("%s: %v", l.pos, err)
					}
				case "reopen", "crash":
					if l.cmd == "reopen" {
						if err := s.Close(); err != nil {
							t.Fatalf("%s: close: %v", l.pos, err)
						}
					} else {
						// What only memory held is gone; the archive is as it was.
						s.opts.NoFlushOnClose = true
						s.Close()
						for k := range want {
							if !s.archive.Contains(k) {
								delete(want, k)
							}
						}
					}
					var err error
					if s, err = open(opts, false); err != nil {
						t.Fatalf("%s: %v", l.pos, err)
					}
				case "put":
					n, _ := strconv.Atoi(l.args[1])
					v := value(l.args[0]+strconv.Itoa(len(want)), n)
					err := s.Put(l.args[0], Value{Meta: Meta{DType: DTypeF16, Tokens: l.int(t, "tokens", 0)}, Data: v},
						PutOptions{Durable: slices.Contains(l.args, "durable")})
					if err != nil {
						t.Fatalf("%s: put: %v", l.pos, err)
					}
					want[l.args[0]] = v
				case "get":
					key, tier := l.arrow(t)
					v, got, err := s.Get(key)
					if tier == "miss" {
						if !errors.Is(err, ErrNotFound) {
							t.Fatalf("%s: get %s: %v from %s, want miss", l.pos, key, err, got)
						}
						continue
					}
					if err != nil {
						t.Fatalf("%s: get %s: %v", l.pos, key, err)
					}
					if got.String() != tier && tier != "" {
						t.Fatalf("%s: get %s served by %s, want %s", l.pos, key, got, tier)
					}
					if !bytes.Equal(v.Data, want[key]) {
						t.Fatalf("%s: get %s: wrong bytes", l.pos, key)
					}
				case "delete":
					if err := s.Delete(l.args[0]); err != nil {
						t.Fatalf("%s: %v", l.pos, err)
					}
					delete(want, l.args[0])
				case "maintain":
					s.Maintain()
				case "tick":
					d, err := time.ParseDuration(l.args[0])
					if err != nil {
						t.Fatalf("%s: %v", l.pos, err)
					}
					clock.now = clock.now.Add(d)
				case "expect-tier":
					_, _, tier, _ := s.Stat(l.args[0])
					if tier.String() != l.args[1] {
						t.Fatalf("%s: %s is in %s, want %s", l.pos, l.args[0], tier, l.args[1])
					}
				case "expect-archived":
					if got := s.archive.Contains(l.args[0]); got != (l.args[1] == "yes") {
						t.Fatalf("%s: archive holds %s: %v, want %s", l.pos, l.args[0], got, l.args[1])
					}
				case "expect-usage":
					for _, ts := range s.Stats().Tiers {
						if w, ok := l.kv[ts.Tier]; ok && strconv.FormatInt(ts.Bytes, 10) != w && ts.Tier != "archive" {
							t.Fatalf("%s: %s holds %d bytes, want %s", l.pos, ts.Tier, ts.Bytes, w)
						}
						if w, ok := l.kv[ts.Tier+"-entries"]; ok && strconv.Itoa(ts.Entries) != w {
							t.Fatalf("%s: %s holds %d entries, want %s", l.pos, ts.Tier, ts.Entries, w)
						}
					}
				case "corrupt":
					_, name := s.archive.paths(l.args[0])
					b, err := os.ReadFile(name)
					if err != nil {
						t.Fatalf("%s: %v", l.pos, err)
					}
					b[len(b)-10] ^= 0xff
					if err := os.WriteFile(name, b, 0o600); err != nil {
						t.Fatal(err)
					}
				case "expect-quarantined":
					if got := len(s.Quarantined()); strconv.Itoa(got) != l.args[0] {
						t.Fatalf("%s: %d quarantined, want %s", l.pos, got, l.args[0])
					}
				default:
					t.Fatalf("%s: unknown command %q", l.pos, l.cmd)
				}
			}
		})
	}
}

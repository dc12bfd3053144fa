package tiers

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// The scripts under testdata/ are datadriven files: a command line, an
// optional input, "----" and the expected output. After a deliberate
// change of behaviour, regenerate them and read the diff:
//
//	go test ./tiers -run 'Scripts' -rewrite

// policySim is a cache of cap entries over a Policy, as a tier uses it.
type policySim struct {
	pol     Policy
	cap     int
	present map[string]bool
}

// access is a reference to key: a hit, or a miss that evicts until there
// is room and adds key. It returns the keys evicted.
func (s *policySim) access(key string, h Hint) (hit bool, evicted []string) {
	if s.present[key] {
		s.pol.Access(key)
		return true, nil
	}
	for s.pol.Len() >= s.cap {
		v, ok := s.pol.Victim()
		if !ok {
			break
		}
		s.pol.Remove(v)
		delete(s.present, v)
		evicted = append(evicted, v)
	}
	s.pol.Add(key, h)
	s.present[key] = true
	return false, evicted
}

// keyArgs returns the argument keys of d that have no value: the items a
// command applies to.
func keyArgs(d *datadriven.TestData) []string {
	var out []string
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 {
			out = append(out, a.Key)
		}
	}
	return out
}

func floatArg(t *testing.T, d *datadriven.TestData, key string, def float64) float64 {
	t.Helper()
	a, ok := d.Arg(key)
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(a.SingleVal(t), 64)
	if err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return f
}

func intArg(t *testing.T, d *datadriven.TestData, key string, def int64) int64 {
	t.Helper()
	return int64(floatArg(t, d, key, float64(def)))
}

// TestPolicyScripts drives one policy per script through a cache of a
// fixed number of entries:
//
//	new strategy=NAME cap=N   a fresh policy
//	put KEY... [imp=X sem=Y]  references: hit, or miss and add (evicting)
//	get KEY...                lookups that never add
//	remove KEY...             drops keys, as a tier's Delete does
//	victim                    the key the policy would evict next
//	contents                  the keys held, sorted
func TestPolicyScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/policy", func(t *testing.T, path string) {
		var sim *policySim
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if sim == nil && d.Cmd != "new" {
				d.Fatalf(t, "a script starts with new")
			}
			var out strings.Builder
			switch d.Cmd {
			case "new":
				var name string
				d.ScanArgs(t, "strategy", &name)
				pol, err := NewPolicy(name)
				if err != nil {
					return err.Error()
				}
				sim = &policySim{pol: pol, cap: int(intArg(t, d, "cap", 0)), present: map[string]bool{}}
				return pol.Name()
			case "put":
				h := Hint{Importance: floatArg(t, d, "imp", 0), Semantic: floatArg(t, d, "sem", 0)}
				for _, k := range keyArgs(d) {
					hit, evicted := sim.access(k, h)
					switch {
					case hit:
						fmt.Fprintf(&out, "%s: hit\n", k)
					case len(evicted) > 0:
						fmt.Fprintf(&out, "%s: added, evicted %s\n", k, strings.Join(evicted, " "))
					default:
						fmt.Fprintf(&out, "%s: added\n", k)
					}
				}
			case "get":
				for _, k := range keyArgs(d) {
					if sim.present[k] {
						sim.pol.Access(k)
						fmt.Fprintf(&out, "%s: hit\n", k)
					} else {
						fmt.Fprintf(&out, "%s: miss\n", k)
					}
				}
			case "remove":
				for _, k := range keyArgs(d) {
					sim.pol.Remove(k)
					delete(sim.present, k)
				}
				return "ok"
			case "victim":
				if v, ok := sim.pol.Victim(); ok {
					return v
				}
				return "none"
			case "contents":
				keys := slices.Sorted(func(yield func(string) bool) {
					for k := range sim.present {
						if !yield(k) {
							return
						}
					}
				})
				if sim.pol.Len() != len(keys) {
					d.Fatalf(t, "policy tracks %d keys, the cache holds %d", sim.pol.Len(), len(keys))
				}
				return strings.Join(keys, " ")
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			return out.String()
		})
	})
}

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

// After never fires: the tiers start no timers.
func (c *fakeClock) After(time.Duration) <-chan time.Time { return nil }

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

// storeState lists where every key lives, fastest tier first:
//
//	focus: b c (200 bytes)
//	working: a (100 bytes)
//	archive: a b
func storeState(s *Store) string {
	var out strings.Builder
	for _, t := range []*memTier{s.focus, s.working} {
		if t == nil {
			continue
		}
		keys := t.keys()
		slices.Sort(keys)
		_, b, tok := t.usage()
		fmt.Fprintf(&out, "%s: %s (%d bytes", t.tier, orDash(keys), b)
		if tok > 0 {
			fmt.Fprintf(&out, ", %d tokens", tok)
		}
		out.WriteString(")\n")
	}
	if s.archive != nil {
		var keys []string
		s.archive.Keys(func(k string, _ Meta) bool {
			keys = append(keys, k)
			return true
		})
		slices.Sort(keys)
		fmt.Fprintf(&out, "archive: %s\n", orDash(keys))
	}
	return out.String()
}

// orDash joins keys with spaces; "-" when there are none.
func orDash(keys []string) string {
	if len(keys) == 0 {
		return "-"
	}
	return strings.Join(keys, " ")
}

// TestStoreScripts drives a Store on a fake clock, with maintenance only
// where a script asks for it:
//
//	open focus=B|off working=B archive=B [focus-tokens=N soft=F strategy=S promote=F halflife-s=N]
//	put KEY BYTES [durable] [tokens=N]
//	get KEY...          the tier that served each key, or miss
//	delete KEY
//	maintain            one maintenance pass, then state
//	state               where every key lives
//	tick DURATION       advances the clock
//	reopen | crash      closes (flushing, or dropping what only memory held) and opens again
//	corrupt KEY         flips a byte of KEY's archive file
//	quarantined         how many archive files were quarantined
//	trace               the accesses Options.Trace saw since the last trace
func TestStoreScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/store", func(t *testing.T, path string) {
		var (
			s     *Store
			opts  Options
			clock = &fakeClock{now: time.Unix(1_700_000_000, 0)}
			want  = map[string][]byte{}
			trace strings.Builder
		)
		defer func() {
			if s != nil {
				s.Close()
			}
		}()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if s == nil && d.Cmd != "open" {
				d.Fatalf(t, "a script starts with open")
			}
			switch d.Cmd {
			case "open":
				if s != nil {
					s.Close()
					want = map[string][]byte{}
				}
				off := false
				if a, ok := d.Arg("focus"); ok && a.SingleVal(t) == "off" {
					off = true
				}
				var strategy string
				d.MaybeScanArgs(t, "strategy", &strategy)
				soft := floatArg(t, d, "soft", 0)
				opts = Options{
					Dir:              t.TempDir(),
					Working:          Budget{MaxBytes: intArg(t, d, "working", 0), Soft: soft},
					Archive:          Budget{MaxBytes: intArg(t, d, "archive", 0), Soft: soft},
					DisableFocus:     off,
					Strategy:         strategy,
					PromoteThreshold: floatArg(t, d, "promote", 0),
					HotHalfLife:      time.Duration(intArg(t, d, "halflife-s", 60)) * time.Second,
					Clock:            clock,
					Trace: func(ev TraceEvent) {
						fmt.Fprintf(&trace, "%c %s %d %s\n", ev.Op, ev.Key, ev.Size, ev.Tier)
					},
				}
				if !off {
					opts.Focus = Budget{MaxBytes: intArg(t, d, "focus", 0), MaxTokens: intArg(t, d, "focus-tokens", 0), Soft: soft}
				}
				var err error
				if s, err = open(opts, false); err != nil {
					return err.Error()
				}
				return "ok"
			case "reopen", "crash":
				if d.Cmd == "reopen" {
					if err := s.Close(); err != nil {
						d.Fatalf(t, "close: %v", err)
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
					d.Fatalf(t, "%v", err)
				}
				return storeState(s)
			case "put":
				args := keyArgs(d)
				if len(args) < 2 {
					d.Fatalf(t, "want put KEY BYTES")
				}
				n, err := strconv.Atoi(args[1])
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				v := value(args[0]+strconv.Itoa(len(want)), n)
				err = s.Put(args[0], Value{Meta: Meta{DType: DTypeF16, Tokens: intArg(t, d, "tokens", 0)}, Data: v},
					PutOptions{Durable: d.HasArg("durable")})
				if err != nil {
					return err.Error()
				}
				want[args[0]] = v
				return "ok"
			case "get":
				var out strings.Builder
				for _, k := range keyArgs(d) {
					v, got, err := s.Get(k)
					switch {
					case errors.Is(err, ErrNotFound):
						fmt.Fprintf(&out, "%s: miss\n", k)
					case err != nil:
						fmt.Fprintf(&out, "%s: %v\n", k, err)
					case !bytes.Equal(v.Data, want[k]):
						d.Fatalf(t, "get %s from %s: wrong bytes", k, got)
					default:
						fmt.Fprintf(&out, "%s: %s\n", k, got)
					}
				}
				return out.String()
			case "delete":
				for _, k := range keyArgs(d) {
					if err := s.Delete(k); err != nil {
						return err.Error()
					}
					delete(want, k)
				}
				return "ok"
			case "maintain":
				s.Maintain()
				return storeState(s)
			case "state":
				return storeState(s)
			case "tick":
				dur, err := time.ParseDuration(d.CmdArgs[0].Key)
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				clock.now = clock.now.Add(dur)
				return "ok"
			case "corrupt":
				_, name := s.archive.paths(d.CmdArgs[0].Key)
				b, err := os.ReadFile(name)
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				b[len(b)-10] ^= 0xff
				if err := os.WriteFile(name, b, 0o600); err != nil {
					d.Fatalf(t, "%v", err)
				}
				return "ok"
			case "quarantined":
				return strconv.Itoa(len(s.Quarantined()))
			case "trace":
				out := trace.String()
				trace.Reset()
				return out
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			return ""
		})
	})
}

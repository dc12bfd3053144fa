package kv

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/kvsidecar/kvsidecar/tiers"
)

// TestCacheScripts drives a Cache from the datadriven files under
// testdata/cache, each in its own testing/synctest bubble: time moves only
// when a script sleeps, and every command returns once the cache's and the
// store's goroutines are idle, so expiry and demotion are deterministic.
// Regenerate the expected output after a deliberate change with
//
//	go test ./kv -run TestCacheScripts -rewrite
//
// Commands (a block is 64 KiB: 2 layers, 2 heads, 64 tokens, 64 dims):
//
//	open [ttl=D] [strategy=S] [focus=BLOCKS|off] [working=BLOCKS]
//	put SESSION QUERY [imp=X] [sem=Y]   Put, or put with a tiers.Hint
//	get SESSION QUERY                   the serving tier, or miss
//	compute SESSION QUERY               GetOrCompute: computed, or the tier
//	invalidate SESSION
//	sleep D                             advances the bubble's clock
//	state                               which blocks each tier holds
//	stats                               size, hits and misses
//	close
func TestCacheScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/cache", func(t *testing.T, path string) {
		synctest.Test(t, func(t *testing.T) {
			s := &cacheScript{names: map[string]string{}}
			defer s.close()
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				out := s.run(t, d)
				synctest.Wait()
				return out
			})
		})
	})
}

// scriptBlockBytes is the size of every block a script puts.
const scriptBlockBytes = 2 * 2 * 2 * 64 * 64 * 2

type cacheScript struct {
	c     *Cache
	names map[string]string // store key → "session/query"
	seed  uint64
}

func (s *cacheScript) close() {
	if s.c != nil {
		s.c.Close()
		s.c = nil
	}
}

func (s *cacheScript) block() *Block {
	s.seed++
	return testBlock(2, 2, 64, 64, s.seed)
}

// sessionQuery returns the SESSION QUERY arguments of d.
func sessionQuery(t *testing.T, d *datadriven.TestData) (string, string) {
	if len(d.CmdArgs) < 2 {
		d.Fatalf(t, "want %s SESSION QUERY", d.Cmd)
	}
	return d.CmdArgs[0].Key, d.CmdArgs[1].Key
}

func (s *cacheScript) name(session, query string) {
	s.names[cacheKey(session, QueryHash(query))] = session + "/" + query
}

func (s *cacheScript) run(t *testing.T, d *datadriven.TestData) string {
	if s.c == nil && d.Cmd != "open" {
		d.Fatalf(t, "a script starts with open")
	}
	blocks := func(key string) int64 {
		a, ok := d.Arg(key)
		if !ok || a.SingleVal(t) == "off" {
			return 0
		}
		f, err := strconv.ParseFloat(a.SingleVal(t), 64)
		if err != nil {
			d.Fatalf(t, "%s: %v", key, err)
		}
		return int64(f * scriptBlockBytes)
	}
	switch d.Cmd {
	case "open":
		s.close()
		o := Options{Store: tiers.Options{
			Focus:   tiers.Budget{MaxBytes: blocks("focus")},
			Working: tiers.Budget{MaxBytes: blocks("working")},
		}}
		if a, ok := d.Arg("focus"); ok && a.SingleVal(t) == "off" {
			o.Store.DisableFocus = true
		}
		d.MaybeScanArgs(t, "strategy", &o.Store.Strategy)
		if a, ok := d.Arg("ttl"); ok {
			ttl, err := time.ParseDuration(a.SingleVal(t))
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			o.TTL = ttl
		}
		c, err := Open(o)
		if err != nil {
			return err.Error()
		}
		s.c = c
		return "ok"
	case "put":
		session, query := sessionQuery(t, d)
		s.name(session, query)
		var err error
		if d.HasArg("imp") || d.HasArg("sem") {
			var h tiers.Hint
			d.MaybeScanArgs(t, "imp", &h.Importance)
			d.MaybeScanArgs(t, "sem", &h.Semantic)
			err = s.c.put(session, QueryHash(query), s.block(), h)
		} else {
			err = s.c.Put(session, query, s.block())
		}
		if err != nil {
			return err.Error()
		}
		return "ok"
	case "get":
		_, tier, err := s.c.Get(sessionQuery(t, d))
		if err != nil {
			return "miss"
		}
		return tier.String()
	case "compute":
		session, query := sessionQuery(t, d)
		s.name(session, query)
		_, out, err := s.c.GetOrCompute(context.Background(), session, query, func(context.Context) (*Block, error) {
			return s.block(), nil
		})
		switch {
		case err != nil:
			return err.Error()
		case out.Computed:
			return "computed"
		}
		return out.Tier.String()
	case "invalidate":
		if err := s.c.Invalidate(d.CmdArgs[0].Key); err != nil {
			return err.Error()
		}
		return "ok"
	case "sleep":
		dur, err := time.ParseDuration(d.CmdArgs[0].Key)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		time.Sleep(dur) // the bubble's clock: no real time passes
		return "ok"
	case "state":
		// What the store holds, expired or not: expiry must delete, not
		// only hide.
		byTier := map[tiers.Tier][]string{}
		s.c.Store().Range(func(key string, _ tiers.Meta, tier tiers.Tier) bool {
			n, ok := s.names[key]
			if !ok {
				n = fmt.Sprintf("%q", key)
			}
			byTier[tier] = append(byTier[tier], n)
			return true
		})
		var out strings.Builder
		for _, tier := range []tiers.Tier{tiers.TierFocus, tiers.TierWorking, tiers.TierArchive} {
			if names := byTier[tier]; len(names) > 0 {
				slices.Sort(names)
				fmt.Fprintf(&out, "%s: %s\n", tier, strings.Join(names, " "))
			}
		}
		if out.Len() == 0 {
			return "empty"
		}
		return out.String()
	case "stats":
		st := s.c.Stats()
		return fmt.Sprintf("size %d, hits %d, misses %d", st.Size, st.Hits, st.Misses)
	case "close":
		if err := s.c.Close(); err != nil {
			return err.Error()
		}
		s.c = nil
		return "ok"
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return ""
}

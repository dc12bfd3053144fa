package memory

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

func msg(t testing.TB, raw string) Message {
	t.Helper()
	var m Message
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatalf("parse %s: %v", raw, err)
	}
	return m
}

func text(role, content string) Message { return NewMessage(role, content) }

// fakeClock ticks 1ms per reading.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Millisecond)
	return c.t
}

// After never fires: the store starts no timers on its clock.
func (c *fakeClock) After(time.Duration) <-chan time.Time { return nil }

func openStore(t testing.TB, dir string, mod func(*Options)) *Store {
	t.Helper()
	o := Options{Dir: dir, Fsync: FsyncNever, Clock: &fakeClock{t: time.Unix(1_700_000_000, 0)}}
	if mod != nil {
		mod(&o)
	}
	s, err := Open(o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var vocab = strings.Fields(`apple banana cherry deploy kubernetes cluster python golang rust memory window token
cache prefix summary budget invoice customer order shipping refund database index query latency throughput
server client proxy upstream stream event socket error retry timeout backoff tenant session archive working
focus recall vector embedding model llama mistral qwen gemma vllm sglang ollama tgi gpu cuda nvme zstd
quantum physics history roman empire volcano ocean mountain river forest desert weather storm`)

func randText(r *rand.Rand, words int) string {
	var b strings.Builder
	for i := 0; i < words; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[r.IntN(len(vocab))])
		if r.IntN(20) == 0 {
			b.WriteString(".\n")
		}
	}
	return b.String()
}

// countWindow recounts a window with an independent tokenizer.
func countWindow(t testing.TB, tk *Tokenizer, enc Encoding, raws []json.RawMessage) int {
	t.Helper()
	n := 0
	for _, raw := range raws {
		var m Message
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("window message does not parse: %v: %s", err, raw)
		}
		n += tk.MessageTokens(enc, &m)
	}
	return n
}

func rawStrings(raws []json.RawMessage) []string {
	out := make([]string, len(raws))
	for i, r := range raws {
		out[i] = string(r)
	}
	return out
}

func prepare(t testing.TB, s *Store, tenant, id string, mode Mode, msgs ...Message) *Turn {
	t.Helper()
	turn, err := s.Prepare(context.Background(), TurnRequest{Tenant: tenant, SessionID: id, Mode: mode, Model: "test-model", Messages: msgs})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	return turn
}

func contains(raws []json.RawMessage, m Message) bool {
	for _, r := range raws {
		if string(r) == string(m.Raw) {
			return true
		}
	}
	return false
}

package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvsidecar/kvsidecar/engine"
)

// memShared is a engine.SharedStates in memory, as the replicas of a fleet see
// one store.
type memShared struct {
	mu     sync.Mutex
	states map[string][2][]byte
	index  map[string]string // fp + "/" + hash → id
	puts   int
	fail   bool
}

func newMemShared() *memShared {
	return &memShared{states: map[string][2][]byte{}, index: map[string]string{}}
}

var errFakeStore = errors.New("fake store down")

func (m *memShared) PutState(_ context.Context, fp, id string, hashes []string, raw, meta []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errFakeStore
	}
	m.states[id] = [2][]byte{append([]byte(nil), raw...), append([]byte(nil), meta...)}
	for _, h := range hashes {
		m.index[fp+"/"+h] = id
	}
	m.puts++
	return nil
}

func (m *memShared) LookupState(_ context.Context, fp string, hashes []string) (string, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return "", 0, errFakeStore
	}
	for i := len(hashes) - 1; i >= 0; i-- {
		if id, ok := m.index[fp+"/"+hashes[i]]; ok {
			return id, i + 1, nil
		}
	}
	return "", 0, nil
}

func (m *memShared) GetState(_ context.Context, id string) ([]byte, []byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return nil, nil, errFakeStore
	}
	s, ok := m.states[id]
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s", engine.ErrSharedNotFound, id)
	}
	return s[0], s[1], nil
}

// sendTurn runs one turn of session S on h and settles it (as a fleet's
// proxy does before releasing the session's lease).
func sendTurn(h *harness, turn int) engine.Timings {
	h.t.Helper()
	req := &engine.Request{Tenant: "t1", SessionID: "S", Model: "m", Body: chatBody("S", turn)}
	tm, _ := h.send(req)
	h.c.Settle(context.Background(), req)
	return tm
}

// A conversation alternating between two replicas that share a store:
// each turn restores what the other replica computed and prefills only the
// new message; the same replicas without the store prefill the whole
// prompt on a replica's first turn.
func TestSharedStatesFollowTheSession(t *testing.T) {
	store := newMemShared()
	shared := func(o *Options) { o.Shared = store }
	a, b := newHarness(t, 1, shared), newHarness(t, 1, shared)

	if tm := sendTurn(a, 1); tm.CacheN != 0 {
		t.Fatalf("first turn on A: %+v", tm)
	}
	// Settle wrote the turn's state through before returning.
	if store.puts != 1 {
		t.Fatalf("puts after A's settled turn: %d", store.puts)
	}
	tm := sendTurn(b, 2)
	if tm.CacheN != int64(promptLen("S", 1)) || tm.PromptN != int64(promptLen("S", 2)-promptLen("S", 1)) {
		t.Fatalf("turn 2 on B: %+v, want cache_n %d", tm, promptLen("S", 1))
	}
	if s := b.c.Stats(); s.SharedFetches != 1 || s.Restores != 1 || s.SharedErrors != 0 {
		t.Fatalf("B's stats %+v", s)
	}
	// A still holds turn 1's KV in its slot; the store has turn 2's: A
	// restores over its own slot.
	tm = sendTurn(a, 3)
	if tm.CacheN != int64(promptLen("S", 2)) {
		t.Fatalf("turn 3 back on A: cache_n %d, want %d (B's turn 2)", tm.CacheN, promptLen("S", 2))
	}
	// And when A's slot is already as good as the store, nothing moves.
	mark := a.fake.logLen()
	tm = sendTurn(a, 4)
	if tm.CacheN != int64(promptLen("S", 3)) || len(a.fake.logOf("restore", mark)) != 0 {
		t.Fatalf("turn 4 on A: %+v, restores %v", tm, a.fake.logOf("restore", mark))
	}

	// Control: the same two turns on replicas that share nothing.
	c, d := newHarness(t, 1, nil), newHarness(t, 1, nil)
	sendTurn(c, 1)
	if tm := sendTurn(d, 2); tm.CacheN != 0 || tm.PromptN != int64(promptLen("S", 2)) {
		t.Fatalf("turn 2 on a replica without the store: %+v", tm)
	}
}

// A shared store that fails costs restores, never a request.
func TestSharedStatesFailureLeavesRequestsWorking(t *testing.T) {
	store := newMemShared()
	store.fail = true
	a := newHarness(t, 1, func(o *Options) { o.Shared = store })
	sendTurn(a, 1)
	if tm := sendTurn(a, 2); tm.CacheN != int64(promptLen("S", 1)) {
		t.Fatalf("local reuse with the store down: %+v", tm)
	}
	s := a.c.Stats()
	if s.SharedErrors == 0 || s.SharedPuts != 0 {
		t.Fatalf("stats %+v", s)
	}
	if n := a.warns.count("shared state store"); n != 1 {
		t.Fatalf("%d warnings about the store, want 1", n)
	}
}

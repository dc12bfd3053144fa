package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// memLog is a SharedLog in memory: what the replicas of a fleet see of one
// store. It refuses what package remote refuses: a taken position with
// other bytes, or a gap.
type memLog struct {
	mu   sync.Mutex
	logs map[string][][]byte
	fail atomic.Bool
}

func newMemLog() *memLog { return &memLog{logs: map[string][][]byte{}} }

var errLogDown = errors.New("shared log down")

func (m *memLog) Append(_ context.Context, tenant, session string, at int64, payloads [][]byte) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail.Load() {
		return 0, errLogDown
	}
	k := tenant + "/" + session
	l := m.logs[k]
	if at > int64(len(l)) {
		return 0, fmt.Errorf("%w: gap", ErrSharedConflict)
	}
	for i, p := range payloads {
		pos := at + int64(i)
		if pos < int64(len(l)) {
			if !bytes.Equal(l[pos], p) {
				return 0, fmt.Errorf("%w: record %d differs", ErrSharedConflict, pos)
			}
			continue
		}
		l = append(l, append([]byte(nil), p...))
	}
	m.logs[k] = l
	return int64(len(l)), nil
}

func (m *memLog) Records(_ context.Context, tenant, session string, from int64) ([][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail.Load() {
		return nil, errLogDown
	}
	l := m.logs[tenant+"/"+session]
	if from > int64(len(l)) {
		return nil, nil
	}
	return append([][]byte(nil), l[from:]...), nil
}

func (m *memLog) Len(_ context.Context, tenant, session string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail.Load() {
		return 0, errLogDown
	}
	return int64(len(m.logs[tenant+"/"+session])), nil
}

func (m *memLog) Replace(_ context.Context, tenant, session string, payloads [][]byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.logs[tenant+"/"+session] = append([][]byte(nil), payloads...)
	return nil
}

// turnOn runs one full-history turn of session S on s: the client sends
// the whole conversation so far plus question i, and gets answer i.
func turnOn(t *testing.T, s *Store, i int) {
	t.Helper()
	msgs := []Message{text("system", "you help")}
	for j := range i {
		msgs = append(msgs, text("user", fmt.Sprintf("question %d", j)), text("assistant", fmt.Sprintf("answer %d", j)))
	}
	msgs = append(msgs, text("user", fmt.Sprintf("question %d", i)))
	tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t1", SessionID: "S", Model: "m", Messages: msgs})
	if err != nil {
		t.Fatalf("turn %d: %v", i, err)
	}
	if err := tr.Complete(text("assistant", fmt.Sprintf("answer %d", i))); err != nil {
		t.Fatalf("turn %d: complete: %v", i, err)
	}
}

func wantHistory(t *testing.T, s *Store, turns int) {
	t.Helper()
	v, err := s.Session("t1", "S")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range v.Messages {
		if m.Role != "system" {
			got = append(got, m.Content)
		}
	}
	if len(got) != 2*turns {
		t.Fatalf("history %q, want %d turns", got, turns)
	}
	for j := range turns {
		if got[2*j] != fmt.Sprintf("question %d", j) || got[2*j+1] != fmt.Sprintf("answer %d", j) {
			t.Fatalf("history %q: turn %d out of place", got, j)
		}
	}
}

// A conversation alternating between two replicas keeps every turn once,
// in order, on both; a third replica that never saw it shows it whole.
func TestSharedLogAlternatingReplicas(t *testing.T) {
	sh := newMemLog()
	with := func(o *Options) { o.SharedLog = sh }
	a, b := openStore(t, t.TempDir(), with), openStore(t, t.TempDir(), with)
	for i := range 6 {
		s := a
		if i%2 == 1 {
			s = b
		}
		turnOn(t, s, i)
	}
	wantHistory(t, a, 6)
	wantHistory(t, b, 6)
	wantHistory(t, openStore(t, t.TempDir(), with), 6)
	if st := b.Stats(); st.SharedLogRebuilds != 1 || st.SharedLogPulled == 0 {
		t.Fatalf("b's stats: rebuilds %d pulled %d", st.SharedLogRebuilds, st.SharedLogPulled)
	}
	// The shared log holds each message once.
	n := 0
	for _, p := range sh.logs["t1/S"] {
		if bytes.Contains(p, []byte(`"k":"msg"`)) {
			n++
		}
	}
	if n != 12 {
		t.Fatalf("%d message records in the shared log, want 12", n)
	}
}

// A replica restarted on its data folder rebuilds from the shared log what
// it missed while down.
func TestSharedLogReplicaRestart(t *testing.T) {
	sh := newMemLog()
	with := func(o *Options) { o.SharedLog = sh }
	dirA := t.TempDir()
	a := openStore(t, dirA, with)
	b := openStore(t, t.TempDir(), with)
	turnOn(t, a, 0)
	a.Close()
	turnOn(t, b, 1)
	turnOn(t, b, 2)
	a2 := openStore(t, dirA, with)
	turnOn(t, a2, 3)
	wantHistory(t, a2, 4)
	wantHistory(t, b, 4)
}

// A session written before the fleet existed is uploaded on first use.
func TestSharedLogUploadsLocalSessions(t *testing.T) {
	dir := t.TempDir()
	local := openStore(t, dir, nil)
	turnOn(t, local, 0)
	turnOn(t, local, 1)
	local.Close()
	sh := newMemLog()
	with := func(o *Options) { o.SharedLog = sh }
	a := openStore(t, dir, with)
	turnOn(t, a, 2)
	wantHistory(t, openStore(t, t.TempDir(), with), 3)
	if st := a.Stats(); st.SharedLogUploads != 1 {
		t.Fatalf("uploads %d", st.SharedLogUploads)
	}
}

// A shared log that fails writes nothing anywhere: the turn fails (the
// proxy forwards without memory), nothing is acknowledged that another
// replica could not see.
func TestSharedLogDownWritesNothing(t *testing.T) {
	sh := newMemLog()
	a := openStore(t, t.TempDir(), func(o *Options) { o.SharedLog = sh })
	turnOn(t, a, 0)
	sh.fail.Store(true)
	msgs := []Message{text("system", "you help"), text("user", "question 0"), text("assistant", "answer 0"), text("user", "question 1")}
	if _, err := a.Prepare(context.Background(), TurnRequest{Tenant: "t1", SessionID: "S", Model: "m", Messages: msgs}); !errors.Is(err, errLogDown) {
		t.Fatalf("prepare with the shared log down: %v", err)
	}
	sh.fail.Store(false)
	wantHistory(t, a, 1)
	// Deleting on one replica deletes everywhere, also on a replica that
	// holds a copy (it must not upload it back), and the id can be used
	// again.
	b := openStore(t, t.TempDir(), func(o *Options) { o.SharedLog = sh })
	wantHistory(t, b, 1)
	if err := a.Delete("t1", "S"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Session("t1", "S"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a deleted session on a replica that held it: %v", err)
	}
	if _, err := openStore(t, t.TempDir(), func(o *Options) { o.SharedLog = sh }).Session("t1", "S"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a deleted session on another replica: %v", err)
	}
	turnOn(t, b, 0)
	wantHistory(t, a, 1)
}

// Two replicas share a tenant's pool: what one writes the other reads,
// versions are one sequence, and compare-and-set holds across them under
// concurrent writers (every successful increment counted once).
func TestSharedLogPool(t *testing.T) {
	sh := newMemLog()
	with := func(o *Options) { o.SharedLog = sh }
	a, b := openStore(t, t.TempDir(), with), openStore(t, t.TempDir(), with)
	zero := uint64(0)
	e, err := a.PoolPut("t1", "plan", PoolWrite{Value: []byte(`"draft"`), ExpectedVersion: &zero})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.PoolGet("t1", "plan")
	if err != nil || string(got.Value) != `"draft"` || got.Version != e.Version {
		t.Fatalf("b reads %+v, %v", got, err)
	}
	if _, err := b.PoolPut("t1", "plan", PoolWrite{Value: []byte(`"other"`), ExpectedVersion: &zero}); !errors.Is(err, ErrConflict) {
		t.Fatalf("b creating a key a created: %v", err)
	}
	// Concurrent compare-and-set increments of one counter from both.
	if _, err := a.PoolPut("t1", "n", PoolWrite{Value: []byte(`0`), ExpectedVersion: &zero}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for g := range 8 {
		s := a
		if g%2 == 1 {
			s = b
		}
		wg.Go(func() {
			for range 10 {
				cur, err := s.PoolGet("t1", "n")
				if err != nil {
					t.Error(err)
					return
				}
				var n int
				fmt.Sscan(string(cur.Value), &n)
				v := cur.Version
				_, err = s.PoolPut("t1", "n", PoolWrite{Value: []byte(fmt.Sprint(n + 1)), ExpectedVersion: &v})
				if err == nil {
					mu.Lock()
					wins++
					mu.Unlock()
				} else if !errors.Is(err, ErrConflict) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, s := range []*Store{a, b, openStore(t, t.TempDir(), with)} {
		cur, err := s.PoolGet("t1", "n")
		if err != nil || string(cur.Value) != fmt.Sprint(wins) {
			t.Fatalf("counter %s after %d successful increments: %v", cur.Value, wins, err)
		}
	}
	if wins == 0 {
		t.Fatal("no increment succeeded")
	}
	if err := b.PoolDelete("t1", "plan", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PoolGet("t1", "plan"); !errors.Is(err, ErrKeyNotFound) {
		t.Fatalf("a reads a key b deleted: %v", err)
	}
	if l, _ := a.PoolList("t1", "", 0); len(l) != 1 || l[0].Key != "n" {
		t.Fatalf("list on a: %+v", l)
	}
}

// A user's sessions served on one replica are in the user's cross-session
// index on another, where a new session of the user starts.
func TestSharedLogUserScope(t *testing.T) {
	sh := newMemLog()
	with := func(o *Options) { o.SharedLog = sh }
	a, b := openStore(t, t.TempDir(), with), openStore(t, t.TempDir(), with)
	prep := func(s *Store, session, content string) {
		t.Helper()
		tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t1", SessionID: session, UserID: "u1", Model: "m",
			Messages: []Message{text("user", content)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Complete(text("assistant", "noted")); err != nil {
			t.Fatal(err)
		}
	}
	prep(a, "first", "my cat is called marmalade")
	prep(b, "second", "what is my cat called")
	um := b.reg.userMem("t1", "u1")
	if !um.hasDocsOf(sessionHash("t1", "first")) {
		t.Fatal("the user's session served on the other replica is not in this replica's user index")
	}
}

// A replica whose copy of a session predates its deletion elsewhere, and
// a new conversation of the same id there that grew past the copy's
// position, rebuilds from the shared log: it never reads the new
// conversation's records as the tail of the old one.
func TestSharedLogDeletedAndRecreatedPastAStaleCopy(t *testing.T) {
	sh := newMemLog()
	with := func(o *Options) { o.SharedLog = sh }
	a, b := openStore(t, t.TempDir(), with), openStore(t, t.TempDir(), with)
	turnOn(t, b, 0) // b's copy: the old conversation
	if err := a.Delete("t1", "S"); err != nil {
		t.Fatal(err)
	}
	for i := range 4 { // the new one, on a, longer than b's copy
		turnOn(t, a, i)
	}
	wantHistory(t, b, 4)
	turnOn(t, b, 4)
	wantHistory(t, a, 5)
}

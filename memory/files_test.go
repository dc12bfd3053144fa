//go:build linux

package memory

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

// TestSessionsBeyondTheDescriptorLimit reproduces issue 12 row 11: one log
// stayed open per loaded session, up to 4096 whatever the process's
// descriptor limit, so under `ulimit -n 1024` a third of the requests past
// ~1,000 sessions failed with "too many open files" and skipped memory.
// Here the limit is 256 and 600 sessions each take a turn and come back.
func TestSessionsBeyondTheDescriptorLimit(t *testing.T) {
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Skip("no RLIMIT_NOFILE:", err)
	}
	const limit = 256
	if old.Max < limit {
		t.Skipf("hard limit %d below %d", old.Max, limit)
	}
	lowered := syscall.Rlimit{Cur: limit, Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered); err != nil {
		t.Skip("cannot lower RLIMIT_NOFILE:", err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)

	s := openStore(t, t.TempDir(), nil)
	if got := s.files.Max(); got != limit/4 {
		t.Fatalf("open-file bound %d, want %d (a quarter of the limit)", got, limit/4)
	}
	const sessions = 600
	for round := range 2 {
		for i := range sessions {
			id := fmt.Sprintf("s%d", i)
			tr, err := s.Prepare(t.Context(), TurnRequest{Tenant: "t", SessionID: id, Mode: ModeAppend, Model: "m", Messages: []Message{text("user", fmt.Sprintf("q%d-%d", i, round))}})
			if err != nil {
				t.Fatalf("round %d session %d: %v", round, i, err)
			}
			if err := tr.Complete(text("assistant", "a")); err != nil {
				t.Fatalf("round %d session %d: complete: %v", round, i, err)
			}
		}
		if n := openFDs(t); n >= limit {
			t.Fatalf("%d descriptors open, limit %d", n, limit)
		}
	}
	for i := range sessions {
		v, err := s.Session("t", fmt.Sprintf("s%d", i))
		if err != nil || len(v.Messages) != 4 {
			t.Fatalf("session %d: %d messages, %v", i, len(v.Messages), err)
		}
	}
	if st := s.files.Stats(); st.Open > st.Max || st.Idled == 0 {
		t.Fatalf("files %+v", st)
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

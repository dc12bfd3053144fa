package memory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"
)

// ordinaryText is prose with punctuation, numbers, newlines, code
// indentation and a few scripts: what counting must get exactly right.
func ordinaryText(r *rand.Rand, n int) string {
	words := append(strings.Fields("the quick brown fox jumps over 1234 lazy dogs, isn't it? Ünïcødé naïve café 東京 都 こんにちは мир привет नमस्ते 🙂 `code()` {x: 1} [link](http://example.com/a/b?c=d)"), "\n", "\n\n", "\t", "    ")
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(words[r.IntN(len(words))])
		if r.IntN(8) > 0 {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

func TestCountIsExactOnOrdinaryText(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	tk := NewTokenizer(0)
	for _, e := range []Encoding{CL100K, O200K} {
		enc, err := tk.encoding(e)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{100, 5000, 40 << 10, 200 << 10} {
			s := ordinaryText(r, n)
			if got, want := tk.Count(e, s), len(enc.EncodeOrdinary(s)); got != want {
				t.Errorf("%v, %d bytes: Count %d, tiktoken %d", e, len(s), got, want)
			}
		}
	}
}

func TestSegmentsConcatenateAndStayBounded(t *testing.T) {
	f := func(name, s string, maxSeg int) {
		t.Helper()
		var b strings.Builder
		longest := 0
		forSegments(s, func(seg string) bool {
			if seg == "" || !utf8.ValidString(seg) && utf8.ValidString(s) {
				t.Fatalf("%s: bad segment %q", name, seg[:min(len(seg), 20)])
			}
			longest = max(longest, len(seg))
			b.WriteString(seg)
			return true
		})
		if b.String() != s {
			t.Fatalf("%s: segments do not concatenate to the text", name)
		}
		if longest > maxSeg {
			t.Fatalf("%s: a segment of %d bytes, want at most %d", name, longest, maxSeg)
		}
	}
	f("a run", strings.Repeat("a", 100_000), maxRunBytes+1)
	f("CJK", strings.Repeat("中文没有空格", 20_000), maxRunBytes+3)
	f("spaces", strings.Repeat(" ", 50_000), maxRunBytes+1)
	f("alternating classes", strings.Repeat("a1!", 50_000), maxSegmentBytes+3)
	f("prose", ordinaryText(rand.New(rand.NewPCG(3, 4)), 300_000), maxSegmentBytes+maxRunBytes)
}

// TestPrepareCountsOutsideTheLockAndStops reproduces issue 12 row 1: one
// long "word" (here 'a'×100 KB, 12.5 s on main) was tokenized in quadratic
// time under the session's lock, and went on after the client left. Now
// counting runs before the lock is taken and stops with the request.
func TestPrepareCountsOutsideTheLockAndStops(t *testing.T) {
	synctest.Test(t, testPrepareCountsOutsideTheLockAndStops)
}

func testPrepareCountsOutsideTheLockAndStops(t *testing.T) {
	s := openBubbleStore(t, t.TempDir(), func(o *Options) { o.Window.Limit = 200_000 })
	prepare(t, s, "t", "s", ModeAppend, text("user", "hello")).Complete(text("assistant", "hi"))
	synctest.Wait() // the worker is done with that turn: only Prepare can hold the lock below
	sess, err := s.reg.session("t", "s", false)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	segs, lockedWhileCounting := 0, false
	testHookSegment = func() {
		segs++
		if sess.mu.TryLock() {
			sess.mu.Unlock()
		} else {
			lockedWhileCounting = true
		}
		if segs == 10 {
			cancel() // the client leaves
		}
	}
	defer func() { testHookSegment = nil }()
	_, err = s.Prepare(ctx, TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeAppend, Model: "m", Messages: []Message{text("user", strings.Repeat("a", 100_000))}})
	testHookSegment = nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Prepare after the client left: %v", err)
	}
	if lockedWhileCounting || segs == 0 {
		t.Fatalf("counted %d segments, session locked meanwhile: %v", segs, lockedWhileCounting)
	}
	if segs > 10+segmentBytes/maxRunBytes+1 {
		t.Fatalf("counted %d segments after the cancel at 10", segs)
	}
	// Nothing was recorded; the session goes on.
	if v, _ := s.Session("t", "s"); len(v.Messages) != 2 {
		t.Fatalf("%d messages after a cancelled Prepare", len(v.Messages))
	}
	prepare(t, s, "t", "s", ModeAppend, text("user", "again")).Abort()
}

// TestCloseStopsCountingInFlight reproduces issue 12 row 2: during row 1's
// tokenization Close waited for the session lock, so SIGTERM never ended
// the process. Now Close cancels the count and returns.
func TestCloseStopsCountingInFlight(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Window.Limit = 200_000 })
	var once sync.Once
	closed := make(chan error, 1)
	testHookSegment = func() {
		once.Do(func() {
			go func() { closed <- s.Close() }()
			<-s.ctx.Done() // Close cancels first
		})
	}
	defer func() { testHookSegment = nil }()
	_, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeAppend, Model: "m", Messages: []Message{text("user", strings.Repeat("a", 100_000))}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Prepare during Close: %v", err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(time.Minute): // liveness only: Close takes milliseconds
		t.Fatal("Close did not return")
	}
}

// TestShutdownGivesUpAtItsDeadline: a session held by someone else does not
// keep Shutdown past its deadline.
func TestShutdownGivesUpAtItsDeadline(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	prepare(t, s, "t", "s", ModeAppend, text("user", "hello")).Abort()
	sess, _ := s.reg.session("t", "s", false)
	sess.mu.Lock() // a stuck holder
	defer func() {
		// Free the holder, then let the work Shutdown gave up on finish
		// before the folder is removed.
		sess.mu.Unlock()
		bg := context.Background()
		s.sweeper.Stop(bg)
		s.wk.wait(bg)
		s.know.wait(bg)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Shutdown: %v, want the deadline reported", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Shutdown waited for the stuck session")
	}
}

func TestCompleteCapsHugeReplies(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Storage.MaxReplyBytes = 64 << 10 })
	tr := prepare(t, s, "t", "s", ModeAppend, text("user", "write a lot"))
	huge := strings.Repeat("é", 1<<20) // 2 MiB, one long word
	if err := tr.Complete(text("assistant", huge)); err != nil {
		t.Fatal(err)
	}
	v, _ := s.Session("t", "s")
	got := v.Messages[1]
	if len(got.Content) > 64<<10 || !strings.HasPrefix(huge, got.Content) || !got.Partial || !utf8.ValidString(got.Content) {
		t.Fatalf("reply kept %d bytes (partial %v)", len(got.Content), got.Partial)
	}
	if s.Stats().RepliesCut != 1 {
		t.Fatalf("RepliesCut %d", s.Stats().RepliesCut)
	}
}

func ExampleCutText() {
	fmt.Println(CutText("héllo", 2))
	// Output: h
}

// TestOversizedTurnGoesAsSent: a turn far over the window is sent as is
// (the engine decides), and a fitting one is not taken for oversized by
// the early check.
func TestOversizedTurnGoesAsSent(t *testing.T) {
	s := openStore(t, t.TempDir(), nil) // limit 8192
	huge := strings.Repeat("a", 8<<20)  // 8 MiB: 1 M tokens
	tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeAppend, Model: "m", Messages: []Message{text("user", huge)}})
	if err != nil || !tr.Stats.AsSent || len(tr.Messages) != 1 {
		t.Fatalf("err %v", err)
	}
	tr.Fail()
	// A fitting request is not sent as is: the system message and the
	// turn together just fit.
	sys := strings.Repeat("word ", 3000)
	tr, err = s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s2", Mode: ModeFull, Model: "m", Messages: []Message{text("system", sys), text("user", "hi")}})
	if err != nil || tr.Stats.AsSent {
		t.Fatal(err)
	}
}

func TestCountTokensContextStopsPastTheLimit(t *testing.T) {
	s := openStore(t, t.TempDir(), nil) // limit 8192
	tools := `[{"type":"function","function":{"name":"f","description":"` + strings.Repeat("b", 4<<20) + `"}}]`
	segs := 0
	testHookSegment = func() { segs++ }
	n, err := s.CountTokensContext(context.Background(), "m", tools)
	testHookSegment = nil
	if err != nil || n <= 8192 || segs > 8192/16+4 {
		t.Fatalf("count %d (%v) after %d segments", n, err, segs)
	}
	if tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "t", SessionID: "s", Mode: ModeAppend, Model: "m", Messages: []Message{text("user", "hi")}, ToolsTokens: n}); err != nil || !tr.Stats.AsSent {
		t.Fatalf("Prepare with tools over the limit: %v", err)
	}
	if n, err := s.CountTokensContext(context.Background(), "m", "hello world"); n != 2 || err != nil {
		t.Fatalf("small count %d %v", n, err)
	}
}

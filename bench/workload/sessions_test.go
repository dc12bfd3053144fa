package workload

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestParseMetricsSumsLabelsAndSkipsComments(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(`# HELP sidecar_engine_restores_total Slot states restored.
# TYPE sidecar_engine_restores_total counter
sidecar_engine_restores_total{tier="working"} 3
sidecar_engine_restores_total{tier="archive",note="a } b"} 2
llamacpp:prompt_tokens_total 1.5e+03
sidecar_engine_queue_depth 0 1700000000000
broken{ 1
not_a_number x
`))
	if err != nil {
		t.Fatal(err)
	}
	f := func(name string, want float64) {
		t.Helper()
		if got, ok := m.Get(name); !ok || got != want {
			t.Errorf("%s = %v, %v; want %v", name, got, ok, want)
		}
	}
	f("sidecar_engine_restores_total", 5)
	f("llamacpp:prompt_tokens_total", 1500)
	f("sidecar_engine_queue_depth", 0)
	if _, ok := m.Get("not_a_number"); ok {
		t.Error("a sample without a number was kept")
	}
}

func TestEngineFiguresTolerateRenamesAndRestarts(t *testing.T) {
	parse := func(s string) Metrics {
		m, err := ParseMetrics(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	// Today's names: counters and mean gauges.
	before := parse("sidecar_engine_restores_total 2\nsidecar_engine_restore_seconds_mean 0.010\nsidecar_engine_saves_total 4\nsidecar_engine_save_seconds_mean 0.005\nsidecar_engine_restore_errors_total 7\n")
	after := parse("sidecar_engine_restores_total 4\nsidecar_engine_restore_seconds_mean 0.020\nsidecar_engine_saves_total 4\nsidecar_engine_save_seconds_mean 0.005\nsidecar_engine_restore_errors_total 9\n")
	var st SessionsSide
	fillEngineFigures(&st, before, after)
	// Two restores took (4·20 − 2·10) ms = 60 ms: 30 ms each.
	if st.Restores != 2 || st.Saves != 0 || st.RestoreMeanMs < 29.99 || st.RestoreMeanMs > 30.01 || st.SaveMeanMs != 0 {
		t.Fatalf("today's names: %+v", st)
	}
	// A histogram under another counter name; the process restarted.
	before = parse("sidecar_engine_state_restores_total 10\nsidecar_engine_restore_seconds_sum 1\nsidecar_engine_restore_seconds_count 10\n")
	after = parse("sidecar_engine_state_restores_total{tier=\"archive\"} 3\nsidecar_engine_restore_seconds_sum 0.09\nsidecar_engine_restore_seconds_count 3\n")
	st = SessionsSide{}
	fillEngineFigures(&st, before, after)
	if st.Restores != 3 || st.RestoreMeanMs < 29.99 || st.RestoreMeanMs > 30.01 || st.Saves != -1 || st.SaveMeanMs != -1 {
		t.Fatalf("renamed, restarted: %+v", st)
	}
	// Nothing exported: n/a, never a made-up zero.
	st = SessionsSide{}
	fillEngineFigures(&st, parse(""), parse("sidecar_requests_total 5\n"))
	if st.Restores != -1 || st.Saves != -1 || st.RestoreMeanMs != -1 {
		t.Fatalf("no engine metrics: %+v", st)
	}
}

// sseServer answers chat requests with the given events after delay.
func sseServer(t *testing.T, status int, delay time.Duration, events ...string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Session-ID") != "s1" || r.URL.Path != "/v1/chat/completions" {
			http.Error(w, "bad request", 400)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(status)
		for i, e := range events {
			if i == 1 {
				time.Sleep(delay)
			}
			fmt.Fprintf(w, "%s\n\n", e)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func TestStreamTurnReadsTimingsAndTTFT(t *testing.T) {
	ctx := context.Background()
	msgs := []chatMsg{{Role: "user", Content: "hi"}}
	s := sseServer(t, 200, 30*time.Millisecond,
		`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}`,
		`data: {"choices":[{"index":0,"delta":{"content":"ab"}}]}`,
		`data: {"choices":[{"index":0,"delta":{"content":" c"}}]}`,
		`data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"timings":{"cache_n":90,"prompt_n":10,"prompt_ms":1.5}}`,
		`data: [DONE]`)
	r, err := streamTurn(ctx, http.DefaultClient, s.URL, "s1", "u1", msgs, 4)
	if err != nil {
		t.Fatal(err)
	}
	if r.Reply != "ab c" || r.PromptN != 10 || r.CacheN != 90 || r.TTFT < 30*time.Millisecond || r.Total < r.TTFT {
		t.Fatalf("turn = %+v", r)
	}
	for name, events := range map[string][]string{
		"no timings": {`data: {"choices":[{"index":0,"delta":{"content":"x"}}]}`, `data: [DONE]`},
		"no [DONE]":  {`data: {"choices":[{"index":0,"delta":{"content":"x"}}],"timings":{"prompt_n":1}}`},
		"error":      {`data: {"error":{"message":"boom"}}`},
		"broken":     {`event: error`, `data: {"error":{"message":"upstream broke"}}`},
	} {
		s := sseServer(t, 200, 0, events...)
		if _, err := streamTurn(ctx, http.DefaultClient, s.URL, "s1", "u1", msgs, 4); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	s = sseServer(t, 502, 0, `{"error":{"message":"upstream unreachable"}}`)
	if _, err := streamTurn(ctx, http.DefaultClient, s.URL, "s1", "u1", msgs, 4); err == nil || !strings.Contains(err.Error(), "502") {
		t.Fatalf("HTTP 502: %v", err)
	}
}

func TestSessionDocsAreDistinctAndDeterministic(t *testing.T) {
	a, b := sessionDoc(1, 300), sessionDoc(2, 300)
	if a != sessionDoc(1, 300) {
		t.Fatal("the same seed gave another document")
	}
	// Distinct documents share no long prefix (beyond "Reference document ").
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	if n > 20 || len(strings.Fields(a)) < 300 {
		t.Fatalf("documents share %d bytes; %d words", n, len(strings.Fields(a)))
	}
	if sessionQuestion(1, 2) == sessionQuestion(1, 3) || sessionQuestion(1, 2) == sessionQuestion(2, 2) {
		t.Fatal("questions repeat")
	}
}

func TestSessionsReportRenders(t *testing.T) {
	r := SessionsReport{Sessions: 8, Rounds: 2, Slots: 2, DocTokens: 1500, CacheRAMMiB: 8, Model: "/x/tiny.gguf",
		RoundStats: []SessionsRound{
			{Round: 1, Direct: SessionsSide{Reprocessed: 12000}, Sidecar: SessionsSide{Reprocessed: 12000, Restores: -1, Saves: -1, RestoreMeanMs: -1, SaveMeanMs: -1}, Ratio: 1},
			{Round: 2, Event: "engine restart", Direct: SessionsSide{Reprocessed: 13000}, Sidecar: SessionsSide{Reprocessed: 900, Restores: 8, Saves: 8, Errors: 1, FirstError: "session 3: HTTP 502"}, Ratio: 0.069},
		},
		TTFT:  SessionsTTFT{RestoredTurns: 7, RestoredP50Ms: 40, RecomputedTurns: 8, RecomputedP50Ms: 200, Ratio: 0.2},
		Goals: []SessionsGoal{{Name: "round 2", Value: 0.069, Limit: 0.1, Met: false}},
	}
	var b bytes.Buffer
	if err := WriteSessionsTable(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"engine restart", "0.069", "n/a", "session 3: HTTP 502", "= 0.20", "NOT met"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := WriteSessionsSVG(&b, r); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	rects := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("SVG does not parse: %v", err)
			}
			break
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			rects++
		}
	}
	// Background, frame, two legend swatches and a bar per side and round.
	if rects != 4+2*len(r.RoundStats) || !strings.Contains(b.String(), "after engine restart") {
		t.Fatalf("%d rects in\n%s", rects, b.String())
	}
}

// Session orders: round-robin is the same every round; shuffled is a
// permutation that changes with the round and repeats with it.
func TestRoundOrder(t *testing.T) {
	if got := fmt.Sprint(roundOrder(OrderRoundRobin, 4, 3)); got != "[0 1 2 3]" {
		t.Fatalf("round-robin %s", got)
	}
	a, b := roundOrder(OrderShuffled, 8, 2), roundOrder(OrderShuffled, 8, 3)
	if fmt.Sprint(a) == fmt.Sprint(b) || fmt.Sprint(a) != fmt.Sprint(roundOrder(OrderShuffled, 8, 2)) {
		t.Fatalf("shuffled %v %v", a, b)
	}
	seen := map[int]bool{}
	for _, i := range a {
		seen[i] = true
	}
	if len(seen) != 8 {
		t.Fatalf("not a permutation: %v", a)
	}
	if err := (&SessionsOptions{Order: "random", RealParts: RealParts{SidecarCommand: []string{"x"}}}).validate(); err == nil {
		t.Fatal("unknown order accepted")
	}
}

// The returning-session line and the preload column.
func TestSessionsReportPreload(t *testing.T) {
	r := SessionsReport{Sessions: 8, Rounds: 2, Slots: 2, Order: OrderRoundRobin, FollowUp: true, PauseMs: 1000,
		RoundStats: []SessionsRound{{Round: 2, Sidecar: SessionsSide{Restores: 1, Preloads: 9, PreloadsUsed: 7, PreloadsWasted: 1}}},
		TTFT:       SessionsTTFT{ReturningTurns: 8, ReturningP50Ms: 50, ResidentTurns: 8, ResidentP50Ms: 45, ReturningRatio: 50.0 / 45, Preloaded: 7, RestoredOnPath: 1}}
	var b bytes.Buffer
	if err := WriteSessionsTable(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"9 (7, 1)", "7 preloaded, 1 restored on the request path", "= 1.11", "1000 ms before each question", "followed by a second question"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	before, after := Metrics{"x_total": 3}, Metrics{"x_total": 5}
	if counterDelta(before, after, "x_total") != 2 || counterDelta(after, Metrics{"x_total": 1}, "x_total") != 1 || counterDelta(before, after, "absent") != 0 {
		t.Fatal("counterDelta")
	}
}

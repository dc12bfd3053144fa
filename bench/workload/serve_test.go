package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/mockup"
	"github.com/tidwall/gjson"
)

// scriptedStream is an http.RoundTripper that answers every chat request
// with a stream written by script, in memory, so a test runs it inside a
// synctest bubble where the delays it sleeps are exact.
type scriptedStream struct {
	mu       sync.Mutex
	n        int           // requests seen
	inFlight int           // requests whose stream is not finished
	maxIn    int           // most in flight at once
	bodies   [][]byte      // request bodies, in arrival order
	headers  []http.Header // and headers
	sent     []time.Time   // and arrival times
	// script writes the n-th (1-based) request's stream to w.
	script func(n int, body []byte, w io.Writer)
}

func (s *scriptedStream) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.n++
	n := s.n
	s.inFlight++
	s.maxIn = max(s.maxIn, s.inFlight)
	s.bodies = append(s.bodies, body)
	s.headers = append(s.headers, req.Header.Clone())
	s.sent = append(s.sent, time.Now())
	s.mu.Unlock()
	pr, pw := io.Pipe()
	go func() {
		s.script(n, body, pw)
		pw.Close()
	}()
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: &countedBody{ReadCloser: pr, s: s}, Request: req}, nil
}

// countedBody ends its request's time in flight when the client closes it.
type countedBody struct {
	io.ReadCloser
	s    *scriptedStream
	once sync.Once
}

func (b *countedBody) Close() error {
	b.once.Do(func() {
		b.s.mu.Lock()
		b.s.inFlight--
		b.s.mu.Unlock()
	})
	return b.ReadCloser.Close()
}

func chunk(w io.Writer, content string) {
	fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", content)
}

// TestServeStatsKnownDelays: request n answers its first token after n×10
// ms, then three more tokens and the finish chunk 2 ms apart, then the
// usage; the figures are exactly what numpy computes on those delays.
func TestServeStatsKnownDelays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &scriptedStream{script: func(n int, _ []byte, w io.Writer) {
			if n > 1 { // the first is RunServe's test request
				time.Sleep(time.Duration(n-1) * 10 * time.Millisecond)
			}
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n")
			chunk(w, "a")
			for i := 0; i < 3; i++ {
				time.Sleep(2 * time.Millisecond)
				chunk(w, "b")
			}
			time.Sleep(2 * time.Millisecond)
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":60}}}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
		}}
		rep, err := RunServe(context.Background(), ServeOptions{
			Targets:       []ServeTarget{{Name: "scripted", URL: "http://scripted.invalid"}},
			Conversations: 100, Turns: 1, Concurrency: []int{1}, Model: "m",
			Client: &http.Client{Transport: tr},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Runs) != 1 {
			t.Fatalf("%d runs, want 1", len(rep.Runs))
		}
		r := rep.Runs[0]
		if r.Completed != 100 || r.Failed != 0 {
			t.Fatalf("completed %d, failed %d (%v)", r.Completed, r.Failed, r.Errors)
		}
		near := func(name string, got, want float64) {
			t.Helper()
			if math.Abs(got-want) > 1e-6 {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
		// TTFT: 10, 20, …, 1000 ms.
		near("mean TTFT", r.TTFT.Mean, 505)
		near("median TTFT", r.TTFT.Median, 505)
		near("p90 TTFT", r.TTFT.P90, 901)   // rank 89.1 between 900 and 910
		near("p99 TTFT", r.TTFT.P99, 990.1) // rank 98.01 between 990 and 1000
		near("std TTFT", r.TTFT.Std, math.Sqrt((100*100-1)/12.0)*10)
		// ITL: four gaps of 2 ms per request (three tokens and the finish
		// chunk, as vLLM counts every chunk with choices).
		near("mean ITL", r.ITL.Mean, 2)
		near("p99 ITL", r.ITL.P99, 2)
		// E2EL: TTFT + 8 ms; TPOT: 8 ms over 3 tokens after the first.
		near("median E2EL", r.E2EL.Median, 513)
		near("p90 E2EL", r.E2EL.P90, 909)
		near("mean TPOT", r.TPOT.Mean, 8.0/3)
		if r.TotalInputTokens != 100*100 || r.TotalOutputTokens != 400 || r.TotalCachedTokens != 6000 || r.CachedReported != 100 {
			t.Errorf("tokens: input %d, output %d, cached %d of %d requests", r.TotalInputTokens, r.TotalOutputTokens, r.TotalCachedTokens, r.CachedReported)
		}
		near("cached share", r.CachedShare, 0.6)
		// Sequential: the duration is the sum of the E2ELs.
		near("duration", r.Duration, (505+8)*100/1000.0)
		near("request throughput", r.RequestThroughput, 100/r.Duration)
		near("output throughput", r.OutputThroughput, 400/r.Duration)
	})
}

// TestServeConversationsAndConcurrency: each conversation sends its whole
// history with its own session id and the API key, turns of different
// conversations interleave, and the concurrency cap holds.
func TestServeConversationsAndConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &scriptedStream{script: func(n int, _ []byte, w io.Writer) {
			time.Sleep(10 * time.Millisecond)
			chunk(w, fmt.Sprintf("answer%d", n))
			fmt.Fprint(w, "data: [DONE]\n\n")
		}}
		rep, err := RunServe(context.Background(), ServeOptions{
			Targets:       []ServeTarget{{Name: "a", URL: "http://a.invalid/v1"}},
			Conversations: 10, Turns: 3, Concurrency: []int{3}, Model: "m", APIKey: "sk-test",
			ExtraBody: json.RawMessage(`{"grammar":"root ::= [a-z]+","temperature":0.5}`),
			Client:    &http.Client{Transport: tr}, RunID: "t",
		})
		if err != nil {
			t.Fatal(err)
		}
		r := rep.Runs[0]
		if r.Completed != 30 || r.Failed != 0 || r.MaxConcurrency != 3 {
			t.Fatalf("completed %d, failed %d, concurrency %d", r.Completed, r.Failed, r.MaxConcurrency)
		}
		if tr.maxIn != 3 {
			t.Errorf("at most %d requests in flight, want 3", tr.maxIn)
		}
		if r.TotalOutputTokens != 30 || r.CachedShare != -1 || r.CachedReported != 0 {
			t.Errorf("without usage: %d output tokens (one per text chunk), cached share %v", r.TotalOutputTokens, r.CachedShare)
		}
		bySession := map[string][][]byte{}
		var order []string
		for i, h := range tr.headers[1:] { // [0] is the test request
			if got := h.Get("Authorization"); got != "Bearer sk-test" {
				t.Fatalf("Authorization %q", got)
			}
			s := h.Get("X-Session-ID")
			bySession[s] = append(bySession[s], tr.bodies[i+1])
			order = append(order, s)
		}
		if len(bySession) != 10 {
			t.Fatalf("%d sessions, want 10", len(bySession))
		}
		// The first three waves of three requests are nine different
		// conversations' first turns (round-robin), not one conversation's
		// turns one after the other. (Within a wave the order is the
		// goroutines'.)
		first := map[string]bool{}
		for _, s := range order[:9] {
			first[s] = true
		}
		if len(first) != 9 {
			t.Errorf("the first nine requests came from %d conversations", len(first))
		}
		for s, bodies := range bySession {
			if len(bodies) != 3 {
				t.Fatalf("session %s sent %d turns", s, len(bodies))
			}
			for k, b := range bodies {
				msgs := gjson.GetBytes(b, "messages").Array()
				// system, then user/assistant pairs, then the new user message.
				if len(msgs) != 2+2*k || msgs[0].Get("role").String() != "system" || msgs[len(msgs)-1].Get("role").String() != "user" {
					t.Fatalf("session %s turn %d: messages %s", s, k, gjson.GetBytes(b, "messages").Raw)
				}
				if k > 0 {
					prev := gjson.GetBytes(bodies[k-1], "messages").Array()
					for i, m := range prev {
						if msgs[i].Raw != m.Raw {
							t.Fatalf("session %s turn %d changed message %d of its history", s, k, i)
						}
					}
					if a := msgs[len(msgs)-2]; a.Get("role").String() != "assistant" || !strings.HasPrefix(a.Get("content").String(), "answer") {
						t.Fatalf("session %s turn %d: the previous answer is missing: %s", s, k, a.Raw)
					}
				}
				if !strings.HasPrefix(msgs[0].Get("content").String(), "Conversation t-0-0-") {
					t.Fatalf("system message without the run's tag: %.60s", msgs[0].Get("content").String())
				}
				g := gjson.ParseBytes(b)
				if g.Get("grammar").String() != "root ::= [a-z]+" || g.Get("temperature").Float() != 0.5 ||
					!g.Get("stream").Bool() || !g.Get("stream_options.include_usage").Bool() || g.Get("max_tokens").Int() != 128 {
					t.Fatalf("body %s", b)
				}
			}
		}
	})
}

// TestServePoissonArrivals: at a request rate, the gaps between requests
// are exponential with the rate's mean (a fixed seed: no flake).
func TestServePoissonArrivals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &scriptedStream{script: func(_ int, _ []byte, w io.Writer) {
			chunk(w, "x")
			fmt.Fprint(w, "data: [DONE]\n\n")
		}}
		rep, err := RunServe(context.Background(), ServeOptions{
			Targets:       []ServeTarget{{Name: "a", URL: "http://a.invalid"}},
			Conversations: 500, Turns: 4, RequestRate: 20, Model: "m", Seed: 7,
			Client: &http.Client{Transport: tr},
		})
		if err != nil {
			t.Fatal(err)
		}
		sent := tr.sent[1:]
		var gaps []float64
		for i := 1; i < len(sent); i++ {
			gaps = append(gaps, sent[i].Sub(sent[i-1]).Seconds())
		}
		d := distOf(gaps)
		if len(gaps) != 1999 || math.Abs(d.Mean-0.05)/0.05 > 0.05 || math.Abs(d.Std/d.Mean-1) > 0.08 {
			t.Errorf("%d gaps, mean %.4f s (want 0.05), std/mean %.3f (want 1, exponential)", len(gaps), d.Mean, d.Std/d.Mean)
		}
		if r := rep.Runs[0]; math.Abs(r.RequestThroughput-20)/20 > 0.06 {
			t.Errorf("request throughput %.2f/s at rate 20/s", r.RequestThroughput)
		}
	})
}

// TestServeFailuresAreCounted: an error answer fails its request and ends
// its conversation; the others go on.
func TestServeFailuresAreCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &scriptedStream{script: func(n int, body []byte, w io.Writer) {
			if strings.Contains(string(body), "Conversation x-0-0-1.") {
				fmt.Fprint(w, "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n\n")
				return
			}
			chunk(w, "x")
			if !strings.Contains(string(body), "Conversation x-0-0-2.") { // this one never ends its stream
				fmt.Fprint(w, "data: [DONE]\n\n")
			}
		}}
		rep, err := RunServe(context.Background(), ServeOptions{
			Targets:       []ServeTarget{{Name: "a", URL: "http://a.invalid"}},
			Conversations: 3, Turns: 2, Model: "m", RunID: "x",
			Client: &http.Client{Transport: tr},
		})
		if err != nil {
			t.Fatal(err)
		}
		r := rep.Runs[0]
		if r.Completed != 2 || r.Failed != 2 || len(r.Errors) != 2 {
			t.Fatalf("completed %d, failed %d, errors %q", r.Completed, r.Failed, r.Errors)
		}
	})
}

// TestServeAgainstScriptedUpstream runs the benchmark over loopback
// against `sidecar bench upstream`'s mock, which reports usage.
func TestServeAgainstScriptedUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := mockup.New(mockup.Options{StreamEvents: 5})
	go func() { _ = up.Serve(ln) }()
	defer up.Close()
	rep, err := RunServe(context.Background(), ServeOptions{
		Targets:       []ServeTarget{{Name: "mock", URL: "http://" + ln.Addr().String()}},
		Conversations: 3, Turns: 2, Concurrency: []int{1, 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Model != "mock" || len(rep.Runs) != 2 {
		t.Fatalf("model %q, %d runs", rep.Model, len(rep.Runs))
	}
	for _, r := range rep.Runs {
		if r.Completed != 6 || r.Failed != 0 || r.TotalOutputTokens != 30 || r.TotalInputTokens <= 0 {
			t.Errorf("concurrency %d: completed %d, failed %d (%v), output %d, input %d", r.MaxConcurrency, r.Completed, r.Failed, r.Errors, r.TotalOutputTokens, r.TotalInputTokens)
		}
		if r.TTFT.Median <= 0 || r.E2EL.Median < r.TTFT.Median || r.CachedShare != -1 {
			t.Errorf("concurrency %d: TTFT %v, E2EL %v, cached share %v", r.MaxConcurrency, r.TTFT, r.E2EL, r.CachedShare)
		}
	}
	var sb strings.Builder
	if err := WriteServeTable(&sb, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sb.String(), "TTFT") || !strings.Contains(sb.String(), "n/a") {
		t.Errorf("table:\n%s", sb.String())
	}
	sb.Reset()
	if err := WriteServeSVG(&sb, rep); err != nil || !strings.HasSuffix(strings.TrimSpace(sb.String()), "</svg>") {
		t.Errorf("svg: %v", err)
	}
}

func TestServeShareGPT(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sg.json")
	data := `[
	  {"id":"a","conversations":[{"from":"system","value":"Be brief."},{"from":"human","value":"first question"},{"from":"gpt","value":"x"},{"from":"human","value":"second question"},{"from":"gpt","value":"y"}]},
	  {"id":"b","conversations":[{"from":"gpt","value":"no human here"}]},
	  {"id":"c","conversations":[{"from":"human","value":"only one"}]}
	]`
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	convs, err := LoadShareGPT(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(convs) != 2 || convs[0].System != "Be brief." || strings.Join(convs[0].Users, "|") != "first question|second question" || convs[1].Users[0] != "only one" {
		t.Fatalf("%+v", convs)
	}
	synctest.Test(t, func(t *testing.T) {
		tr := &scriptedStream{script: func(_ int, _ []byte, w io.Writer) {
			chunk(w, "ok")
			fmt.Fprint(w, "data: [DONE]\n\n")
		}}
		rep, err := RunServe(context.Background(), ServeOptions{
			Targets: []ServeTarget{{Name: "a", URL: "http://a.invalid"}}, Dataset: path, Model: "m", RunID: "s",
			Client: &http.Client{Transport: tr},
		})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Runs[0].Completed != 3 || rep.Requests != 3 || rep.Conversations != 2 {
			t.Fatalf("%+v", rep)
		}
		var users []string
		for _, b := range tr.bodies[1:] {
			msgs := gjson.GetBytes(b, "messages").Array()
			users = append(users, msgs[len(msgs)-1].Get("content").String())
		}
		all := strings.Join(users, "|")
		// A conversation without a system message carries the tag in its
		// first user message.
		for _, want := range []string{"first question", "second question", "Conversation s-0-0-"} {
			if !strings.Contains(all, want) {
				t.Errorf("sent user messages %q, want %q among them", all, want)
			}
		}
	})
	if _, err := LoadShareGPT(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("a missing file loaded")
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	_ = os.WriteFile(bad, []byte(`{"conversations":[]}`), 0o644)
	if _, err := LoadShareGPT(bad); err == nil {
		t.Error("an object instead of an array loaded")
	}
}

func TestServeOptionsAndJSON(t *testing.T) {
	for _, o := range []ServeOptions{
		{},
		{Targets: []ServeTarget{{Name: "a", URL: "127.0.0.1:8000"}}},
		{Targets: []ServeTarget{{Name: "a", URL: "http://x"}, {Name: "a", URL: "http://y"}}},
		{Targets: []ServeTarget{{Name: "a", URL: "http://x"}}, ExtraBody: json.RawMessage(`[1]`)},
		{Targets: []ServeTarget{{Name: "a", URL: "http://x"}}, Concurrency: []int{0}},
		{Targets: []ServeTarget{{Name: "a", URL: "http://x"}}, RequestRate: -1},
	} {
		if _, err := RunServe(context.Background(), o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if chatURL("http://h:1/v1/") != "http://h:1/v1/chat/completions" || chatURL("http://h:1") != "http://h:1/v1/chat/completions" {
		t.Error("chatURL")
	}
	r := ServeResult{Target: "t", TTFT: ServeDist{Mean: 1, P99: 9}, ITL: ServeDist{Median: 2}}
	b, err := json.Marshal(ServeReport{Runs: []ServeResult{r}})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"request_rate":"inf"`, `"mean_ttft_ms":1`, `"p99_ttft_ms":9`, `"median_itl_ms":2`, `"p90_e2el_ms":0`, `"std_tpot_ms":0`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("JSON %s lacks %s", b, k)
		}
	}
	var back ServeReport
	if err := json.Unmarshal(b, &back); err != nil || back.Runs[0].TTFT != r.TTFT || back.Runs[0].ITL != r.ITL || back.RequestRate != 0 {
		t.Errorf("round trip: %+v, %v", back, err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestServeStopsOnCancel: a cancelled context ends the run with its error
// and leaves no goroutine behind (the bubble would report it blocked).
func TestServeStopsOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		tr := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			first := calls.Add(1) == 1
			pr, pw := io.Pipe()
			go func() {
				if !first { // the test request answers at once
					select {
					case <-time.After(time.Second):
					case <-req.Context().Done():
						pw.CloseWithError(req.Context().Err())
						return
					}
				}
				chunk(pw, "x")
				fmt.Fprint(pw, "data: [DONE]\n\n")
				pw.Close()
			}()
			return &http.Response{StatusCode: 200, Body: pr, Request: req}, nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		defer cancel()
		_, err := RunServe(ctx, ServeOptions{
			Targets:       []ServeTarget{{Name: "a", URL: "http://a.invalid"}},
			Conversations: 4, Turns: 4, Concurrency: []int{2}, Model: "m",
			Client: &http.Client{Transport: tr},
		})
		if err != context.DeadlineExceeded {
			t.Fatalf("err %v, want the context's", err)
		}
	})
}

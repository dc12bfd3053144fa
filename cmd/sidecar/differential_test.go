package main

// The differential test (issue 20): the clients of one app as apps really
// call (differential_clients_test.go) — drop-in (system + newest user
// message + X-Session-ID) and full-history, streamed and not, with tool
// results, one API key for every end user and mostly no user id, some
// with X-User-ID — sent side by side to a real llama-server directly and
// to an identical one through the sidecar binary, on engines with small
// slots, each llama-server behind a recording proxy (bench/harness/recordup)
// that closes idle keep-alive connections after 1 s, the rounds 1.5 s
// apart, and both llama-servers killed with SIGKILL in the middle of a
// round (not after the sidecar's queue drained) and started again at once.
// One turn of two clients is refused once with 429 by the proxies; clients
// retry once after an error, as the openai SDKs do.
//
// It asserts what a user of the sidecar may expect:
//  1. every request that succeeds direct succeeds through the sidecar (a
//     request in flight between the kill and the engine's return may fail
//     on either side);
//  2. no request that reaches the engine holds the private words of two
//     end users, and no client request of one end user holds another's
//     (the sidecar's own background calls included); an end user is the
//     X-User-ID when sent, else the session;
//  3. the stored history (GET /v1/sessions/{id}) holds each acknowledged
//     user turn exactly once, the turn retried after the 429 included, and
//     no other turn more than once.
//
// Variants: --engine llamacpp on 2,048-token slots, --engine generic on
// 4,096-token slots; each llama-server on its own defaults (no
// --n-predict), -np 2, --cache-ram 8. Without llama-server the test skips,
// or fails under KVSIDECAR_REQUIRE_LLAMA=1.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
	"github.com/kvsidecar/kvsidecar/bench/harness/recordup"
	"github.com/kvsidecar/kvsidecar/bench/workload"
)

const (
	// diffRounds is the turns of each client; the rounds after the first
	// start 1.5 s after the previous one ended (past the proxies' 1 s idle
	// close).
	diffRounds = 6
	// diffKillRound is the round in whose middle both llama-servers die.
	diffKillRound = 4
	diffIdle      = 1500 * time.Millisecond
	// diffAPIKey is the app's one key, for all its end users.
	diffAPIKey = "sk-diff-one-key-for-the-whole-app"
)

// diffVariant is one engine setup.
type diffVariant struct {
	engine     string // the sidecar's --engine
	slotTokens int    // each llama-server slot's context
}

func TestDifferentialAgainstRealEngine(t *testing.T) {
	llamatest.Require(t)
	t.Parallel() // waits on engines and idle pauses: run beside the other real-engine tests
	if testing.Short() {
		t.Skip("a real-engine run of about a minute per variant")
	}
	for _, v := range []diffVariant{{"llamacpp", 2048}, {"generic", 4096}} {
		t.Run(fmt.Sprintf("%s-%d", v.engine, v.slotTokens), func(t *testing.T) { runDifferential(t, v) })
	}
}

// diffSide is one way to the engine: direct, or through the sidecar.
type diffSide struct {
	name   string
	llama  *llamaserver.Server
	rec    *recordup.Proxy
	client openai.Client
	hist   [][]openai.ChatCompletionMessageParamUnion // per client
	turns  [][]diffTurn                               // per client, per round
}

// turn plays one round of client i on the side: the request, and one retry
// after a retryable error.
func (s *diffSide) turn(c *diffClient, i, round int) {
	msgs := c.request(round, s.hist[i])
	var tr diffTurn
	for try := 0; try < 2; try++ {
		if try > 0 {
			time.Sleep(500 * time.Millisecond) // the SDKs' first backoff
		}
		a := diffAttempt{start: time.Now()}
		reply, err := c.send(context.Background(), s.client, msgs)
		a.end, a.err = time.Now(), err
		tr.attempts = append(tr.attempts, a)
		if err == nil {
			tr.ok = true
			if c.kind != diffDropIn {
				s.hist[i] = append(msgs, openai.AssistantMessage(reply))
			}
			break
		}
		if !diffRetryable(err) {
			break
		}
	}
	// A turn that failed twice is dropped: the app shows the error and the
	// conversation goes on without it.
	s.turns[i][round-1] = tr
}

func runDifferential(t *testing.T, v diffVariant) {
	ctx := context.Background()
	model := llamatest.Model(t)
	start := func(name string) *diffSide {
		l := llamatest.Start(t, llamaserver.Options{Model: model, Slots: 2, Ctx: 2 * v.slotTokens, CacheRAMMiB: 8, Threads: 1,
			LogFile: filepath.Join(t.TempDir(), name+"-llama-server.log")})
		rec, err := recordup.Start(recordup.Options{Upstream: l.URL(), IdleTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rec.Close() })
		return &diffSide{name: name, llama: l, rec: rec}
	}
	direct, via := start("direct"), start("sidecar")
	sides := []*diffSide{direct, via}

	logPath := filepath.Join(t.TempDir(), "sidecar.log")
	args := []string{"serve", "--listen", "127.0.0.1:0", "--upstream", via.rec.URL(), "--data-dir", t.TempDir(), "--engine", v.engine}
	if v.engine == "llamacpp" {
		args = append(args, "--llamacpp-slot-dir", via.llama.SlotDir(), "--llamacpp-slots", strconv.Itoa(via.llama.Slots()))
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_MAIN=1")
	cmd.SysProcAttr = launch.SysProcAttr()
	sc := startCmd(t, cmd, logPath)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sidecar log ends:\n%s", tail(sc.log(), 3000))
		}
	})
	direct.client = openai.NewClient(option.WithBaseURL(direct.rec.URL()+"/v1/"), option.WithAPIKey(diffAPIKey), option.WithMaxRetries(0))
	via.client = openai.NewClient(option.WithBaseURL("http://"+sc.addr+"/v1/"), option.WithAPIKey(diffAPIKey), option.WithMaxRetries(0))

	// Message sizes from the model's own tokens per character: drop-in
	// messages of a quarter of a slot (direct, system + message fit with
	// room; the conversation outgrows the slot by round 4), full-history
	// ones whose whole conversation, chat template included (about 40
	// tokens a message on this byte-level vocabulary), stays within about
	// 85% of a slot.
	sample := filler(1, 2000)
	n, err := direct.llama.Tokenize(ctx, sample)
	if err != nil {
		t.Fatal(err)
	}
	chars := func(tokens int) int { return tokens * len(sample) / n }
	sizes := diffSizes{system: chars(v.slotTokens / 8), dropIn: chars(v.slotTokens / 4), full: chars(v.slotTokens / 24),
		tools: chars(v.slotTokens / 64), toolsSystem: chars(v.slotTokens / 32)}
	clients := diffPopulation(fmt.Sprintf("%s-%d", v.engine, v.slotTokens), rand.New(rand.NewPCG(uint64(v.slotTokens), 20)), sizes)
	for _, s := range sides {
		s.hist = make([][]openai.ChatCompletionMessageParamUnion, len(clients))
		s.turns = make([][]diffTurn, len(clients))
		for i, c := range clients {
			s.hist[i] = []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(c.system)}
			s.turns[i] = make([]diffTurn, diffRounds)
		}
	}

	// The upstream refuses one turn of two clients once (429), on both
	// sides; the clients retry.
	for _, k := range [][2]int{{5, 2}, {1, 3}} { // (client, round)
		c, marker := clients[k[0]], clients[k[0]].marker(k[1])
		for _, s := range sides {
			s.rec.FailNext(func(r recordup.Request) bool {
				return r.Header.Get("X-Session-ID") == c.session && strings.Contains(string(r.Body), marker)
			}, http.StatusTooManyRequests, []byte(`{"error":{"message":"rate limited, retry","type":"rate_limit_error","code":"rate_limit_exceeded"}}`))
		}
	}

	t0 := time.Now()
	var killAt, readyAt time.Time
	for round := 1; round <= diffRounds; round++ {
		if round > 1 {
			time.Sleep(diffIdle) // a pause past the proxies' idle close
		}
		total := int32(len(sides) * len(clients))
		var finished atomic.Int32
		half := make(chan struct{})
		var halfOnce sync.Once
		killed := make(chan struct{})
		if round == diffKillRound {
			go func() {
				defer close(killed)
				<-half
				killAt = time.Now()
				for _, s := range sides {
					s.llama.Kill()
					s.rec.DropConns() // the dead server's connections die with it
				}
				for _, s := range sides {
					if err := s.llama.Restart(ctx); err != nil {
						t.Errorf("restart the %s llama-server: %v", s.name, err)
					}
				}
				readyAt = time.Now()
			}()
		} else {
			close(killed)
		}
		var wg sync.WaitGroup
		for _, s := range sides {
			for i, c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.turn(c, i, round)
					if finished.Add(1) >= total/2 {
						halfOnce.Do(func() { close(half) })
					}
				}()
			}
		}
		wg.Wait()
		halfOnce.Do(func() { close(half) })
		<-killed
		var ok [2]int
		for k, s := range sides {
			for i := range clients {
				if s.turns[i][round-1].ok {
					ok[k]++
				}
			}
		}
		t.Logf("round %d (%.1f s): direct %d/%d ok, sidecar %d/%d ok", round, time.Since(t0).Seconds(), ok[0], len(clients), ok[1], len(clients))
	}
	t.Logf("both llama-servers were killed (kill -9) in the middle of round %d, %.1f s into the run, and were back %.1f s later",
		diffKillRound, killAt.Sub(t0).Seconds(), readyAt.Sub(killAt).Seconds())

	checkDiffOutcomes(t, clients, direct, via, killAt, readyAt)
	checkDiffWords(t, clients, direct, via)
	checkDiffOwnCalls(t, clients, via)
	checkDiffHistory(t, clients, via, "http://"+sc.addr, killAt, readyAt)
}

// checkDiffOutcomes asserts that every turn that succeeded direct
// succeeded through the sidecar, but for turns in flight while the
// engines were down; and that the direct side itself only failed there
// (else the workload, not the sidecar, is wrong).
func checkDiffOutcomes(t *testing.T, clients []*diffClient, direct, via *diffSide, killAt, readyAt time.Time) {
	t.Helper()
	var worse, excused, directFailed []string
	for i, c := range clients {
		for r := range diffRounds {
			d, s := direct.turns[i][r], via.turns[i][r]
			what := fmt.Sprintf("%s (%s%s, %s) round %d", c.name, c.kind, streamText(c.stream), userText(c), r+1)
			if !d.ok {
				if d.overlaps(killAt, readyAt) {
					excused = append(excused, what+" direct: "+d.describe())
				} else {
					directFailed = append(directFailed, what+": "+d.describe())
				}
			}
			if d.ok && !s.ok {
				if s.overlaps(killAt, readyAt) {
					excused = append(excused, what+" through the sidecar: "+s.describe())
				} else {
					worse = append(worse, what+": "+s.describe())
				}
			}
		}
	}
	turns := len(clients) * diffRounds
	for _, side := range []*diffSide{direct, via} {
		failed := map[string]int{}
		for i := range clients {
			for _, tr := range side.turns[i] {
				for _, a := range tr.attempts {
					if a.err != nil {
						failed[errKind(a.err)]++
					}
				}
			}
		}
		if len(failed) > 0 {
			var kinds []string
			for k, n := range failed {
				kinds = append(kinds, fmt.Sprintf("%d× %s", n, k))
			}
			sort.Strings(kinds)
			t.Logf("%s: failed requests (retries included): %s", side.name, strings.Join(kinds, "; "))
		}
	}
	for _, e := range excused {
		t.Logf("failed while the engines were down (allowed): %s", e)
	}
	if len(directFailed) > 0 {
		t.Errorf("harness: %d of %d turns failed direct outside the engines' restart; the workload must fit the engine:\n  %s",
			len(directFailed), turns, strings.Join(directFailed, "\n  "))
	}
	if len(worse) > 0 {
		t.Errorf("never worse than direct: %d of %d turns succeeded direct and failed through the sidecar:\n  %s",
			len(worse), turns, strings.Join(worse, "\n  "))
	}
}

// checkDiffWords asserts that no request that reached an engine holds the
// private words of two end users, and no client request another end
// user's word; on the direct side the same holds by construction (a check
// of the harness).
func checkDiffWords(t *testing.T, clients []*diffClient, direct, via *diffSide) {
	t.Helper()
	owner := map[string]string{} // session → end user
	words := map[string]string{} // end user → word
	for _, c := range clients {
		owner[c.session] = c.endUser
		words[c.endUser] = c.word
	}
	for _, s := range []*diffSide{direct, via} {
		var mixed, foreign []string
		var clientReqs, ownReqs int
		for _, r := range s.rec.Requests() {
			var users []string
			for u, w := range words {
				if strings.Contains(string(r.Body), w) {
					users = append(users, u)
				}
			}
			sort.Strings(users)
			sess := r.Header.Get("X-Session-ID")
			from := owner[sess]
			if from != "" {
				clientReqs++
			} else {
				ownReqs++
			}
			what := fmt.Sprintf("#%d %s %s", r.Seq, r.Method, r.Path)
			if from != "" {
				what += " (a client request of " + from + ")"
			} else {
				what += " (the sidecar's own)"
			}
			if len(users) > 1 {
				mixed = append(mixed, what+": words of "+strings.Join(users, ", "))
			}
			if from != "" {
				for _, u := range users {
					if u != from {
						foreign = append(foreign, what+": a word of "+u)
						break
					}
				}
			}
		}
		t.Logf("%s: the engine got %d client requests and %d others", s.name, clientReqs, ownReqs)
		prefix := ""
		if s == direct {
			prefix = "harness: direct: "
		}
		if len(mixed) > 0 {
			t.Errorf("%s%d requests that reached the engine held the private words of two or more end users:\n  %s",
				prefix, len(mixed), strings.Join(firstN(mixed, 12), "\n  "))
		}
		if len(foreign) > 0 {
			t.Errorf("%s%d client requests reached the engine with another end user's private word:\n  %s",
				prefix, len(foreign), strings.Join(firstN(foreign, 12), "\n  "))
		}
	}
}

// checkDiffOwnCalls asserts that every generation the sidecar asks of the
// engine on its own (extraction, summaries, reviews, probes) bounds its
// length: a model that never ends an answer otherwise generates until the
// slot's context is full, on a slot the clients wait for.
func checkDiffOwnCalls(t *testing.T, clients []*diffClient, via *diffSide) {
	t.Helper()
	sessions := map[string]bool{}
	for _, c := range clients {
		sessions[c.session] = true
	}
	var unbounded []string
	own := 0
	for _, r := range via.rec.Requests() {
		gen, bounded := workload.Generation(r)
		if !gen || sessions[r.Header.Get("X-Session-ID")] {
			continue
		}
		own++
		if !bounded {
			unbounded = append(unbounded, fmt.Sprintf("#%d POST %s (%d bytes)", r.Seq, r.Path, len(r.Body)))
		}
	}
	t.Logf("the sidecar asked the engine for %d generations of its own", own)
	if len(unbounded) > 0 {
		t.Errorf("%d of the sidecar's own %d generations carry no max_tokens (nor n_predict):\n  %s",
			len(unbounded), own, strings.Join(firstN(unbounded, 8), "\n  "))
	}
}

// checkDiffHistory asserts that the sidecar's stored history of each
// session holds each acknowledged user turn once, and no turn the
// upstream refused (outside the engines' restart, where a reply cut short
// may be kept as partial).
func checkDiffHistory(t *testing.T, clients []*diffClient, via *diffSide, base string, killAt, readyAt time.Time) {
	t.Helper()
	var missing, doubled, refused []string
	for i, c := range clients {
		msgs, err := diffSessionMessages(base, c.session)
		if err != nil {
			t.Errorf("history of %s: %v", c.session, err)
			continue
		}
		for r := range diffRounds {
			marker, n := c.marker(r+1), 0
			for _, m := range msgs {
				if m.Role == "user" && strings.HasPrefix(strings.TrimSpace(m.Content), marker) {
					n++
				}
			}
			tr := via.turns[i][r]
			what := fmt.Sprintf("%s (%s) round %d (%s)", c.name, c.kind, r+1, tr.outcome())
			switch {
			case tr.ok && n == 0:
				missing = append(missing, what)
			case n > 1:
				doubled = append(doubled, fmt.Sprintf("%s: %d times", what, n))
			case !tr.ok && n > 0 && !tr.overlaps(killAt, readyAt):
				refused = append(refused, what)
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d acknowledged turns are missing from the stored history:\n  %s", len(missing), strings.Join(missing, "\n  "))
	}
	if len(doubled) > 0 {
		t.Errorf("%d turns are stored more than once:\n  %s", len(doubled), strings.Join(doubled, "\n  "))
	}
	if len(refused) > 0 {
		t.Errorf("%d turns the upstream refused (no answer, the client told so) are in the stored history:\n  %s",
			len(refused), strings.Join(firstN(refused, 12), "\n  "))
	}
}

// diffSessionMessages reads a session's stored messages from the sidecar.
func diffSessionMessages(base, session string) ([]struct{ Role, Content string }, error) {
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/sessions/"+url.PathEscape(session), nil)
	req.Header.Set("Authorization", "Bearer "+diffAPIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/sessions/%s: HTTP %d", session, resp.StatusCode)
	}
	var v struct {
		Messages []struct{ Role, Content string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return nil, err
	}
	return v.Messages, nil
}

func streamText(stream bool) string {
	if stream {
		return ", streamed"
	}
	return ""
}

func userText(c *diffClient) string {
	if c.user != "" {
		return "X-User-ID " + c.user
	}
	return "no user id"
}

// errKind is the class of a failed request: its status and code, or the
// client's error without details.
func errKind(err error) string {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		if apiErr.Code == "" || apiErr.Code == strconv.Itoa(apiErr.StatusCode) {
			return fmt.Sprintf("HTTP %d %s", apiErr.StatusCode, apiErr.Type)
		}
		return fmt.Sprintf("HTTP %d %s", apiErr.StatusCode, apiErr.Code)
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return "no answer (" + s + ")"
}

// oneLine is err on one line: an API error's class and message (the
// SDK's own text has only the status).
func oneLine(err error) string {
	if err == nil {
		return "ok"
	}
	s := err.Error()
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		s = errKind(err) + ": " + apiErr.Message
		if apiErr.Message == "" {
			s = errKind(err) + ": " + apiErr.RawJSON()
		}
	}
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 240 {
		s = s[:240] + "…"
	}
	return s
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("… and %d more", len(s)-n))
	}
	return s
}

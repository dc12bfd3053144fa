package workload

// A serving benchmark for the user's own deployment (`sidecar bench
// serve`): multi-turn conversations streamed to one or more
// OpenAI-compatible targets (e.g. the engine direct and a sidecar in front
// of it), at a request rate or a concurrency, reported with the figures of
// vLLM's benchmark_serving.py (serve_stats.go) so results compare.
//
// Each conversation is a client that sends its whole history every turn
// and appends the answer it got: turn k+1 leaves only after turn k's
// answer. Idle conversations wait in a FIFO queue, so turns of all
// conversations interleave round-robin, as users' turns do. Every
// conversation sends X-Session-ID and Authorization, so a sidecar keeps
// it as a session; an engine reached direct ignores both.
//
// Each (concurrency, target) run starts its conversations with a tag of
// its own ("Conversation <run>-<level>-<target>-<i>.") as the first words,
// so no run finds its prompts in a cache an earlier run (of another
// target) filled; otherwise the runs send the same text.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
)

// ServeTarget is one deployment to measure.
type ServeTarget struct {
	// Name labels the target in reports, e.g. "direct" or "sidecar".
	Name string
	// URL is its base URL: "http://host:port" or "http://host:port/v1";
	// requests go to <URL>/v1/chat/completions (one /v1, not two).
	URL string
}

// ServeOptions configure RunServe. Zero values are the documented
// defaults.
type ServeOptions struct {
	// Targets are measured one after the other, with the same workload.
	// At least one.
	Targets []ServeTarget
	// Dataset, when set, is a ShareGPT-format JSON file
	// ([{"conversations":[{"from":"human","value":…},{"from":"gpt",…}]}]):
	// its human turns are the users' messages (the gpt turns are not sent:
	// each turn's history holds the answers the target gave), a "system"
	// turn its system message. Empty: synthetic conversations.
	Dataset string
	// Conversations is how many conversations run. Zero: 16.
	Conversations int
	// Turns caps the user turns of each conversation. Zero: 4 for
	// synthetic conversations, every turn of a dataset's.
	Turns int
	// SystemWords is the length of a synthetic conversation's system
	// message (a document of its own), UserWords of each user message.
	// Zero: 300 and 20.
	SystemWords, UserWords int
	// MaxTokens is every request's max_tokens. Zero: 128.
	MaxTokens int
	// Model is every request's model. Empty: the first model the first
	// target's GET /v1/models lists, else "default".
	Model string
	// APIKey is sent as "Authorization: Bearer <APIKey>". Empty:
	// "bench-serve".
	APIKey string
	// ExtraBody is a JSON object merged into every request body; its keys
	// replace the benchmark's own (as vLLM's --extra-body), e.g.
	// {"grammar":"root ::= [a-z ]+"} for a random-weight model. Empty:
	// none.
	ExtraBody json.RawMessage
	// RequestRate is the mean request arrival rate (requests/s, Poisson:
	// exponential gaps); an arrival takes the next idle conversation's next
	// turn, waiting for one when none is idle. Zero: no pacing (every
	// request leaves as soon as a conversation and the concurrency allow).
	RequestRate float64
	// Concurrency lists the caps on requests in flight, one run per value
	// and target (a sweep). Empty: one run without a cap (every
	// conversation in flight at once, unless RequestRate paces them).
	Concurrency []int
	// Seed makes the synthetic conversations, the dataset's sample and the
	// arrival times reproducible. Zero: 1.
	Seed uint64
	// RunID distinguishes this invocation's conversations (their tag and
	// session ids) from an earlier one's against the same deployment.
	// Empty: derived from the clock.
	RunID string
	// RequestTimeout bounds one request, to the end of its stream. Zero:
	// 10 minutes.
	RequestTimeout time.Duration
	// Client sends the requests. Nil: a client per target with a
	// keep-alive pool as large as the concurrency, whose idle connections
	// close after 4 s (below llama-server's and uvicorn's 5 s, so no
	// request is written to a connection the server is closing).
	Client *http.Client
	// Progress receives one line per run. Nil: none.
	Progress io.Writer
}

func (o *ServeOptions) setDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Conversations, 16)
	if o.Dataset == "" {
		def(&o.Turns, 4)
	}
	def(&o.SystemWords, 300)
	def(&o.UserWords, 20)
	def(&o.MaxTokens, 128)
	if o.APIKey == "" {
		o.APIKey = "bench-serve"
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.RunID == "" {
		o.RunID = strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 10 * time.Minute
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

func (o *ServeOptions) validate() error {
	switch {
	case len(o.Targets) == 0:
		return errors.New("bench: serve: no target")
	case o.Conversations < 1 || o.Conversations > 100_000:
		return fmt.Errorf("bench: serve: %d conversations (1 to 100000)", o.Conversations)
	case o.Turns < 0 || o.SystemWords < 0 || o.UserWords < 1 || o.MaxTokens < 1 || o.RequestTimeout < 0:
		return errors.New("bench: serve: negative or zero option")
	case o.RequestRate < 0 || math.IsNaN(o.RequestRate):
		return fmt.Errorf("bench: serve: request rate %v", o.RequestRate)
	}
	for _, c := range o.Concurrency {
		if c < 1 {
			return fmt.Errorf("bench: serve: concurrency %d (at least 1)", c)
		}
	}
	for i, t := range o.Targets {
		if !strings.HasPrefix(t.URL, "http://") && !strings.HasPrefix(t.URL, "https://") {
			return fmt.Errorf("bench: serve: target %q: want an http:// or https:// URL", t.URL)
		}
		for _, u := range o.Targets[:i] {
			if u.Name == t.Name {
				return fmt.Errorf("bench: serve: two targets named %q", t.Name)
			}
		}
	}
	if len(o.ExtraBody) > 0 {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(o.ExtraBody, &m); err != nil || m == nil {
			return fmt.Errorf("bench: serve: extra body is not a JSON object: %.80s", o.ExtraBody)
		}
	}
	return nil
}

// chatURL is the chat completions endpoint under a target's base URL.
func chatURL(base string) string {
	base = strings.TrimRight(base, "/")
	if strings.HasSuffix(base, "/v1") {
		return base + "/chat/completions"
	}
	return base + "/v1/chat/completions"
}

// serveConv is one conversation of the workload: its system message
// (possibly empty) and its users' messages.
type serveConv struct {
	System string
	Users  []string
}

// serveWorkload returns the conversations of o: synthetic, or sampled from
// the dataset (shuffled with the seed, as vLLM samples ShareGPT).
func serveWorkload(o ServeOptions) ([]serveConv, error) {
	rng := rand.New(rand.NewPCG(o.Seed, 0x5e7e))
	if o.Dataset == "" {
		convs := make([]serveConv, o.Conversations)
		for i := range convs {
			c := &convs[i]
			if o.SystemWords > 0 {
				c.System = sessionDoc(o.Seed*1_000_003+uint64(i), o.SystemWords)
			}
			for t := 0; t < o.Turns; t++ {
				c.Users = append(c.Users, serveQuestion(rng, o.UserWords))
			}
		}
		return convs, nil
	}
	all, err := LoadShareGPT(o.Dataset)
	if err != nil {
		return nil, err
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	if len(all) > o.Conversations {
		all = all[:o.Conversations]
	}
	for i := range all {
		if o.Turns > 0 && len(all[i].Users) > o.Turns {
			all[i].Users = all[i].Users[:o.Turns]
		}
	}
	return all, nil
}

// serveQuestion is a synthetic user message of about words words.
func serveQuestion(rng *rand.Rand, words int) string {
	var b strings.Builder
	b.WriteString("Tell me about")
	for i := 0; i < words-3; i++ {
		b.WriteByte(' ')
		b.WriteString(sessionsWords[rng.IntN(len(sessionsWords))])
	}
	b.WriteByte('?')
	return b.String()
}

// LoadShareGPT reads a ShareGPT-format file: a JSON array of objects with
// "conversations": [{"from": "human"|"user"|"gpt"|"system"|…, "value":
// …}]. It keeps each conversation's human (or user) turns and its first
// system turn, and drops conversations without a human turn. The array is
// decoded element by element, so a large file (ShareGPT V3 is 650 MB) is
// never held whole.
func LoadShareGPT(path string) ([]serveConv, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: sharegpt: %w", err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return nil, fmt.Errorf("bench: sharegpt: %s: want a JSON array of conversations", path)
	}
	var out []serveConv
	for n := 0; dec.More(); n++ {
		var item struct {
			Conversations []struct {
				From  string `json:"from"`
				Value string `json:"value"`
			} `json:"conversations"`
		}
		if err := dec.Decode(&item); err != nil {
			return nil, fmt.Errorf("bench: sharegpt: %s: item %d: %w", path, n, err)
		}
		var c serveConv
		for _, m := range item.Conversations {
			switch strings.ToLower(m.From) {
			case "human", "user":
				if strings.TrimSpace(m.Value) != "" {
					c.Users = append(c.Users, m.Value)
				}
			case "system":
				if c.System == "" {
					c.System = m.Value
				}
			}
		}
		if len(c.Users) > 0 {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bench: sharegpt: %s: no conversation with a human turn", path)
	}
	return out, nil
}

// ServeReport is the outcome of RunServe: one result per (concurrency,
// target), in the order they ran.
type ServeReport struct {
	Model         string        `json:"model"`
	Conversations int           `json:"conversations"`
	Requests      int           `json:"num_prompts"` // requests per run (every turn of every conversation)
	Dataset       string        `json:"dataset"`     // "synthetic" or the file
	MaxTokens     int           `json:"max_tokens"`
	RequestRate   Rate          `json:"request_rate"`
	Seed          uint64        `json:"seed"`
	Runs          []ServeResult `json:"runs"`
	Seconds       float64       `json:"seconds"`
}

// Rate is a request rate in requests/s; zero means none (no pacing) and is
// written "inf" in JSON, as vLLM writes it.
type Rate float64

// MarshalJSON writes the rate, or "inf" for none.
func (r Rate) MarshalJSON() ([]byte, error) {
	if r == 0 {
		return []byte(`"inf"`), nil
	}
	return json.Marshal(float64(r))
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Rate) UnmarshalJSON(b []byte) error {
	if string(b) == `"inf"` {
		*r = 0
		return nil
	}
	return json.Unmarshal(b, (*float64)(r))
}

// RunServe measures every target at every concurrency with the same
// workload.
func RunServe(ctx context.Context, o ServeOptions) (ServeReport, error) {
	o.setDefaults()
	if err := o.validate(); err != nil {
		return ServeReport{}, err
	}
	t0 := time.Now()
	convs, err := serveWorkload(o)
	if err != nil {
		return ServeReport{}, err
	}
	total := 0
	for _, c := range convs {
		total += len(c.Users)
	}
	levels := o.Concurrency
	if len(levels) == 0 {
		levels = []int{0}
	}
	clients := make([]*http.Client, len(o.Targets))
	for i := range clients {
		clients[i] = o.Client
		if clients[i] == nil {
			clients[i] = newServeClient(max(slicesMax(levels), len(convs)))
			defer clients[i].CloseIdleConnections()
		}
	}
	if o.Model == "" {
		o.Model = discoverModel(ctx, clients[0], o.Targets[0].URL)
	}
	extra := map[string]json.RawMessage{}
	if len(o.ExtraBody) > 0 {
		_ = json.Unmarshal(o.ExtraBody, &extra) // validated
	}
	// One test request per target first, as vLLM's initial test run: a
	// misconfigured target fails fast with its own error.
	for i, t := range o.Targets {
		probe := []chatMsg{{Role: "user", Content: "Say hello."}}
		res := sendTurn(ctx, clients[i], t.URL, o, extra, "bench-serve-"+o.RunID+"-probe", probe)
		if res.Err != nil {
			return ServeReport{}, fmt.Errorf("bench: serve: target %s (%s): test request failed: %w", t.Name, t.URL, res.Err)
		}
	}
	rep := ServeReport{Model: o.Model, Conversations: len(convs), Requests: total, Dataset: "synthetic",
		MaxTokens: o.MaxTokens, RequestRate: Rate(o.RequestRate), Seed: o.Seed}
	if o.Dataset != "" {
		rep.Dataset = o.Dataset
	}
	for li, conc := range levels {
		for ti, t := range o.Targets {
			tag := fmt.Sprintf("%s-%d-%d", o.RunID, li, ti)
			r := runServeLevel(ctx, clients[ti], t, o, extra, convs, conc, tag)
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			rep.Runs = append(rep.Runs, r)
			fmt.Fprintf(o.Progress, "bench serve: %s, concurrency %s: %d/%d requests in %.1f s, TTFT p50 %.1f ms, ITL p50 %.1f ms, %.1f output tokens/s\n",
				t.Name, concText(conc), r.Completed, r.Completed+r.Failed, r.Duration, r.TTFT.Median, r.ITL.Median, r.OutputThroughput)
		}
	}
	rep.Seconds = time.Since(t0).Seconds()
	return rep, nil
}

func slicesMax(v []int) int {
	m := 0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func concText(c int) string {
	if c == 0 {
		return "unbounded"
	}
	return strconv.Itoa(c)
}

// newServeClient is the default client: a keep-alive pool of conns
// connections per host, idle ones closed after 4 s, no compression (a
// gzip reader would hold back events).
func newServeClient(conns int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 0
	tr.MaxIdleConnsPerHost = max(conns, 2)
	tr.IdleConnTimeout = 4 * time.Second
	tr.DisableCompression = true
	return &http.Client{Transport: tr}
}

// discoverModel returns the first model GET <base>/v1/models lists, or
// "default" when it lists none or fails (llama-server answers any name).
func discoverModel(ctx context.Context, c *http.Client, base string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	u := strings.TrimSuffix(chatURL(base), "/chat/completions") + "/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "default"
	}
	resp, err := c.Do(req)
	if err != nil {
		return "default"
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return "default"
	}
	if id := gjson.GetBytes(b, "data.0.id").String(); id != "" {
		return id
	}
	return "default"
}

// convState is one conversation during a run: its history so far.
type convState struct {
	session string
	msgs    []chatMsg
	users   []string // the user messages still to send
}

// runServeLevel runs every conversation against one target with at most
// conc requests in flight (0: no cap) and returns the figures.
func runServeLevel(ctx context.Context, c *http.Client, t ServeTarget, o ServeOptions, extra map[string]json.RawMessage,
	convs []serveConv, conc int, tag string) ServeResult {
	states := make([]*convState, len(convs))
	idle := make(chan int, len(convs)) // conversations ready for their next turn, FIFO
	// allDone closes when the last conversation ended (all its turns sent,
	// or one failed).
	allDone := make(chan struct{})
	var active atomic.Int64
	active.Store(int64(len(convs)))
	ended := func() {
		if active.Add(-1) == 0 {
			close(allDone)
		}
	}
	for i, cv := range convs {
		st := &convState{session: fmt.Sprintf("bench-serve-%s-%d", tag, i), users: cv.Users}
		head := fmt.Sprintf("Conversation %s-%d.", tag, i)
		if cv.System != "" {
			st.msgs = append(st.msgs, chatMsg{Role: "system", Content: head + " " + cv.System})
		} else {
			st.users = append([]string{head + " " + cv.Users[0]}, cv.Users[1:]...)
		}
		states[i] = st
		idle <- i
	}

	var sem chan struct{}
	if conc > 0 {
		sem = make(chan struct{}, conc)
	}
	arrivals := rand.New(rand.NewPCG(o.Seed, 0xa77))
	var (
		mu      sync.Mutex
		results []turnRecord
		reqWG   sync.WaitGroup
	)
	start := time.Now()
	next := start
loop:
	for sent := 0; ; sent++ {
		if o.RequestRate > 0 && sent > 0 {
			// Poisson arrivals on an absolute schedule, the first at once
			// (as vLLM sends them): an arrival that waited (no idle
			// conversation, the cap reached) does not delay the ones after
			// it.
			next = next.Add(time.Duration(arrivals.ExpFloat64() / o.RequestRate * float64(time.Second)))
			if d := time.Until(next); d > 0 {
				select {
				case <-time.After(d):
				case <-allDone:
					break loop
				case <-ctx.Done():
					break loop
				}
			}
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				break loop
			}
		}
		var i int
		select {
		case i = <-idle:
		case <-allDone:
			break loop
		case <-ctx.Done():
			break loop
		}
		reqWG.Add(1)
		go func() {
			defer reqWG.Done()
			st := states[i]
			msgs := append(st.msgs, chatMsg{Role: "user", Content: st.users[0]})
			rec := sendTurn(ctx, c, t.URL, o, extra, st.session, msgs)
			if sem != nil {
				<-sem
			}
			mu.Lock()
			results = append(results, rec)
			mu.Unlock()
			if rec.Err != nil {
				ended() // a conversation whose turn failed ends there
				return
			}
			st.msgs = append(msgs, chatMsg{Role: "assistant", Content: rec.Reply})
			st.users = st.users[1:]
			if len(st.users) == 0 {
				ended()
				return
			}
			idle <- i
		}()
	}
	reqWG.Wait()
	dur := time.Since(start)
	r := serveMetrics(results, dur)
	r.Target, r.URL, r.MaxConcurrency, r.RequestRate = t.Name, t.URL, conc, Rate(o.RequestRate)
	return r
}

package bench

// Memory end to end: LoCoMo conversations replayed through a running
// sidecar whose upstream is the scripted MockUpstream (it answers each user
// message with the other speaker's recorded turns), then LoCoMo's questions
// asked the same way. Context recall is the share of a question's evidence
// turns whose text is in the prompt the upstream receives.

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/memory"
)

// MemoryOptions configure RunMemory.
type MemoryOptions struct {
	// Data is a LoCoMo-format JSON file. Required.
	Data string
	// Sidecar is the base URL of the running sidecar. Required.
	Sidecar string
	// Upstream is the sidecar's upstream, made with KeepPrompts. Required.
	Upstream *MockUpstream
	// Model is the requests' model. Empty: "locomo-replay" (cl100k_base).
	Model string
	// WindowTokens is the sidecar's window limit, for the trimming
	// baseline. Zero: 8192.
	WindowTokens int
	// QuestionsPerReplay: the drop-in, full-history and trimming clients
	// ask their questions in the replayed session itself, one after the
	// other, so each question and its answer stay in the history the next
	// question sees (as a user asking them would). With N > 0 the
	// conversation is replayed into a new session (and user) every N
	// questions, which bounds that drift. Zero: all questions after one
	// replay.
	QuestionsPerReplay int
	// Conversations limits the conversations replayed. Zero: all.
	Conversations int
	// Settle is how long the cross-session client waits after its replay
	// before asking (the sidecar indexes a turn just after its response).
	// Zero: 1s.
	Settle time.Duration
	// Progress, when set, receives a line per replay.
	Progress io.Writer
}

// MemoryReport is the outcome of RunMemory. Percentages are 0..100.
type MemoryReport struct {
	Data               string `json:"data"`
	Model              string `json:"model"`
	WindowTokens       int    `json:"window_tokens"`
	QuestionsPerReplay int    `json:"questions_per_replay"`
	Conversations      int    `json:"conversations"`
	Turns              int    `json:"turns"` // client turns of one replay of every conversation
	Questions          int    `json:"questions"`
	// Clients: "drop-in" (system + newest message, no mode header),
	// "full-history", "cross-session" (each question in a new session of
	// the same user) and "trimming" (a full-history client behind a proxy
	// that keeps the newest messages that fit the window; computed, not
	// served).
	Clients []MemoryClient `json:"clients"`
	// Prefix is, per replay client, how each prompt shares the previous
	// prompt's start.
	Prefix map[string]PrefixReport `json:"prefix"`
	// IndexRecall is the index's own evidence recall (RunRecall, hybrid),
	// k → %, and per category.
	IndexRecall           map[string]float64            `json:"index_recall"`
	IndexRecallByCategory map[string]map[string]float64 `json:"index_recall_by_category"`
	// Sidecar figures from /metrics after the run.
	Requests           int            `json:"requests"`
	DetectedAppends    int64          `json:"detected_appends"`
	ClientTurns        int64          `json:"client_turns"`
	BackgroundCalls    int64          `json:"background_calls"`
	CallsPerTurn       float64        `json:"background_calls_per_turn"`
	BackgroundByModel  map[string]int `json:"background_calls_by_model"`
	Seconds            float64        `json:"seconds"`
	CategoryQuestions  map[string]int `json:"category_questions"`
	UnknownEvidenceIDs int            `json:"unknown_evidence_ids"`
}

// MemoryClient is one client's context recall.
type MemoryClient struct {
	Name      string `json:"name"`
	Questions int    `json:"questions"`
	// ContextRecall is the mean share of a question's evidence turns found
	// in the prompt; AllEvidence the share of questions with every
	// evidence turn there.
	ContextRecall float64            `json:"context_recall"`
	AllEvidence   float64            `json:"all_evidence"`
	ByCategory    map[string]float64 `json:"by_category"`
	// PromptTokens is the mean prompt size of its questions.
	PromptTokens float64 `json:"prompt_tokens"`
}

// PrefixReport describes consecutive prompts of one session: how many
// tokens of the previous prompt the new one repeats from its start (whole
// messages, byte for byte), over the turns where nothing left the window
// (the previous prompt, its recall block aside, leads the new one).
type PrefixReport struct {
	Turns     int `json:"turns"`
	Stable    int `json:"stable_turns"`   // nothing left the window
	Evictions int `json:"eviction_turns"` // history left the window
	// SharedPct is Σ shared / Σ previous prompt tokens over stable turns;
	// MeanPct, P10Pct and MinPct describe the per-turn shares.
	SharedPct float64 `json:"shared_pct"`
	MeanPct   float64 `json:"mean_pct"`
	P10Pct    float64 `json:"p10_pct"`
	MinPct    float64 `json:"min_pct"`
	// SharedTokens is the mean shared prefix per stable turn, of prompts
	// of PromptTokens on average.
	SharedTokens float64 `json:"shared_tokens"`
	PromptTokens float64 `json:"prompt_tokens"`
}

const memorySystem = "You are a helpful assistant in a long-running chat. Answer briefly."

// replayTurn is one client turn of a replay: the user's message and the
// reply the scripted upstream gives.
type replayTurn struct{ user, reply string }

// locomoReplay turns a conversation into client turns: speaker A is the
// user, speaker B the assistant; consecutive turns of one speaker form one
// message; the first message of each LoCoMo session starts with its date.
func locomoReplay(c LocomoConversation) []replayTurn {
	a := c.SpeakerA
	if a == "" && len(c.Turns) > 0 {
		a = c.Turns[0].Speaker
	}
	var out []replayTurn
	var user, reply []string
	flush := func() {
		if len(user) == 0 && len(reply) == 0 {
			return
		}
		t := replayTurn{user: strings.Join(user, "\n"), reply: strings.Join(reply, "\n")}
		if t.reply == "" {
			t.reply = "I see."
		}
		out = append(out, t)
		user, reply = nil, nil
	}
	session := -1
	for _, t := range c.Turns {
		if t.Session != session {
			flush()
			session = t.Session
			if d := c.SessionTimes[session]; d != "" {
				user = append(user, "("+d+")")
			}
		}
		text := LocomoTurnText(t, true, true)
		if t.Speaker == a {
			if len(reply) > 0 {
				flush()
			}
			user = append(user, text)
		} else {
			reply = append(reply, text)
		}
	}
	flush()
	return out
}

type memMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// memRun is the state of one RunMemory.
type memRun struct {
	o        MemoryOptions
	http     *http.Client
	tok      *memory.Tokenizer
	enc      memory.Encoding
	requests int
}

// chat sends one chat request in session for user and returns the prompt
// the upstream received.
func (r *memRun) chat(session, user string, msgs []memMsg, reply string) ([]byte, error) {
	body, err := json.Marshal(struct {
		Model    string   `json:"model"`
		Messages []memMsg `json:"messages"`
	}{r.o.Model, msgs})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPost, r.o.Sidecar+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer bench-memory")
	req.Header.Set("X-Session-ID", session)
	req.Header.Set("X-User-ID", user)
	req.Header.Set(ReplyHeader, base64.RawURLEncoding.EncodeToString([]byte(reply)))
	resp, err := r.http.Do(req)
	if err != nil {
		return nil, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r.requests++
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: memory: %s: status %d: %.300s", session, resp.StatusCode, b)
	}
	p := r.o.Upstream.LastPrompt(session)
	if p == nil {
		return nil, fmt.Errorf("bench: memory: %s: the upstream saw no prompt", session)
	}
	return p, nil
}

// promptInfo decodes a prompt: its messages' raw bytes, texts, and tokens.
type promptInfo struct {
	raws   []json.RawMessage
	text   string // every message's content, one per line
	tokens []int
	block  int // index of the recall block, -1 when none
}

func (r *memRun) parsePrompt(p []byte) (promptInfo, error) {
	info := promptInfo{block: -1}
	if err := json.Unmarshal(p, &info.raws); err != nil {
		return info, fmt.Errorf("bench: memory: prompt: %w", err)
	}
	msgs, err := memory.ParseMessages(p)
	if err != nil {
		return info, err
	}
	var b strings.Builder
	for i := range msgs {
		b.WriteString(msgs[i].Content)
		b.WriteByte('\n')
		info.tokens = append(info.tokens, r.tok.MessageTokens(r.enc, &msgs[i]))
		if msgs[i].Role == "system" && strings.HasPrefix(msgs[i].Content, memory.RecallBlockPrefix) {
			info.block = i
		}
	}
	info.text = b.String()
	return info, nil
}

// prefixAcc accumulates PrefixReport.
type prefixAcc struct {
	rep          PrefixReport
	shared, prev float64
	shares       []float64
	prevPrompt   *promptInfo
}

func (a *prefixAcc) add(cur promptInfo) {
	prev := a.prevPrompt
	a.prevPrompt = &cur
	if prev == nil {
		return
	}
	a.rep.Turns++
	// Nothing left the window when the previous prompt, its recall block
	// aside, leads the new one message for message.
	j := 0
	stable := true
	for i, raw := range prev.raws {
		if i == prev.block {
			continue
		}
		if j >= len(cur.raws) || !bytes.Equal(raw, cur.raws[j]) {
			stable = false
			break
		}
		j++
	}
	if !stable {
		a.rep.Evictions++
		return
	}
	a.rep.Stable++
	shared, total := 0, 0
	for i, raw := range prev.raws {
		total += prev.tokens[i]
		if i == shared && i < len(cur.raws) && bytes.Equal(raw, cur.raws[i]) {
			shared++
		}
	}
	sharedTok := 0
	for _, t := range prev.tokens[:shared] {
		sharedTok += t
	}
	a.shared += float64(sharedTok)
	a.prev += float64(total)
	a.shares = append(a.shares, 100*float64(sharedTok)/float64(max(total, 1)))
}

func (a *prefixAcc) report() PrefixReport {
	rep := a.rep
	if len(a.shares) > 0 {
		rep.SharedPct = recallRound1(100 * a.shared / a.prev)
		s := slices.Clone(a.shares)
		slices.Sort(s)
		sum := 0.0
		for _, v := range s {
			sum += v
		}
		rep.MeanPct = recallRound1(sum / float64(len(s)))
		rep.P10Pct = recallRound1(s[len(s)/10])
		rep.MinPct = recallRound1(s[0])
		rep.SharedTokens = recallRound1(a.shared / float64(len(s)))
		rep.PromptTokens = recallRound1(a.prev / float64(len(s)))
	}
	return rep
}

// recallAcc accumulates one client's context recall.
type recallAcc struct {
	n, all int
	sum    float64
	tokens float64
	byCat  map[string][2]float64 // Σ recall, n
}

func newRecallAcc() *recallAcc { return &recallAcc{byCat: map[string][2]float64{}} }

func (a *recallAcc) add(q LocomoQA, evidence map[string]string, prompt promptInfo) {
	found := 0
	for _, id := range q.Evidence {
		if t, ok := evidence[id]; ok && strings.Contains(prompt.text, t) {
			found++
		}
	}
	f := float64(found) / float64(len(q.Evidence))
	a.n++
	a.sum += f
	if found == len(q.Evidence) {
		a.all++
	}
	for _, t := range prompt.tokens {
		a.tokens += float64(t)
	}
	cat := LocomoCategoryName(q.Category)
	c := a.byCat[cat]
	a.byCat[cat] = [2]float64{c[0] + f, c[1] + 1}
}

func (a *recallAcc) client(name string) MemoryClient {
	mc := MemoryClient{Name: name, Questions: a.n, ByCategory: map[string]float64{}}
	if a.n > 0 {
		mc.ContextRecall = recallRound1(100 * a.sum / float64(a.n))
		mc.AllEvidence = recallRound1(100 * float64(a.all) / float64(a.n))
		mc.PromptTokens = recallRound1(a.tokens / float64(a.n))
	}
	for cat, c := range a.byCat {
		mc.ByCategory[cat] = recallRound1(100 * c[0] / c[1])
	}
	return mc
}

// RunMemory replays every conversation of o.Data through the sidecar with
// each client and reports context recall, prompt prefix sharing and the
// sidecar's own calls.
func RunMemory(o MemoryOptions) (MemoryReport, error) {
	if o.Data == "" || o.Sidecar == "" || o.Upstream == nil || !o.Upstream.opts.KeepPrompts {
		return MemoryReport{}, errors.New("bench: memory: Data, Sidecar and an Upstream with KeepPrompts are required")
	}
	if o.Model == "" {
		o.Model = "locomo-replay"
	}
	if o.WindowTokens == 0 {
		o.WindowTokens = 8192
	}
	if o.Settle == 0 {
		o.Settle = time.Second
	}
	o.Sidecar = strings.TrimSuffix(o.Sidecar, "/")
	convs, err := LoadLocomo(o.Data)
	if err != nil {
		return MemoryReport{}, err
	}
	if o.Conversations > 0 && o.Conversations < len(convs) {
		convs = convs[:o.Conversations]
	}
	r := &memRun{o: o, http: &http.Client{Timeout: 2 * time.Minute}, tok: memory.NewTokenizer(1 << 17), enc: memory.EncodingForModel(o.Model)}
	if err := r.tok.Load(r.enc); err != nil {
		return MemoryReport{}, err
	}
	start := time.Now()
	rep := MemoryReport{Data: o.Data, Model: o.Model, WindowTokens: o.WindowTokens, QuestionsPerReplay: o.QuestionsPerReplay,
		Conversations: len(convs), Prefix: map[string]PrefixReport{}, CategoryQuestions: map[string]int{}}
	accs := map[string]*recallAcc{}
	names := []string{"drop-in", "full-history", "cross-session", "trimming"}
	for _, n := range names {
		accs[n] = newRecallAcc()
	}
	prefixes := map[string]*prefixAcc{"drop-in": {}, "full-history": {}}
	sys := memMsg{"system", memorySystem}
	progress := func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, format+"\n", args...)
		}
	}

	for _, c := range convs {
		turns := locomoReplay(c)
		rep.Turns += len(turns)
		evidence := map[string]string{}
		for _, t := range c.Turns {
			evidence[t.DiaID] = LocomoTurnText(t, true, true)
		}
		var qs []LocomoQA
		for _, q := range c.QA {
			if len(q.Evidence) == 0 {
				continue
			}
			qs = append(qs, q)
			rep.CategoryQuestions[LocomoCategoryName(q.Category)]++
			for _, id := range q.Evidence {
				if _, ok := evidence[id]; !ok {
					rep.UnknownEvidenceIDs++
				}
			}
		}
		rep.Questions += len(qs)
		answer := "I don't know."

		per := o.QuestionsPerReplay
		if per <= 0 {
			per = len(qs)
		}
		for b := 0; b*per < len(qs); b++ {
			batch := qs[b*per : min(len(qs), (b+1)*per)]
			// Drop-in: system + newest message, no mode header.
			session := fmt.Sprintf("%s/drop-in/%d", c.ID, b)
			for _, t := range turns {
				p, err := r.chat(session, session, []memMsg{sys, {"user", t.user}}, t.reply)
				if err != nil {
					return rep, err
				}
				if b == 0 {
					info, err := r.parsePrompt(p)
					if err != nil {
						return rep, err
					}
					prefixes["drop-in"].add(info)
				}
			}
			for _, q := range batch {
				p, err := r.chat(session, session, []memMsg{sys, {"user", q.Question}}, answer)
				if err != nil {
					return rep, err
				}
				info, err := r.parsePrompt(p)
				if err != nil {
					return rep, err
				}
				accs["drop-in"].add(q, evidence, info)
			}
			progress("%s drop-in replay %d: %d turns, %d questions", c.ID, b, len(turns), len(batch))

			// Full history: every request carries the whole conversation.
			session = fmt.Sprintf("%s/full/%d", c.ID, b)
			hist := []memMsg{sys}
			for _, t := range turns {
				hist = append(hist, memMsg{"user", t.user})
				p, err := r.chat(session, session, hist, t.reply)
				if err != nil {
					return rep, err
				}
				if b == 0 {
					info, err := r.parsePrompt(p)
					if err != nil {
						return rep, err
					}
					prefixes["full-history"].add(info)
				}
				hist = append(hist, memMsg{"assistant", t.reply})
			}
			for _, q := range batch {
				hist = append(hist, memMsg{"user", q.Question})
				// Trimming: the same history behind a proxy that keeps
				// the newest messages that fit.
				info, err := r.trimmed(hist)
				if err != nil {
					return rep, err
				}
				accs["trimming"].add(q, evidence, info)
				p, err := r.chat(session, session, hist, answer)
				if err != nil {
					return rep, err
				}
				if info, err = r.parsePrompt(p); err != nil {
					return rep, err
				}
				accs["full-history"].add(q, evidence, info)
				hist = append(hist, memMsg{"assistant", answer})
			}
			progress("%s full-history replay %d: %d turns, %d questions", c.ID, b, len(turns), len(batch))
		}

		// Cross-session: a drop-in replay, then each question in a new
		// session of the same user.
		user := c.ID + "/cross"
		for _, t := range turns {
			if _, err := r.chat(c.ID+"/cross/base", user, []memMsg{sys, {"user", t.user}}, t.reply); err != nil {
				return rep, err
			}
		}
		time.Sleep(o.Settle)
		for i, q := range qs {
			p, err := r.chat(fmt.Sprintf("%s/cross/q%d", c.ID, i), user, []memMsg{sys, {"user", q.Question}}, answer)
			if err != nil {
				return rep, err
			}
			info, err := r.parsePrompt(p)
			if err != nil {
				return rep, err
			}
			accs["cross-session"].add(q, evidence, info)
		}
		progress("%s cross-session: %d questions", c.ID, len(qs))

	}
	for _, n := range names {
		rep.Clients = append(rep.Clients, accs[n].client(n))
	}
	for n, a := range prefixes {
		rep.Prefix[n] = a.report()
	}
	rep.Requests = r.requests
	rep.BackgroundByModel = o.Upstream.BackgroundCalls()
	if m, err := r.metrics(); err == nil {
		rep.DetectedAppends = int64(m[`sidecar_memory_turns_by_mode_total{mode="append",how="detected"}`])
		rep.ClientTurns = int64(m["sidecar_memory_replies_recorded_total"])
		for _, k := range []string{"facts", "episode", "summary"} {
			rep.BackgroundCalls += int64(m[`sidecar_memory_background_calls_total{kind="`+k+`"}`])
		}
		if rep.ClientTurns > 0 {
			rep.CallsPerTurn = float64(int(1000*float64(rep.BackgroundCalls)/float64(rep.ClientTurns))) / 1000
		}
	}
	ir, err := RunRecall(RecallOptions{Data: o.Data})
	if err != nil {
		return rep, err
	}
	rep.IndexRecall = ir.Recall["hybrid"]
	rep.IndexRecallByCategory = ir.ByCategory["hybrid"]
	rep.Seconds = float64(int(time.Since(start).Seconds()*10)) / 10
	return rep, nil
}

// trimmed is the prompt a proxy that only trims would send for msgs (a
// system message first, the question last): the system message, then the
// newest messages that fit the window with the question.
func (r *memRun) trimmed(msgs []memMsg) (promptInfo, error) {
	cost := func(m memMsg) int {
		msg := memory.NewMessage(m.Role, m.Content)
		return r.tok.MessageTokens(r.enc, &msg)
	}
	sys, q := msgs[0], msgs[len(msgs)-1]
	left := r.o.WindowTokens - cost(sys) - cost(q)
	i := len(msgs) - 1
	for i > 1 && cost(msgs[i-1]) <= left {
		left -= cost(msgs[i-1])
		i--
	}
	p, err := json.Marshal(append([]memMsg{sys}, msgs[i:]...))
	if err != nil {
		return promptInfo{}, err
	}
	return r.parsePrompt(p)
}

// metrics scrapes the sidecar's /metrics into name{labels} → value.
func (r *memRun) metrics() (map[string]float64, error) {
	resp, err := r.http.Get(r.o.Sidecar + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// WriteMemoryTable prints r for people.
func WriteMemoryTable(w io.Writer, r MemoryReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "LoCoMo replayed through the sidecar: %s\n", r.Data)
	per := "all questions after one replay"
	if r.QuestionsPerReplay > 0 {
		per = fmt.Sprintf("a new replay every %d questions", r.QuestionsPerReplay)
	}
	fmt.Fprintf(&b, "%d conversations, %d client turns per replay, %d questions (%s); window %d tokens, model %q; %d requests in %.0f s\n\n",
		r.Conversations, r.Turns, r.Questions, per, r.WindowTokens, r.Model, r.Requests, r.Seconds)
	cats := make([]string, 0, len(r.CategoryQuestions))
	for c := range r.CategoryQuestions {
		cats = append(cats, c)
	}
	order := func(name string) int {
		for c := 1; c <= 5; c++ {
			if LocomoCategoryName(c) == name {
				return c
			}
		}
		return 100
	}
	slices.SortFunc(cats, func(a, b string) int { return cmp.Or(cmp.Compare(order(a), order(b)), cmp.Compare(a, b)) })
	fmt.Fprintf(&b, "context recall (%% of evidence turns in the upstream's prompt)\n%-15s %7s %7s %8s", "client", "recall", "all-ev", "tokens")
	for _, c := range cats {
		fmt.Fprintf(&b, " %12s", fmt.Sprintf("%s(%d)", c, r.CategoryQuestions[c]))
	}
	b.WriteByte('\n')
	for _, c := range r.Clients {
		fmt.Fprintf(&b, "%-15s %7.1f %7.1f %8.0f", c.Name, c.ContextRecall, c.AllEvidence, c.PromptTokens)
		for _, cat := range cats {
			fmt.Fprintf(&b, " %12.1f", c.ByCategory[cat])
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%-15s %7s %7s %8s", "index R@10", fmt.Sprintf("%.1f", r.IndexRecall["10"]), "", "")
	for _, cat := range cats {
		fmt.Fprintf(&b, " %12.1f", r.IndexRecallByCategory[cat]["10"])
	}
	b.WriteByte('\n')
	fmt.Fprintf(&b, "%-15s %7s %7s %8s", "index R@25", fmt.Sprintf("%.1f", r.IndexRecall["25"]), "", "")
	for _, cat := range cats {
		fmt.Fprintf(&b, " %12.1f", r.IndexRecallByCategory[cat]["25"])
	}
	b.WriteString("\n\nprompt prefix: tokens of the previous prompt its successor repeats from the start, on turns where nothing left the window\n")
	fmt.Fprintf(&b, "%-15s %6s %7s %9s %7s %7s %7s %7s %8s %8s\n", "client", "turns", "stable", "evictions", "shared%", "mean%", "p10%", "min%", "shared", "prompt")
	for _, n := range []string{"drop-in", "full-history"} {
		p, ok := r.Prefix[n]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "%-15s %6d %7d %9d %7.1f %7.1f %7.1f %7.1f %8.0f %8.0f\n", n, p.Turns, p.Stable, p.Evictions, p.SharedPct, p.MeanPct, p.P10Pct, p.MinPct, p.SharedTokens, p.PromptTokens)
	}
	fmt.Fprintf(&b, "\nappends detected without a header: %d; sidecar's own model calls: %d for %d client turns (%.3f per turn), by model %v\n",
		r.DetectedAppends, r.BackgroundCalls, r.ClientTurns, r.CallsPerTurn, r.BackgroundByModel)
	_, err := io.WriteString(w, b.String())
	return err
}

// EngineOptions configure RunEngine.
type EngineOptions struct {
	// Data is a LoCoMo-format JSON file; Sidecar the running sidecar's base
	// URL, in front of a real llama.cpp server. Required.
	Data, Sidecar string
	// Model names the requests' model. Empty: "locomo-replay".
	Model string
	// Conversations and Turns limit the replay (zero: all).
	Conversations, Turns int
	// Progress, when set, receives a line per conversation.
	Progress io.Writer
}

// EngineReport is what the engine itself reports of the replay: how many
// prompt tokens it took from its cache (timings.cache_n) and how many it
// computed (timings.prompt_n), in its own tokens.
type EngineReport struct {
	Turns          int     `json:"turns"` // turns after each conversation's first
	CachedTokens   int64   `json:"cached_tokens"`
	ComputedTokens int64   `json:"computed_tokens"`
	CachedPct      float64 `json:"cached_pct"` // Σ cached / Σ (cached + computed), from the second turn
	MedianPct      float64 `json:"median_pct"` // per-turn cached share
	P10Pct         float64 `json:"p10_pct"`
	Seconds        float64 `json:"seconds"`
}

// RunEngine replays conversations as the drop-in client (system message and
// newest user message, no header) through a sidecar in front of a real
// llama.cpp server and reads the engine's prompt-cache figures from each
// answer's timings. The engine answers for the other speaker (with a
// grammar and a few tokens: a random-weight test model emits invalid bytes
// otherwise), so only the user side follows the recording.
func RunEngine(o EngineOptions) (EngineReport, error) {
	if o.Data == "" || o.Sidecar == "" {
		return EngineReport{}, errors.New("bench: engine: Data and Sidecar are required")
	}
	if o.Model == "" {
		o.Model = "locomo-replay"
	}
	convs, err := LoadLocomo(o.Data)
	if err != nil {
		return EngineReport{}, err
	}
	if o.Conversations > 0 && o.Conversations < len(convs) {
		convs = convs[:o.Conversations]
	}
	start := time.Now()
	hc := &http.Client{Timeout: 5 * time.Minute}
	var rep EngineReport
	var shares []float64
	for _, c := range convs {
		turns := locomoReplay(c)
		if o.Turns > 0 && o.Turns < len(turns) {
			turns = turns[:o.Turns]
		}
		for i, t := range turns {
			body, _ := json.Marshal(map[string]any{"model": o.Model, "max_tokens": 8, "grammar": "root ::= [a-z ]+",
				"messages": []memMsg{{"system", memorySystem}, {"user", t.user}}})
			req, _ := http.NewRequest(http.MethodPost, strings.TrimSuffix(o.Sidecar, "/")+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Session-ID", c.ID+"/engine")
			resp, err := hc.Do(req)
			if err != nil {
				return rep, err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return rep, fmt.Errorf("bench: engine: %s turn %d: status %d: %.300s", c.ID, i, resp.StatusCode, b)
			}
			var out struct {
				Timings struct {
					CacheN  int64 `json:"cache_n"`
					PromptN int64 `json:"prompt_n"`
				} `json:"timings"`
			}
			if err := json.Unmarshal(b, &out); err != nil {
				return rep, fmt.Errorf("bench: engine: answer: %w", err)
			}
			if i == 0 {
				continue // nothing to reuse yet
			}
			rep.Turns++
			rep.CachedTokens += out.Timings.CacheN
			rep.ComputedTokens += out.Timings.PromptN
			if n := out.Timings.CacheN + out.Timings.PromptN; n > 0 {
				shares = append(shares, 100*float64(out.Timings.CacheN)/float64(n))
			}
		}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "%s: %d turns through the engine\n", c.ID, len(turns))
		}
	}
	if n := rep.CachedTokens + rep.ComputedTokens; n > 0 {
		rep.CachedPct = recallRound1(100 * float64(rep.CachedTokens) / float64(n))
	}
	if len(shares) > 0 {
		slices.Sort(shares)
		rep.MedianPct = recallRound1(shares[len(shares)/2])
		rep.P10Pct = recallRound1(shares[len(shares)/10])
	}
	rep.Seconds = float64(int(time.Since(start).Seconds()*10)) / 10
	return rep, nil
}

// WriteEngineTable prints r for people.
func WriteEngineTable(w io.Writer, r EngineReport) error {
	_, err := fmt.Fprintf(w, "drop-in replay through the sidecar in front of a real llama.cpp server: %d turns in %.0f s\n"+
		"engine prompt tokens taken from its cache: %.1f%% (%d cached, %d computed); per turn median %.1f%%, p10 %.1f%%\n",
		r.Turns, r.Seconds, r.CachedPct, r.CachedTokens, r.ComputedTokens, r.MedianPct, r.P10Pct)
	return err
}

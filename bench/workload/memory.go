package workload

// Memory end to end: LoCoMo conversations replayed through a running
// sidecar whose upstream is the scripted upstream of internal/mockup (it answers each user
// message with the other speaker's recorded turns), then LoCoMo's questions
// asked the same way. Context recall is the share of a question's evidence
// turns whose text is in the prompt the upstream receives.

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/mockup"
	"github.com/kvsidecar/kvsidecar/memory"
)

// MemoryOptions configure RunMemory.
type MemoryOptions struct {
	// Data is a LoCoMo-format JSON file. Required.
	Data string
	// Sidecar is the base URL of the running sidecar. Required.
	Sidecar string
	// Upstream is the sidecar's upstream, made with KeepPrompts. Required.
	Upstream *mockup.Server
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
	// Only, when set, replays only the conversations with these
	// (zero-based) positions in the file, for leave-one-out tuning.
	Only []int
	// Settle is how long the cross-session client waits after its replay
	// before asking (the sidecar indexes a turn just after its response).
	// Zero: 1s.
	Settle time.Duration
	// Progress, when set, receives a line per replay.
	Progress io.Writer
	// Questions, when set, receives a JSON line per question of the
	// drop-in client: its category, text, evidence and the evidence found
	// in the prompt (for looking at what recall misses).
	Questions io.Writer
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
	Stable    int `json:"stable_turns"`   // the previous prompt leads the new one whole
	Evictions int `json:"eviction_turns"` // it does not: history left the window
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
	// CachedPct is, over every turn (evictions included), Σ tokens of the
	// previous prompt the new one repeats from its start / Σ the new
	// prompts' tokens: the share an engine's prefix cache holding the
	// previous prompt serves (the reply it generated aside).
	CachedPct float64 `json:"cached_pct"`
	// ShiftCachedPct is CachedPct for an engine that also moves the KV of
	// the previous prompt's messages the new one keeps further on, in
	// order (llama.cpp's n_cache_reuse): what it serves after an eviction.
	ShiftCachedPct float64 `json:"shift_cached_pct"`
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
	req.Header.Set(mockup.ReplyHeader, base64.RawURLEncoding.EncodeToString([]byte(reply)))
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

// ask is chat, then parsePrompt of the prompt the upstream received.
func (r *memRun) ask(session, user string, msgs []memMsg, reply string) (promptInfo, error) {
	p, err := r.chat(session, user, msgs, reply)
	if err != nil {
		return promptInfo{}, err
	}
	return r.parsePrompt(p)
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

// RunMemory replays every conversation of o.Data through the sidecar with
// each client and reports context recall, prompt prefix sharing and the
// sidecar's own calls.
func RunMemory(o MemoryOptions) (MemoryReport, error) {
	if o.Data == "" || o.Sidecar == "" || o.Upstream == nil || !o.Upstream.Options().KeepPrompts {
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
	if len(o.Only) > 0 {
		var keep []LocomoConversation
		for _, i := range o.Only {
			if i >= 0 && i < len(convs) {
				keep = append(keep, convs[i])
			}
		}
		convs = keep
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
	// replay sends one replayed turn of client's replay b; the first replay
	// of a conversation also measures its prompt's prefix sharing.
	replay := func(b int, client, session string, msgs []memMsg, reply string) error {
		if b > 0 {
			_, err := r.chat(session, session, msgs, reply)
			return err
		}
		info, err := r.ask(session, session, msgs, reply)
		if err != nil {
			return err
		}
		prefixes[client].add(info)
		return nil
	}
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
				if err := replay(b, "drop-in", session, []memMsg{sys, {"user", t.user}}, t.reply); err != nil {
					return rep, err
				}
			}
			for _, q := range batch {
				info, err := r.ask(session, session, []memMsg{sys, {"user", q.Question}}, answer)
				if err != nil {
					return rep, err
				}
				found := accs["drop-in"].add(q, evidence, info)
				if o.Questions != nil {
					line, _ := json.Marshal(map[string]any{"conversation": c.ID, "category": LocomoCategoryName(q.Category),
						"question": q.Question, "evidence": q.Evidence, "found": found, "prompt_tokens": sum(info.tokens)})
					fmt.Fprintf(o.Questions, "%s\n", line)
				}
			}
			progress("%s drop-in replay %d: %d turns, %d questions", c.ID, b, len(turns), len(batch))

			// Full history: every request carries the whole conversation.
			session = fmt.Sprintf("%s/full/%d", c.ID, b)
			hist := []memMsg{sys}
			for _, t := range turns {
				hist = append(hist, memMsg{"user", t.user})
				if err := replay(b, "full-history", session, hist, t.reply); err != nil {
					return rep, err
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
				if info, err = r.ask(session, session, hist, answer); err != nil {
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
			info, err := r.ask(fmt.Sprintf("%s/cross/q%d", c.ID, i), user, []memMsg{sys, {"user", q.Question}}, answer)
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

// metrics scrapes the sidecar's /metrics (on its admin listener) into
// name{labels} → value.
func (r *memRun) metrics() (map[string]float64, error) {
	resp, err := r.http.Get(AdminURL(r.o.Sidecar) + "/metrics")
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

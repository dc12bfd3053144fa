package workload

// LoCoMo retrieval recall: how often the dialog turns that a question's
// answer rests on ("evidence") come back in the top k of the index.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
)

// RecallReference is the published reference: LoCoMo paper (Maharana et
// al., ACL 2024) Table 3, dense retriever DRAGON over dialog turns, evidence
// recall in percent at k = 5, 10, 25, 50.
var RecallReference = map[string]float64{"5": 56.7, "10": 66.2, "25": 76.7, "50": 82.7}

// RecallKs are the cut-offs reported.
var RecallKs = []int{5, 10, 25, 50}

// RecallModes are the retrieval modes measured, in report order.
var RecallModes = []index.Mode{index.ModeBM25, index.ModeVector, index.ModeHybrid}

// RecallOptions configure RunRecall. The zero value (with Data set) measures
// the defaults the sidecar ships with.
type RecallOptions struct {
	// Data is a LoCoMo-format JSON file (a list of samples). Required.
	Data string
	// Embedder for vector and hybrid search; nil selects the offline
	// embedder of index.Options.
	Embedder index.Embedder
	// Index options for each conversation's index; Embedder above, when
	// set, overrides Index.Embedder.
	Index index.Options
	// NoCaptions leaves a shared photo's blip_caption out of its turn's text
	// (by default it is appended: the questions ask about what was in the
	// photo, and the caption is the only text about it).
	NoCaptions bool
	// ContextTurns is how many preceding turns of the same session are added
	// to a turn's indexed text (the turn is still the unit retrieved and
	// scored): a reply such as "Yes, adoption agencies!" means little
	// without the question it answers. 0 selects 1; negative indexes each
	// turn alone, as the LoCoMo paper's retrievers did.
	ContextTurns int
	// NoSpeaker leaves the speaker's name out of the turn's text (by default
	// the text is "Name: text", as in the conversation, since questions name
	// whose experience they ask about).
	NoSpeaker bool
}

// RecallReport is the result of RunRecall. Recall values are percentages.
type RecallReport struct {
	Data     string `json:"data"`
	Embedder string `json:"embedder"`
	Fusion   string `json:"fusion"`
	// ContextTurns, Captions, Speaker: what each turn's indexed text held
	// (see RecallOptions).
	ContextTurns int  `json:"context_turns"`
	Captions     bool `json:"captions"`
	Speaker      bool `json:"speaker"`
	// Conversations, Turns: what was indexed (one index per conversation).
	Conversations int `json:"conversations"`
	Turns         int `json:"turns"`
	// Links is how many triples the rule-based extractor (LocomoLinks)
	// gave the entity graph of the hybrid+graph column.
	Links int `json:"links"`
	// Questions scored; SkippedNoEvidence questions had no evidence ids and
	// are not scored.
	Questions         int `json:"questions"`
	SkippedNoEvidence int `json:"skipped_no_evidence"`
	// UnknownEvidence counts evidence ids naming no turn of their
	// conversation; they stay in the denominator (never found).
	UnknownEvidence int   `json:"unknown_evidence"`
	Ks              []int `json:"ks"`
	// Recall is mode ("bm25", "vector", "hybrid", "hybrid+graph") → k
	// ("5") → recall.
	Recall map[string]map[string]float64 `json:"recall"`
	// ByCategory is mode → category name → k → recall.
	ByCategory map[string]map[string]map[string]float64 `json:"by_category"`
	// CategoryQuestions is category name → questions scored.
	CategoryQuestions map[string]int `json:"category_questions"`
	// Latency is mode → search latency over all questions (each
	// conversation's index is small, see index bench for large ones).
	Latency map[string]RecallLatency `json:"latency"`
	// Reference is RecallReference (DRAGON, LoCoMo Table 3).
	Reference map[string]float64 `json:"reference"`
}

// recallVariant is one column of the report: a mode, with or without the
// entity graph.
type recallVariant struct {
	name  string
	mode  index.Mode
	graph bool
}

// recallVariants are RecallModes, then hybrid with the entity graph.
func recallVariants() []recallVariant {
	var out []recallVariant
	for _, m := range RecallModes {
		out = append(out, recallVariant{m.String(), m, false})
	}
	return append(out, recallVariant{recallGraphVariant, index.ModeHybrid, true})
}

// RecallLatency summarises search latencies in microseconds.
type RecallLatency struct {
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
}

// LocomoCategoryName names LoCoMo's question categories.
func LocomoCategoryName(c int) string {
	switch c {
	case 1:
		return "multi-hop"
	case 2:
		return "temporal"
	case 3:
		return "open-domain"
	case 4:
		return "single-hop"
	case 5:
		return "adversarial"
	}
	return "category-" + strconv.Itoa(c)
}

// LocomoTurn is one dialog turn.
type LocomoTurn struct {
	Speaker     string `json:"speaker"`
	DiaID       string `json:"dia_id"`
	Text        string `json:"text"`
	BlipCaption string `json:"blip_caption,omitempty"`
	Session     int    `json:"-"`
}

// LocomoQA is one question with its evidence turn ids (normalised).
type LocomoQA struct {
	Question string
	Evidence []string
	Category int
}

// LocomoConversation is one sample: its turns in order and its questions.
type LocomoConversation struct {
	ID    string
	Turns []LocomoTurn
	QA    []LocomoQA
	// SessionTimes maps a session number to its "session_N_date_time" text.
	SessionTimes map[int]string
	// SpeakerA and SpeakerB are the conversation's two speakers.
	SpeakerA, SpeakerB string
}

var (
	locomoSessionKey = regexp.MustCompile(`^session_(\d+)$`)
	locomoDateKey    = regexp.MustCompile(`^session_(\d+)_date_time$`)
	locomoDiaID      = regexp.MustCompile(`^D(\d+):(\d+)$`)
)

// LoadLocomo reads a LoCoMo-format file. Evidence ids are normalised: stray
// spaces removed, semicolon- or comma-joined lists split, leading zeros
// dropped ("D 8:06; D9:17" → "D8:6", "D9:17"); turn ids likewise.
func LoadLocomo(path string) ([]LocomoConversation, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bench: locomo: %w", err)
	}
	return ParseLocomo(raw)
}

// ParseLocomo parses LoCoMo-format JSON; see LoadLocomo.
func ParseLocomo(raw []byte) ([]LocomoConversation, error) {
	var samples []struct {
		SampleID     string                     `json:"sample_id"`
		Conversation map[string]json.RawMessage `json:"conversation"`
		QA           []struct {
			Question string   `json:"question"`
			Evidence []string `json:"evidence"`
			Category int      `json:"category"`
		} `json:"qa"`
	}
	if err := json.Unmarshal(raw, &samples); err != nil {
		return nil, fmt.Errorf("bench: locomo: %w", err)
	}
	out := make([]LocomoConversation, 0, len(samples))
	for si, s := range samples {
		c := LocomoConversation{ID: s.SampleID, SessionTimes: map[int]string{}}
		if c.ID == "" {
			c.ID = "sample-" + strconv.Itoa(si)
		}
		type session struct {
			n     int
			turns []LocomoTurn
		}
		var sessions []session
		for key, v := range s.Conversation {
			if key == "speaker_a" || key == "speaker_b" {
				var name string
				_ = json.Unmarshal(v, &name)
				if key == "speaker_a" {
					c.SpeakerA = name
				} else {
					c.SpeakerB = name
				}
				continue
			}
			if m := locomoDateKey.FindStringSubmatch(key); m != nil {
				n, _ := strconv.Atoi(m[1])
				var t string
				if json.Unmarshal(v, &t) == nil {
					c.SessionTimes[n] = t
				}
				continue
			}
			m := locomoSessionKey.FindStringSubmatch(key)
			if m == nil {
				continue
			}
			n, err := strconv.Atoi(m[1])
			if err != nil {
				continue
			}
			var turns []LocomoTurn
			if err := json.Unmarshal(v, &turns); err != nil {
				return nil, fmt.Errorf("bench: locomo: %s %s: %w", c.ID, key, err)
			}
			for i := range turns {
				turns[i].Session = n
				turns[i].DiaID = locomoNormalizeDiaID(turns[i].DiaID)
			}
			sessions = append(sessions, session{n, turns})
		}
		sort.Slice(sessions, func(i, j int) bool { return sessions[i].n < sessions[j].n })
		for _, ss := range sessions {
			c.Turns = append(c.Turns, ss.turns...)
		}
		for _, q := range s.QA {
			c.QA = append(c.QA, LocomoQA{Question: q.Question, Evidence: locomoNormalizeEvidence(q.Evidence), Category: q.Category})
		}
		out = append(out, c)
	}
	return out, nil
}

// locomoNormalizeDiaID canonicalises one turn id ("D 1:03" → "D1:3"); ids of
// another shape are returned trimmed.
func locomoNormalizeDiaID(s string) string {
	s = strings.Join(strings.Fields(s), "")
	if m := locomoDiaID.FindStringSubmatch(s); m != nil {
		a, err1 := strconv.Atoi(m[1])
		b, err2 := strconv.Atoi(m[2])
		if err1 == nil && err2 == nil {
			return fmt.Sprintf("D%d:%d", a, b)
		}
	}
	return s
}

// locomoNormalizeEvidence splits joined ids, canonicalises and dedupes them.
func locomoNormalizeEvidence(ev []string) []string {
	var out []string
	for _, e := range ev {
		for _, part := range strings.FieldsFunc(e, func(r rune) bool { return r == ';' || r == ',' }) {
			id := locomoNormalizeDiaID(part)
			if id != "" && !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	return out
}

// LocomoTurnText is the text indexed for a turn.
func LocomoTurnText(t LocomoTurn, captions, speaker bool) string {
	var b strings.Builder
	if speaker && t.Speaker != "" {
		b.WriteString(t.Speaker)
		b.WriteString(": ")
	}
	b.WriteString(t.Text)
	if captions && t.BlipCaption != "" {
		b.WriteString(" [shared a photo: ")
		b.WriteString(t.BlipCaption)
		b.WriteString("]")
	}
	return b.String()
}

// RunRecall indexes each conversation's turns, queries with each question
// in every mode of RecallModes and reports evidence recall at RecallKs.
func RunRecall(opts RecallOptions) (RecallReport, error) {
	if opts.Data == "" {
		return RecallReport{}, errors.New("bench: recall: no data file")
	}
	convs, err := LoadLocomo(opts.Data)
	if err != nil {
		return RecallReport{}, err
	}
	iopts := opts.Index
	if opts.Embedder != nil {
		iopts.Embedder = opts.Embedder
	}
	if iopts.Embedder == nil {
		iopts.Embedder = index.NewHashEmbedder(index.HashOptions{})
	}
	rep := RecallReport{
		Data:              opts.Data,
		Embedder:          iopts.Embedder.Name(),
		Fusion:            iopts.Fusion.String(),
		Conversations:     len(convs),
		Ks:                slices.Clone(RecallKs),
		Recall:            map[string]map[string]float64{},
		ByCategory:        map[string]map[string]map[string]float64{},
		CategoryQuestions: map[string]int{},
		Latency:           map[string]RecallLatency{},
		Reference:         RecallReference,
		ContextTurns:      max(opts.ContextTurns, 0),
		Captions:          !opts.NoCaptions,
		Speaker:           !opts.NoSpeaker,
	}
	if opts.ContextTurns == 0 {
		rep.ContextTurns = 1
	}
	maxK := slices.Max(RecallKs)
	type acc struct {
		sum map[int]float64 // k → Σ recall
		n   int
	}
	newAcc := func() *acc { return &acc{sum: map[int]float64{}} }
	variants := recallVariants()
	overall := map[string]*acc{}
	byCat := map[string]map[string]*acc{}
	lat := map[string][]time.Duration{}
	for _, v := range variants {
		overall[v.name] = newAcc()
		byCat[v.name] = map[string]*acc{}
	}
	ctx := context.Background()
	for _, c := range convs {
		x, err := index.New(iopts)
		if err != nil {
			return RecallReport{}, fmt.Errorf("bench: recall: %w", err)
		}
		docs := make([]index.Doc, 0, len(c.Turns))
		known := map[string]bool{}
		var links []index.Link
		for i, t := range c.Turns {
			links = append(links, LocomoLinks(t)...)
			text := LocomoTurnText(t, !opts.NoCaptions, !opts.NoSpeaker)
			for j := i - 1; j >= 0 && j >= i-rep.ContextTurns && c.Turns[j].Session == t.Session; j-- {
				text += "\n" + LocomoTurnText(c.Turns[j], !opts.NoCaptions, !opts.NoSpeaker)
			}
			docs = append(docs, index.Doc{ID: t.DiaID, Text: text})
			known[t.DiaID] = true
		}
		if err := x.Upsert(ctx, docs...); err != nil {
			return RecallReport{}, fmt.Errorf("bench: recall: %s: %w", c.ID, err)
		}
		rep.Turns += x.Len()
		graph := index.NewEntityGraph(links)
		rep.Links += graph.Len()
		for _, q := range c.QA {
			if len(q.Evidence) == 0 {
				rep.SkippedNoEvidence++
				continue
			}
			rep.Questions++
			cat := LocomoCategoryName(q.Category)
			rep.CategoryQuestions[cat]++
			for _, e := range q.Evidence {
				if !known[e] {
					rep.UnknownEvidence++
				}
			}
			for _, v := range variants {
				m := v.name
				if v.graph {
					x.SetGraph(graph)
				}
				start := time.Now()
				hits, err := x.Search(ctx, q.Question, maxK, v.mode)
				lat[m] = append(lat[m], time.Since(start))
				x.SetGraph(nil)
				if err != nil {
					return RecallReport{}, fmt.Errorf("bench: recall: %s: %q: %w", c.ID, q.Question, err)
				}
				ca := byCat[m][cat]
				if ca == nil {
					ca = newAcc()
					byCat[m][cat] = ca
				}
				for _, k := range RecallKs {
					r := evidenceRecall(hits, q.Evidence, k)
					overall[m].sum[k] += r
					ca.sum[k] += r
				}
				overall[m].n++
				ca.n++
			}
		}
	}
	pct := func(a *acc) map[string]float64 {
		out := map[string]float64{}
		for _, k := range RecallKs {
			if a.n > 0 {
				out[strconv.Itoa(k)] = recallRound1(100 * a.sum[k] / float64(a.n))
			}
		}
		return out
	}
	for _, v := range variants {
		m := v.name
		rep.Recall[m] = pct(overall[m])
		rep.ByCategory[m] = map[string]map[string]float64{}
		for cat, a := range byCat[m] {
			rep.ByCategory[m][cat] = pct(a)
		}
		rep.Latency[m] = RecallLatency{P50us: 1000 * percentileMs(lat[m], 0.50), P99us: 1000 * percentileMs(lat[m], 0.99)}
	}
	return rep, nil
}

// evidenceRecall is the fraction of evidence found in the first k hits.
func evidenceRecall(hits []index.Hit, evidence []string, k int) float64 {
	found := 0
	for _, h := range hits[:min(k, len(hits))] {
		if slices.Contains(evidence, h.ID) {
			found++
		}
	}
	return float64(found) / float64(len(evidence))
}

func recallRound1(v float64) float64 {
	return float64(int64(v*10+0.5)) / 10
}

// WriteRecallTable prints r for people: overall recall per mode beside the
// published reference, then recall per category.
func WriteRecallTable(w io.Writer, r RecallReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "LoCoMo evidence recall (%%): %s\n", r.Data)
	fmt.Fprintf(&b, "%d conversations, %d turns indexed, %d questions scored (%d without evidence skipped, %d unknown evidence ids)\n",
		r.Conversations, r.Turns, r.Questions, r.SkippedNoEvidence, r.UnknownEvidence)
	fmt.Fprintf(&b, "%d rule-based triples in the entity graph (LocomoLinks, bench only)\n", r.Links)
	fmt.Fprintf(&b, "embedder %s, hybrid fusion %s; turn text: speaker %v, photo captions %v, %d preceding turns as context\n\n",
		r.Embedder, r.Fusion, r.Speaker, r.Captions, r.ContextTurns)
	header := func(first string) {
		fmt.Fprintf(&b, "%-28s", first)
		for _, k := range r.Ks {
			fmt.Fprintf(&b, " %7s", "R@"+strconv.Itoa(k))
		}
		b.WriteByte('\n')
	}
	row := func(name string, vals map[string]float64) {
		fmt.Fprintf(&b, "%-28s", name)
		for _, k := range r.Ks {
			if v, ok := vals[strconv.Itoa(k)]; ok {
				fmt.Fprintf(&b, " %7.1f", v)
			} else {
				fmt.Fprintf(&b, " %7s", "-")
			}
		}
		b.WriteByte('\n')
	}
	header("mode")
	modes := make([]string, 0, len(r.Recall))
	for _, v := range recallVariants() {
		if _, ok := r.Recall[v.name]; ok {
			modes = append(modes, v.name)
		}
	}
	for _, m := range modes {
		row(m, r.Recall[m])
	}
	row("DRAGON (LoCoMo Table 3)", r.Reference)
	cats := make([]string, 0, len(r.CategoryQuestions))
	for c := range r.CategoryQuestions {
		cats = append(cats, c)
	}
	catOrder := func(name string) int {
		for c := 1; c <= 5; c++ {
			if LocomoCategoryName(c) == name {
				return c
			}
		}
		return 100
	}
	slices.SortFunc(cats, func(a, b string) int {
		if c := cmp.Compare(catOrder(a), catOrder(b)); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	b.WriteString("\nper category\n")
	header("category / mode")
	for _, c := range cats {
		for _, m := range modes {
			row(fmt.Sprintf("%s (%d) %s", c, r.CategoryQuestions[c], m), r.ByCategory[m][c])
		}
	}
	b.WriteString("\nsearch latency (µs, p50 / p99)\n")
	for _, m := range modes {
		l := r.Latency[m]
		fmt.Fprintf(&b, "%-28s %7.0f %7.0f\n", m, l.P50us, l.P99us)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

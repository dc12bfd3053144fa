package knowledge

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/viterin/vek/vek32"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// L4 compression (the Loom memory design's L4Compressor, with its fidelity
// check). When a session holds more than L4.Threshold facts (category
// fact), the worker queues one compression run on the extraction queue
// (the same workers, timeout and Extractor as the reviewer):
//
//  1. every fact is embedded with the index's Embedder, and facts whose
//     cosine similarity reaches L4.Similarity are joined (union-find);
//  2. each cluster of at least L4.MinCluster facts (largest first, at most
//     L4.MaxMerges per run, cut into prompts of at most L4.MaxClusterFacts)
//     is merged by the memory model into one fact ([MERGE] text, or [SKIP]
//     when the facts must stay apart; ParseMerge);
//  3. the merge is kept only if its fidelity — 0.6 × the mean cosine
//     similarity of the merged text to each original + 0.4 × the share of
//     the originals' keywords (Keywords) the merged text still holds —
//     reaches L4.Fidelity. A kept merge is a new fact ("merged-…") carrying
//     those figures and the keywords it lost (Unit.Merged); it takes over the
//     originals' triples, then the originals are deleted through
//     deleteUnit like every deletion. A merge that falls short, a
//     [SKIP] or a malformed answer leaves the originals as they are, and
//     that cluster (the same facts in the same state) is not tried again,
//     across restarts too ("l4" log records).
//
// Without embeddings (Recall.IndexDisabled: the sidecar computes none) the
// design's fallback applies: the L4.Threshold most important facts are kept
// and the others deleted, least important first, with no model call.
//
// Durability: the merged fact (and its triples) is appended before the
// originals' deletions, so a crash between the two leaves both, never
// neither; a run whose facts changed meanwhile applies nothing (stale).
// Work is bounded: one run per session at a time, started only when the
// session's fact set changed since its last run, O(facts²) dot products
// (facts ≤ Extraction.MaxFacts) and at most L4.MaxMerges model calls.

// MergeInfo describes a fact made by L4 compression from others: its
// fidelity figures and what the merge lost. It is never changed after the
// merge.
type MergeInfo struct {
	// From are the ids of the facts merged (deleted since).
	From []string `json:"from"`
	// Similarity is the mean cosine similarity of the merged text's
	// embedding to each original's; KeywordRetention the share of the
	// originals' keywords the merged text holds; Fidelity = 0.6 ×
	// Similarity + 0.4 × KeywordRetention.
	Similarity       float64 `json:"similarity"`
	KeywordRetention float64 `json:"keyword_retention"`
	Fidelity         float64 `json:"fidelity"`
	// LostKeywords are the originals' keywords missing from the merged
	// text (sorted, at most maxLostKeywords).
	LostKeywords []string `json:"lost_keywords,omitempty"`
}

// Clone returns a deep copy (nil for nil).
func (m *MergeInfo) Clone() *MergeInfo {
	if m == nil {
		return nil
	}
	c := *m
	c.From = slices.Clone(m.From)
	c.LostKeywords = slices.Clone(m.LostKeywords)
	return &c
}

// L4Stats count L4 compression (Stats embeds them).
type L4Stats struct {
	L4Runs        int64 // compression runs (clustering passes and importance prunes)
	L4Calls       int64 // merge calls to the memory model
	L4Merged      int64 // merges kept: their fidelity reached L4.Fidelity
	L4Rejected    int64 // merges whose fidelity fell short: the originals stayed
	L4Skipped     int64 // clusters the model declined to merge ([SKIP])
	L4Malformed   int64 // answers that broke the format: nothing changed
	L4Stale       int64 // merges not applied: a fact changed or left meanwhile
	L4Errors      int64 // model or embedder calls that failed (nothing changed)
	L4Dropped     int64 // runs not queued: the extraction queue was full
	L4FactsMerged int64 // original facts replaced by merged ones
	L4FactsPruned int64 // facts deleted by the importance fallback (no embeddings)
}

// L4Counters are L4 compression's counters (Stats reads them).
type L4Counters struct {
	Runs, Calls, Merged, Rejected, Skipped, Malformed, Stale, Errs, Dropped, FactsMerged, Pruned atomic.Int64
}

// Stats returns the counters.
func (c *L4Counters) Stats() L4Stats {
	return L4Stats{L4Runs: c.Runs.Load(), L4Calls: c.Calls.Load(), L4Merged: c.Merged.Load(), L4Rejected: c.Rejected.Load(),
		L4Skipped: c.Skipped.Load(), L4Malformed: c.Malformed.Load(), L4Stale: c.Stale.Load(), L4Errors: c.Errs.Load(),
		L4Dropped: c.Dropped.Load(), L4FactsMerged: c.FactsMerged.Load(), L4FactsPruned: c.Pruned.Load()}
}

// Limits of L4 compression.
const (
	maxMergedBytes  = 1000 // a merged fact's text
	maxLostKeywords = 20   // lost keywords a merged fact records
	maxL4Refused    = 1024 // refused clusters a session remembers
	l4SimWeight     = 0.6  // the design's weights of the fidelity figures
	l4KeywordWeight = 0.4
)

// L4State is a session's L4 state. The session's mu protects it.
type L4State struct {
	Running bool // a run is queued or running
	// LastFP is the fact set's fingerprint at the last run: a run starts
	// only once it changed.
	LastFP uint64
	// Refused holds the clusters (ClusterFP) whose merge was refused
	// (fidelity, [SKIP], malformed), at most maxL4Refused, the oldest
	// forgotten first; Dirty those not yet written ("l4" records).
	Refused map[uint64]bool
	Dirty   []uint64
	order   []uint64
}

// Refuse remembers a cluster whose merge was refused.
func (l *L4State) Refuse(fp uint64, write bool) {
	if l.Refused[fp] {
		return
	}
	if l.Refused == nil {
		l.Refused = map[uint64]bool{}
	}
	l.Refused[fp] = true
	l.order = append(l.order, fp)
	if len(l.order) > maxL4Refused {
		delete(l.Refused, l.order[0])
		l.order = slices.Delete(l.order, 0, 1)
	}
	if write {
		l.Dirty = append(l.Dirty, fp)
	}
}

// Fact is a fact as a run saw it.
type Fact struct {
	ID, Content string
	Importance  float64
	Updated     time.Time
	Vec         []float32 // unit length; nil when it embeds to nothing
}

// ClusterFP fingerprints a cluster: its facts' ids and states. It is
// written to the session's log ("l4" records) and compared after a
// restart, so it is the same in every process: FNV-1a, not maphash,
// whose seeds are per process.
func ClusterFP(fs []*Fact) uint64 {
	h := fnv.New64a()
	for _, f := range fs {
		HashFact(h, f.ID, f.Content, f.Updated)
	}
	return h.Sum64() | 1
}

// HashFact adds one fact's id, text and last change to h.
func HashFact(h io.Writer, id, content string, updated time.Time) {
	io.WriteString(h, id)
	h.Write([]byte{0})
	io.WriteString(h, content)
	h.Write([]byte{0})
	io.WriteString(h, updated.UTC().Format(time.RFC3339Nano))
	h.Write([]byte{1})
}

// Embed embeds texts with e, each vector at unit length (nil for a zero
// vector); the vectors must share one dimension.
func Embed(ctx context.Context, e index.Embedder, texts []string) ([][]float32, error) {
	vecs, err := e.Embed(ctx, texts)
	if err != nil {
		return nil, err
	}
	if len(vecs) != len(texts) {
		return nil, fmt.Errorf("embedder returned %d vectors for %d texts", len(vecs), len(texts))
	}
	dim := -1
	for i, v := range vecs {
		if dim >= 0 && len(v) != dim && len(v) > 0 {
			return nil, fmt.Errorf("embedder returned dimensions %d and %d", dim, len(v))
		}
		if len(v) > 0 {
			dim = len(v)
		}
		vecs[i] = UnitVector(v)
	}
	return vecs, nil
}

// UnitVector returns a copy of v at unit length, nil when v is zero or not
// finite.
func UnitVector(v []float32) []float32 {
	var n float64
	for _, x := range v {
		n += float64(x) * float64(x)
	}
	if n == 0 || math.IsNaN(n) || math.IsInf(n, 0) {
		return nil
	}
	inv := 1 / math.Sqrt(n)
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(float64(x) * inv)
	}
	return out
}

// CosineVec is the dot product of two unit vectors, clipped to [-1, 1]; 0
// when either is nil or their dimensions differ.
func CosineVec(a, b []float32) float64 {
	if a == nil || b == nil || len(a) != len(b) {
		return 0
	}
	return max(-1, min(1, float64(vek32.Dot(a, b)))) // SIMD: the run's O(n²) pass is all dot products
}

// Clusters joins facts whose similarity reaches sim (union-find) and
// returns the clusters of at least minSize facts, each by id, largest
// first (ties: the lower first id).
func Clusters(facts []Fact, sim float64, minSize int) [][]*Fact {
	n := len(facts)
	parent := make([]int, n)
	rank := make([]uint8, n)
	for i := range parent {
		parent[i] = i
	}
	var find func(int) int
	find = func(x int) int {
		for parent[x] != x {
			parent[x] = parent[parent[x]] // path halving
			x = parent[x]
		}
		return x
	}
	union := func(a, b int) {
		ra, rb := find(a), find(b)
		switch {
		case ra == rb:
		case rank[ra] < rank[rb]:
			parent[ra] = rb
		case rank[ra] > rank[rb]:
			parent[rb] = ra
		default:
			parent[rb] = ra
			rank[ra]++
		}
	}
	for i := 0; i < n; i++ {
		if facts[i].Vec == nil {
			continue
		}
		for j := i + 1; j < n; j++ {
			if facts[j].Vec != nil && CosineVec(facts[i].Vec, facts[j].Vec) >= sim {
				union(i, j)
			}
		}
	}
	groups := map[int][]*Fact{}
	for i := range facts {
		r := find(i)
		groups[r] = append(groups[r], &facts[i])
	}
	var out [][]*Fact
	for _, g := range groups {
		if len(g) >= minSize {
			slices.SortFunc(g, func(a, b *Fact) int { return strings.Compare(a.ID, b.ID) })
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b []*Fact) int {
		if c := cmp.Compare(len(b), len(a)); c != 0 {
			return c
		}
		return strings.Compare(a[0].ID, b[0].ID)
	})
	return out
}

// SplitCluster cuts a cluster into parts of at most maxSize facts, as even
// as they can be; parts below minSize are left out.
func SplitCluster(cl []*Fact, maxSize, minSize int) [][]*Fact {
	k := (len(cl) + maxSize - 1) / maxSize
	var out [][]*Fact
	for i := range k {
		part := cl[i*len(cl)/k : (i+1)*len(cl)/k]
		if len(part) >= minSize {
			out = append(out, part)
		}
	}
	return out
}

// The outcomes of a merge, as logs name them.
const (
	OutcomeKept      = "kept"
	OutcomeRejected  = "rejected"
	OutcomeSkipped   = "skipped"
	OutcomeMalformed = "malformed"
	OutcomeStale     = "stale"
	OutcomeError     = "error"
)

// Fidelity computes a merge's figures: 0.6 × the mean cosine similarity of
// merged (its unit vector) to the originals + 0.4 × keyword retention.
func Fidelity(merged []float32, text string, part []*Fact) MergeInfo {
	var sim float64
	for _, f := range part {
		sim += CosineVec(merged, f.Vec)
	}
	sim /= float64(len(part))
	kws := map[string]bool{}
	for _, f := range part {
		for _, k := range Keywords(f.Content) {
			kws[k] = true
		}
	}
	ret, lost := 1.0, []string(nil)
	if len(kws) > 0 {
		low := strings.ToLower(text)
		kept := 0
		for k := range kws {
			if strings.Contains(low, strings.ToLower(k)) {
				kept++
			} else {
				lost = append(lost, k)
			}
		}
		ret = float64(kept) / float64(len(kws))
		slices.Sort(lost)
		lost = lost[:min(len(lost), maxLostKeywords)]
	}
	round := func(x float64) float64 { return math.Round(x*1e4) / 1e4 }
	return MergeInfo{Similarity: round(sim), KeywordRetention: round(ret),
		Fidelity: round(l4SimWeight*sim + l4KeywordWeight*ret), LostKeywords: lost}
}

// MergePrompt is the merge prompt of one cluster.
func MergePrompt(part []*Fact) string {
	var b strings.Builder
	b.WriteString("You keep an assistant's long-term memory about a user compact. These facts overlap:\n\n")
	for _, f := range part {
		fmt.Fprintf(&b, "[%s] %s\n", f.ID, sanitize.Text(f.Content, MaxFactBytes))
	}
	fmt.Fprintf(&b, "\nMerge them into ONE standalone fact, in the language they are written in, that keeps every name, "+
		"number, identifier, date and detail they state (at most %d bytes). Answer with exactly one line, nothing else:\n"+
		"[MERGE] <the merged fact>\n"+
		"or, when they state different things that must stay apart:\n"+
		"[SKIP]\n", maxMergedBytes)
	return b.String()
}

// ParseMerge parses the memory model's answer to a merge prompt
// strictly: after trimming white space it must be exactly one line, either
// "[SKIP]" (skip) or "[MERGE] text", the text 1–1000 bytes of valid UTF-8
// without control, format or separator characters and without anything
// that looks like a memory operation. Anything else (other text, a second
// line, an unknown or lower-case tag, more than 2 KiB) is an error
// wrapping memerr.ErrInvalid.
func ParseMerge(out string) (text string, skip bool, err error) {
	bad := func(format string, a ...any) (string, bool, error) {
		return "", false, fmt.Errorf("%w: l4 merge: "+format, append([]any{memerr.ErrInvalid}, a...)...)
	}
	if len(out) > 2*maxMergedBytes+64 {
		return bad("answer of %d bytes", len(out))
	}
	if !utf8.ValidString(out) {
		return bad("invalid UTF-8")
	}
	line := strings.TrimSpace(out)
	switch {
	case line == "":
		return bad("empty answer")
	case strings.ContainsAny(line, "\r\n\u2028\u2029"):
		return bad("more than one line")
	case line == "[SKIP]":
		return "", true, nil
	}
	rest, ok := strings.CutPrefix(line, "[MERGE]")
	if !ok {
		return bad("does not start with [MERGE] or [SKIP]: %q", sanitize.Truncate(line, 80))
	}
	if rest == "" || rest[0] != ' ' {
		return bad("[MERGE] needs a space and a text")
	}
	text = strings.TrimSpace(rest)
	if err := ValidFactTextMax(text, maxMergedBytes); err != nil {
		return bad("%v", err)
	}
	if strings.Contains(strings.ToUpper(text), "[MERGE") {
		return bad("text contains a second tag")
	}
	return text, false, nil
}

// Keywords (Keywords), as the Loom design lists them: capitalised
// phrases ("Machine Learning") and words ("Tokyo", not stop words such as
// "The"), snake_case identifiers, dotted paths ("loom.memory.core"),
// ALL_CAPS identifiers ("HTTP_PROXY"), and runs of CJK ideographs split at
// stop words into segments of at least two characters. A capitalised or
// ALL_CAPS token must not touch another ASCII letter ("McDonald" is not a
// capitalised word).
var (
	l4SnakeRE  = regexp.MustCompile(`\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b`)
	l4DottedRE = regexp.MustCompile(`\b[a-z][a-z0-9]*(?:\.[a-z][a-z0-9]*)+\b`)
	l4CapsRE   = regexp.MustCompile(`[A-Z]{2,}(?:_[A-Z0-9]+)*`)
)

// l4EnglishStops are words that are no keyword when capitalised at the
// start of a sentence.
var l4EnglishStops = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`the a an is are was were be been being have has had do does did will would could
		should may might shall can need dare ought used to of in for on with at by from as into through during before
		after above below between out off over under again further then once here there when where why how all each
		every both few more most other some such no nor not only own same so than too very just because but and or if
		while that this these those it its i me my we our you your he him his she her they them their what which who whom`) {
		m[w] = true
	}
	return m
}()

// l4ChineseStops split CJK runs into keyword segments, longest first.
var l4ChineseStops = func() []string {
	ws := strings.Fields(`的 了 在 是 我 有 和 就 不 人 都 一 一个 上 也 很 到 说 要 去 你 会 着 没有 看 好 自己 这 他 她 它 们 那 些
		什么 没 把 又 被 从 这个 那个 但 还 而 对 以 可以 这样 已经 因为 如果 所以 但是 就是 可能 这些 那些 或者 虽然 然后 之后
		之前 通过 进行 使用 需要 应该 其中 以及 关于 对于 随着 由于 为了`)
	slices.SortStableFunc(ws, func(a, b string) int { return cmp.Compare(utf8.RuneCountInString(b), utf8.RuneCountInString(a)) })
	return ws
}()

func asciiLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// capitalised reports whether w is [A-Z][a-z]+.
func capitalised(w string) bool {
	if len(w) < 2 || w[0] < 'A' || w[0] > 'Z' {
		return false
	}
	for i := 1; i < len(w); i++ {
		if w[i] < 'a' || w[i] > 'z' {
			return false
		}
	}
	return true
}

func isCJKIdeograph(r rune) bool { return r >= 0x4e00 && r <= 0x9fff }

// Keywords returns text's keywords (see above), deduplicated, sorted.
func Keywords(text string) []string {
	set := map[string]bool{}
	// Capitalised words and phrases: maximal runs of ASCII letters, so a
	// word never touches another letter; a phrase is two or more such
	// words separated by ASCII white space only.
	type run struct{ lo, hi int }
	var phrase []run
	endPhrase := func() {
		if len(phrase) >= 2 {
			set[text[phrase[0].lo:phrase[len(phrase)-1].hi]] = true
		}
		phrase = phrase[:0]
	}
	for i := 0; i < len(text); {
		if !asciiLetter(text[i]) {
			i++
			continue
		}
		j := i
		for j < len(text) && asciiLetter(text[j]) {
			j++
		}
		w := text[i:j]
		if capitalised(w) {
			if !l4EnglishStops[strings.ToLower(w)] {
				set[w] = true
			}
			if n := len(phrase); n > 0 && strings.TrimLeft(text[phrase[n-1].hi:i], " \t\n\r\f\v") != "" {
				endPhrase()
			}
			phrase = append(phrase, run{i, j})
		} else {
			endPhrase()
		}
		i = j
	}
	endPhrase()
	for _, m := range l4SnakeRE.FindAllString(text, -1) {
		set[m] = true
	}
	for _, m := range l4DottedRE.FindAllString(text, -1) {
		set[m] = true
	}
	for _, loc := range l4CapsRE.FindAllStringIndex(text, -1) {
		lo, hi := loc[0], loc[1]
		if (lo == 0 || !asciiLetter(text[lo-1])) && (hi == len(text) || !asciiLetter(text[hi])) {
			set[text[lo:hi]] = true
		}
	}
	// CJK: runs of ideographs, stop words cut out, segments of ≥ 2.
	for i := 0; i < len(text); {
		r, size := utf8.DecodeRuneInString(text[i:])
		if !isCJKIdeograph(r) {
			i += size
			continue
		}
		j := i
		for j < len(text) {
			r, size := utf8.DecodeRuneInString(text[j:])
			if !isCJKIdeograph(r) {
				break
			}
			j += size
		}
		seg := text[i:j]
		for _, sw := range l4ChineseStops {
			seg = strings.ReplaceAll(seg, sw, "\x00")
		}
		for _, p := range strings.Split(seg, "\x00") {
			if utf8.RuneCountInString(p) >= 2 {
				set[p] = true
			}
		}
		i = j
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

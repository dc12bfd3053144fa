package workload

import (
	"bytes"
	"slices"
	"strings"
)

// What RunMemory measures of the prompts the upstream receives: how much
// of each session's previous prompt the next one shares (prefixAcc), and
// how much of each question's evidence reaches the prompt (recallAcc).

// prefixAcc accumulates PrefixReport.
type prefixAcc struct {
	rep          PrefixReport
	shared, prev float64
	// cached and prompts sum, over every turn, the previous prompt's
	// leading tokens the new one repeats and the new one's tokens;
	// shifted adds what an engine that moves KV serves past that prefix.
	cached, prompts, shifted float64
	shares                   []float64
	prevPrompt               *promptInfo
}

func (a *prefixAcc) add(cur promptInfo) {
	prev := a.prevPrompt
	a.prevPrompt = &cur
	if prev == nil {
		return
	}
	a.rep.Turns++
	// The longest run of the previous prompt's messages that leads the
	// new one: what an engine's prefix cache holding the previous prompt
	// serves of the new one.
	shared := 0
	for shared < len(prev.raws) && shared < len(cur.raws) && bytes.Equal(prev.raws[shared], cur.raws[shared]) {
		shared++
	}
	sharedTok, total, curTotal := 0, 0, 0
	for i, t := range prev.tokens {
		total += t
		if i < shared {
			sharedTok += t
		}
	}
	for _, t := range cur.tokens {
		curTotal += t
	}
	a.cached += float64(sharedTok)
	a.prompts += float64(curTotal)
	a.shifted += float64(sharedTok + movedTokens(prev, &cur, shared))
	if shared < len(prev.raws) {
		a.rep.Evictions++ // the prompt did not only grow: history left the window
		return
	}
	a.rep.Stable++
	a.shared += float64(sharedTok)
	a.prev += float64(total)
	a.shares = append(a.shares, 100*float64(sharedTok)/float64(max(total, 1)))
}

// movedTokens is what an engine that moves KV (llama.cpp's n_cache_reuse)
// serves of cur past the shared messages: cur's messages that prev holds
// further on, in order, until the first it does not hold, as llama-server
// walks the prompt (whole messages here, where it walks tokens).
func movedTokens(prev, cur *promptInfo, shared int) int {
	moved, from := 0, shared
	for j := shared; j < len(cur.raws); j++ {
		f := -1
		for i := from; i < len(prev.raws); i++ {
			if bytes.Equal(prev.raws[i], cur.raws[j]) {
				f = i
				break
			}
		}
		if f < 0 {
			break
		}
		moved += cur.tokens[j]
		from = f + 1
	}
	return moved
}

func (a *prefixAcc) report() PrefixReport {
	rep := a.rep
	if a.prompts > 0 {
		rep.CachedPct = recallRound1(100 * a.cached / a.prompts)
		rep.ShiftCachedPct = recallRound1(100 * a.shifted / a.prompts)
	}
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

// add counts one question and returns the ids of its evidence found in
// the prompt.
func (a *recallAcc) add(q LocomoQA, evidence map[string]string, prompt promptInfo) []string {
	found := 0
	var ids []string
	for _, id := range q.Evidence {
		if t, ok := evidence[id]; ok && strings.Contains(prompt.text, t) {
			found++
			ids = append(ids, id)
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
	return ids
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
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

package workload

// The long-document row of the archive study (archive.go): an extractive
// summary stands for each session in retrieval, the original kept
// compressed beside it.

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/kvsidecar/kvsidecar/index"
)

// archiveDocuments measures the long-document row: each session a
// document, an extractive summary within SummaryShare of its bytes stands
// for it in retrieval (BM25 over the conversation's sessions), the original
// kept, compressed with zstd. Recall@10 is of the sessions holding a
// question's evidence.
func archiveDocuments(convs []LocomoConversation, o ArchiveOptions) (ArchiveRow, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return ArchiveRow{}, err
	}
	defer enc.Close()
	row := ArchiveRow{Row: "long documents", Method: fmt.Sprintf("extractive summary within %.0f%% of each session's bytes (turns ranked by their terms' TF-IDF in the session), the original kept with zstd", 100*o.SummaryShare)}
	ctx := context.Background()
	var full, summ float64
	n := 0
	var summaries []string
	for _, c := range convs {
		sessions, ids := sessionDocs(c)
		df := map[string]int{}
		for _, s := range sessions {
			seen := map[string]bool{}
			for _, t := range index.Tokenize(strings.Join(s, "\n")) {
				if !seen[t] {
					seen[t] = true
					df[t]++
				}
			}
		}
		var fullDocs, sumDocs []index.Doc
		for i, s := range sessions {
			text := strings.Join(s, "\n")
			sum := extractiveSummary(s, df, len(sessions), int(o.SummaryShare*float64(len(text))))
			summaries = append(summaries, sum)
			row.RawBytes += int64(len(text))
			row.StoredBytes += int64(len(sum)) + int64(len(enc.EncodeAll([]byte(text), nil)))
			fullDocs = append(fullDocs, index.Doc{ID: ids[i], Text: text})
			sumDocs = append(sumDocs, index.Doc{ID: ids[i], Text: sum})
		}
		xf, err := index.New(index.Options{})
		if err != nil {
			return row, err
		}
		xs, err := index.New(index.Options{})
		if err != nil {
			return row, err
		}
		if err := xf.Upsert(ctx, fullDocs...); err != nil {
			return row, err
		}
		if err := xs.Upsert(ctx, sumDocs...); err != nil {
			return row, err
		}
		for _, q := range c.QA {
			ev := evidenceSessions(q.Evidence)
			if len(ev) == 0 {
				continue
			}
			hf, err := xf.Search(ctx, q.Question, 10, index.ModeBM25)
			if err != nil {
				return row, err
			}
			hs, err := xs.Search(ctx, q.Question, 10, index.ModeBM25)
			if err != nil {
				return row, err
			}
			full += evidenceRecall(hf, ev, 10)
			summ += evidenceRecall(hs, ev, 10)
			n++
		}
	}
	row.Recall10Base, row.Recall10 = 100*full/float64(max(n, 1)), 100*summ/float64(max(n, 1))
	var sumBytes int64
	for _, s := range summaries {
		sumBytes += int64(len(s))
	}
	row.DecodeMBps = 0 // a summary is read as it is; the original decodes as the text rows do
	row.Note = fmt.Sprintf("the summaries alone are %.1f%% of the documents (what retrieval reads); the original kept makes the total %.1f%% — a summary cannot be the only copy, so this row cannot reach 90%%; recall over %d questions, sessions as documents (about %d per conversation, so @10 is near the whole list)",
		100*float64(sumBytes)/float64(row.RawBytes), 100*float64(row.StoredBytes)/float64(row.RawBytes), n, len(summaries)/max(len(convs), 1))
	return row, nil
}

// sessionDocs returns a conversation's sessions (their turn texts) and
// their ids ("S<n>").
func sessionDocs(c LocomoConversation) ([][]string, []string) {
	var sessions [][]string
	var ids []string
	last := -1
	for _, t := range c.Turns {
		if t.Session != last {
			sessions = append(sessions, nil)
			ids = append(ids, "S"+strconv.Itoa(t.Session))
			last = t.Session
		}
		sessions[len(sessions)-1] = append(sessions[len(sessions)-1], LocomoTurnText(t, true, true))
	}
	return sessions, ids
}

// evidenceSessions maps evidence turn ids ("D3:5") to session ids ("S3").
func evidenceSessions(ev []string) []string {
	var out []string
	for _, e := range ev {
		m := locomoDiaID.FindStringSubmatch(e)
		if m == nil {
			continue
		}
		if id := "S" + m[1]; !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// extractiveSummary keeps the turns of a document whose terms weigh most
// (mean TF-IDF of their terms in the document, df over nDocs documents),
// best first until budget bytes (at least one), in their original order.
func extractiveSummary(turns []string, df map[string]int, nDocs, budget int) string {
	tf := map[string]int{}
	toks := make([][]string, len(turns))
	for i, t := range turns {
		toks[i] = index.Tokenize(t)
		for _, w := range toks[i] {
			tf[w]++
		}
	}
	type cand struct {
		i     int
		score float64
	}
	cands := make([]cand, len(turns))
	for i, ws := range toks {
		var s float64
		for _, w := range ws {
			s += float64(tf[w]) * math.Log(1+float64(nDocs)/float64(max(df[w], 1)))
		}
		cands[i] = cand{i, s / math.Sqrt(float64(max(len(ws), 1)))}
	}
	sort.SliceStable(cands, func(a, b int) bool { return cands[a].score > cands[b].score })
	var keep []int
	used := 0
	for _, c := range cands {
		if len(keep) > 0 && used+len(turns[c.i]) > budget {
			continue
		}
		keep = append(keep, c.i)
		used += len(turns[c.i]) + 1
	}
	slices.Sort(keep)
	var b strings.Builder
	for j, i := range keep {
		if j > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(turns[i])
	}
	return b.String()
}

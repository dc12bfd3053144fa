package workload

// The vector row of the archive study (archive.go): the turns' embeddings
// product-quantised (archive_pq.go) and searched against the exact ones.

import (
	"context"
	"fmt"
	"sort"

	"github.com/kvsidecar/kvsidecar/index"
)

// archiveVectors measures the vector row: each turn's embedding (with its
// previous turn, as the index embeds it) product-quantised with codebooks
// trained on all the tenant's vectors; recall@10 of vector search with the
// exact vectors against asymmetric distances to the codes.
func archiveVectors(convs []LocomoConversation, o ArchiveOptions) (ArchiveRow, string, error) {
	emb := index.NewHashEmbedder(index.HashOptions{})
	ctx := context.Background()
	type conv struct {
		ids   []string
		vecs  [][]float32
		codes [][]byte
	}
	var cs []conv
	var all [][]float32
	for _, c := range convs {
		var texts []string
		var cv conv
		for i, t := range c.Turns {
			text := LocomoTurnText(t, true, true)
			if i > 0 && c.Turns[i-1].Session == t.Session {
				text += "\n" + LocomoTurnText(c.Turns[i-1], true, true)
			}
			texts = append(texts, text)
			cv.ids = append(cv.ids, t.DiaID)
		}
		vecs, err := emb.Embed(ctx, texts)
		if err != nil {
			return ArchiveRow{}, "", err
		}
		cv.vecs = vecs
		all = append(all, vecs...)
		cs = append(cs, cv)
	}
	dim := emb.Dim()
	m := o.PQBytes
	if m == 0 {
		m = dim * 4 / 16
	}
	if m < 1 || dim%m != 0 {
		return ArchiveRow{}, "", fmt.Errorf("bench: archive: %d PQ subspaces do not divide %d dimensions", m, dim)
	}
	q, err := trainPQ(all, m, 256, 12, 1)
	if err != nil {
		return ArchiveRow{}, "", err
	}
	row := ArchiveRow{Row: "vectors", Method: fmt.Sprintf("product quantisation, %d subspaces × 256 centroids (%d:1 on float32 %d-d; codebooks trained on the tenant's %d vectors)", m, dim*4/m, dim, len(all)),
		SideBytes: int64(q.m * q.k * q.sub * 4)}
	var codes [][]byte
	for i := range cs {
		for _, v := range cs[i].vecs {
			c := q.encode(v)
			cs[i].codes = append(cs[i].codes, c)
			codes = append(codes, c)
			row.RawBytes += int64(4 * dim)
			row.StoredBytes += int64(len(c))
		}
	}
	row.StoredBytes += row.SideBytes
	out := make([]float32, dim)
	row.DecodeMBps = bestMBps(4*dim*len(codes), o.Repeat, func() {
		for _, c := range codes {
			q.decode(c, out)
		}
	})
	var exact, approx float64
	n := 0
	for ci, c := range convs {
		for _, qa := range c.QA {
			if len(qa.Evidence) == 0 {
				continue
			}
			qv, err := emb.Embed(ctx, []string{qa.Question})
			if err != nil {
				return row, "", err
			}
			se := make([]float32, len(cs[ci].vecs))
			for i, v := range cs[ci].vecs {
				se[i] = dot32(qv[0], v)
			}
			sa := q.scores(qv[0], cs[ci].codes)
			exact += evidenceRecall(topHits(cs[ci].ids, se, 10), qa.Evidence, 10)
			approx += evidenceRecall(topHits(cs[ci].ids, sa, 10), qa.Evidence, 10)
			n++
		}
	}
	row.Recall10Base, row.Recall10 = 100*exact/float64(max(n, 1)), 100*approx/float64(max(n, 1))
	row.Note = fmt.Sprintf("codebooks (%d KiB) counted once in stored bytes; without them %.1f%% saved", row.SideBytes>>10, 100*(1-float64(row.StoredBytes-row.SideBytes)/float64(row.RawBytes)))
	return row, emb.Name(), nil
}

// topHits returns the k ids of the highest scores, best first (ties by
// position).
func topHits(ids []string, scores []float32, k int) []index.Hit {
	order := make([]int, len(ids))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return scores[order[a]] > scores[order[b]] })
	hits := make([]index.Hit, 0, k)
	for _, i := range order[:min(k, len(order))] {
		hits = append(hits, index.Hit{ID: ids[i], Score: float64(scores[i])})
	}
	return hits
}

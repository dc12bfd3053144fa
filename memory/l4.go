package memory

import (
	"cmp"
	"context"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
)

// L4 compression's glue to the session (the Loom memory design's
// L4Compressor): when to run, the run itself, and applying a merge. What
// a run computes — clusters, fidelity, keywords, the prompt and the
// strict answer parser — is package memory/internal/knowledge's (l4.go),
// with the design's description.

// MergeInfo describes a fact made by L4 compression from others (see
// knowledge.MergeInfo).
type MergeInfo = knowledge.MergeInfo

// L4Stats count L4 compression (Stats embeds them).
type L4Stats = knowledge.L4Stats

// l4Task is one compression run: the session's facts when it was queued.
type l4Task struct {
	facts []knowledge.Fact
}

// factsLocked returns the session's facts (category fact) by id.
func factsLocked(sess *session) []*Unit {
	var fs []*Unit
	for _, u := range sess.units {
		if u.Category == CategoryFact {
			fs = append(fs, u)
		}
	}
	slices.SortFunc(fs, func(a, b *Unit) int { return strings.Compare(a.ID, b.ID) })
	return fs
}

// l4FactsFP fingerprints a fact set: ids, texts and last changes.
func l4FactsFP(fs []*Unit) uint64 {
	var h maphash.Hash
	h.SetSeed(keySeed)
	for _, u := range fs {
		knowledge.HashFact(&h, u.ID, u.Content, u.UpdatedAt)
	}
	return h.Sum64()
}

// maybeCompressLocked starts L4 compression when the session holds more
// than L4.Threshold facts and its fact set changed since the last run:
// without embeddings it prunes at once, else it queues a run. Called with
// sess.mu held, from the worker.
func (kn *learner) maybeCompressLocked(sess *session, now time.Time) {
	o := &kn.opts.L4
	if !o.Enabled || kn.ctx.Err() != nil || sess.l4.Running {
		return
	}
	n := 0
	for _, u := range sess.units {
		if u.Category == CategoryFact {
			n++
		}
	}
	if n <= o.Threshold {
		return // the common case: no list, no sort
	}
	fs := factsLocked(sess)
	fp := l4FactsFP(fs)
	if fp == sess.l4.LastFP {
		return
	}
	if kn.opts.Recall.IndexDisabled {
		sess.l4.LastFP = fp
		kn.pruneFactsLocked(sess, fs, now)
		return
	}
	if kn.opts.Extraction.Extractor == nil {
		return // nothing can merge
	}
	task := &l4Task{facts: make([]knowledge.Fact, len(fs))}
	for i, u := range fs {
		task.facts[i] = knowledge.Fact{ID: u.ID, Content: u.Content, Importance: u.Importance, Updated: u.UpdatedAt}
	}
	if !kn.q.TryPut(&extractJob{sess: sess, kind: jobL4, l4: task, model: sess.lastModel, enc: sess.lastEnc}) {
		kn.l4c.Dropped.Add(1) // the next sync tries again
		return
	}
	sess.refs.Add(1) // resident until the job ran (runExtract)
	sess.l4.Running = true
	sess.l4.LastFP = fp
}

// pruneFactsLocked is the fallback without embeddings: it keeps the
// L4.Threshold most important facts and deletes the others, least
// important first (ties: the older change, then the lower id).
func (kn *learner) pruneFactsLocked(sess *session, fs []*Unit, now time.Time) {
	kn.l4c.Runs.Add(1)
	over := len(fs) - kn.opts.L4.Threshold
	fs = slices.Clone(fs)
	slices.SortStableFunc(fs, func(a, b *Unit) int {
		if c := cmp.Compare(a.Importance, b.Importance); c != 0 {
			return c
		}
		return a.UpdatedAt.Compare(b.UpdatedAt)
	})
	ids := make([]string, 0, over)
	for _, u := range fs[:over] {
		ids = append(ids, u.ID)
		sess.deleteUnit(u.ID)
	}
	kn.l4c.Pruned.Add(int64(over))
	kn.jrn.persistLocked(sess, now)
	kn.opts.Logger.Info("memory: l4 pruned facts by importance (no embeddings)", "session", sess.id, "kept", kn.opts.L4.Threshold, "deleted", ids)
}

// runL4 runs one compression: clusters, merges, fidelity checks.
func (kn *learner) runL4(job *extractJob) {
	sess := job.sess
	defer func() {
		sess.mu.Lock()
		sess.l4.Running = false
		sess.mu.Unlock()
		kn.wk.enqueue(sess) // index what changed; another pass if the facts moved
	}()
	kn.l4c.Runs.Add(1)
	o := &kn.opts.L4
	facts := job.l4.facts
	texts := make([]string, len(facts))
	for i := range facts {
		texts[i] = facts[i].Content
	}
	vecs, err := kn.embed(texts)
	if err != nil {
		kn.l4c.Errs.Add(1)
		kn.opts.Logger.Warn("memory: l4 compression: embed facts", "session", sess.id, "err", err)
		return
	}
	for i := range facts {
		facts[i].Vec = vecs[i]
	}
	sess.mu.Lock()
	refused := maps.Clone(sess.l4.Refused)
	sess.mu.Unlock()
	merges := 0
	for _, cl := range knowledge.Clusters(facts, o.Similarity, o.MinCluster) {
		for _, part := range knowledge.SplitCluster(cl, o.MaxClusterFacts, o.MinCluster) {
			if merges >= o.MaxMerges || kn.ctx.Err() != nil {
				return
			}
			fp := knowledge.ClusterFP(part)
			if refused[fp] {
				continue
			}
			merges++
			kn.mergeCluster(job, part, fp)
		}
	}
}

// embed embeds texts with the index's Embedder, each vector at unit length
// (nil for a zero vector), within Extraction.Timeout.
func (kn *learner) embed(texts []string) ([][]float32, error) {
	ctx, cancel := context.WithTimeout(kn.ctx, kn.opts.Extraction.Timeout)
	defer cancel()
	return knowledge.Embed(ctx, kn.opts.Recall.Index.Embedder, texts)
}

// mergeCluster asks the memory model to merge one cluster, checks the
// merge's fidelity and applies it, or remembers the refusal.
func (kn *learner) mergeCluster(job *extractJob, part []*knowledge.Fact, fp uint64) {
	sess := job.sess
	ids := make([]string, len(part))
	for i, f := range part {
		ids[i] = f.ID
	}
	kn.l4c.Calls.Add(1)
	ctx, cancel := context.WithTimeout(kn.ctx, kn.opts.Extraction.Timeout)
	out, err := kn.opts.Extraction.Extractor.Extract(ctx, ExtractRequest{Tenant: sess.tenant, SessionID: sess.id, Model: job.model,
		Kind: jobL4.String(), Prompt: knowledge.MergePrompt(part)})
	cancel()
	if err != nil {
		kn.l4c.Errs.Add(1)
		kn.opts.Logger.Warn("memory: l4 merge", "session", sess.id, "facts", ids, "outcome", knowledge.OutcomeError, "err", err)
		return // not remembered: tried again on the next run
	}
	text, skip, err := knowledge.ParseMerge(out)
	switch {
	case err != nil:
		kn.l4c.Malformed.Add(1)
		kn.refuseCluster(sess, fp)
		kn.opts.Logger.Warn("memory: l4 merge", "session", sess.id, "facts", ids, "outcome", knowledge.OutcomeMalformed, "err", err)
		return
	case skip:
		kn.l4c.Skipped.Add(1)
		kn.refuseCluster(sess, fp)
		kn.opts.Logger.Info("memory: l4 merge", "session", sess.id, "facts", ids, "outcome", knowledge.OutcomeSkipped)
		return
	}
	vecs, err := kn.embed([]string{text})
	if err != nil {
		kn.l4c.Errs.Add(1)
		kn.opts.Logger.Warn("memory: l4 merge: embed the merged fact", "session", sess.id, "facts", ids, "outcome", knowledge.OutcomeError, "err", err)
		return
	}
	info := knowledge.Fidelity(vecs[0], text, part)
	info.From = ids
	if info.Fidelity < kn.opts.L4.Fidelity {
		kn.l4c.Rejected.Add(1)
		kn.refuseCluster(sess, fp)
		kn.opts.Logger.Info("memory: l4 merge", "session", sess.id, "facts", ids, "outcome", knowledge.OutcomeRejected,
			"fidelity", info.Fidelity, "similarity", info.Similarity, "keyword_retention", info.KeywordRetention,
			"lost_keywords", info.LostKeywords, "threshold", kn.opts.L4.Fidelity)
		return
	}
	id, ok := kn.applyMerge(job, part, text, info)
	if !ok {
		kn.l4c.Stale.Add(1)
		kn.opts.Logger.Info("memory: l4 merge", "session", sess.id, "facts", ids, "outcome", knowledge.OutcomeStale)
		return
	}
	kn.l4c.Merged.Add(1)
	kn.l4c.FactsMerged.Add(int64(len(part)))
	kn.opts.Logger.Info("memory: l4 merge", "session", sess.id, "facts", ids, "outcome", knowledge.OutcomeKept, "merged", id,
		"fidelity", info.Fidelity, "similarity", info.Similarity, "keyword_retention", info.KeywordRetention,
		"lost_keywords", info.LostKeywords)
}

// refuseCluster remembers a refused cluster (written with the session's
// next background write).
func (kn *learner) refuseCluster(sess *session, fp uint64) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.gone.Load() || !sess.exists {
		return
	}
	sess.l4.Refuse(fp, true)
	kn.jrn.persistLocked(sess, kn.opts.Clock.Now())
}

// applyMerge adds the merged fact and deletes the originals, unless one of
// them changed or left since the run saw it. It returns the new fact's id.
func (kn *learner) applyMerge(job *extractJob, part []*knowledge.Fact, text string, info MergeInfo) (string, bool) {
	sess := job.sess
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.gone.Load() || !sess.exists {
		return "", false
	}
	var from, to uint64 = math.MaxUint64, 0
	imp, acc := 0.0, 0
	var last time.Time
	for _, f := range part {
		u := sess.units[f.ID]
		if u == nil || u.Category != CategoryFact || u.Content != f.Content || !u.UpdatedAt.Equal(f.Updated) {
			return "", false
		}
		from, to = min(from, u.FromSeq), max(to, u.ToSeq)
		imp, acc = max(imp, u.Importance), acc+u.AccessCount
		if u.LastAccess.After(last) {
			last = u.LastAccess
		}
	}
	now := kn.opts.Clock.Now()
	if last.IsZero() {
		last = now
	}
	id := ""
	for n := 0; ; n++ {
		if id = mergedUnitID(to, n); sess.units[id] == nil && !sess.deleted[id] {
			break
		}
	}
	enc := job.enc
	u := &Unit{ID: id, Type: UnitFact, Tier: PlaceWorking, Role: "fact", Content: text, Importance: imp,
		Tokens: kn.tok.Count(enc, text), CreatedAt: now, UpdatedAt: now, LastAccess: last, AccessCount: acc,
		FromSeq: from, ToSeq: to, Category: CategoryFact, Merged: &info}
	touch(u, now)
	setReview(u)
	sess.units[id] = u
	sess.unitsChanged()
	sess.kb.MoveSupport(info.From, id)
	// The merged fact first, then the deletions: a crash between the two
	// appends keeps both, never neither.
	kn.jrn.persistLocked(sess, now)
	for _, f := range part {
		sess.deleteUnit(f.ID)
	}
	kn.jrn.persistLocked(sess, now)
	return id, true
}

func mergedUnitID(seq uint64, i int) string { return fmt.Sprintf("merged-%012d-%02d", seq, i) }

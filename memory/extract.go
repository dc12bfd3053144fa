package memory

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
	"github.com/kvsidecar/kvsidecar/memory/internal/reviewlog"
	"github.com/kvsidecar/kvsidecar/memory/internal/sanitize"
)

// ExtractRequest is one extraction call: its prompt and the session it is
// made for (package memory/internal/knowledge owns it).
type ExtractRequest = knowledge.ExtractRequest

// Extractor completes an extraction prompt with a model (package llm calls
// the upstream); see knowledge.Extractor.
type Extractor = knowledge.Extractor

// ExtractorFunc adapts a function to Extractor.
type ExtractorFunc = knowledge.ExtractorFunc

// The fact operations of an Extractor's reply (knowledge.FactOpKind).
const (
	FactAdd    = knowledge.FactAdd    // [ADD] text
	FactUpdate = knowledge.FactUpdate // [UPDATE:id] text
	FactBoost  = knowledge.FactBoost  // [BOOST:id]
	FactDelete = knowledge.FactDelete // [DELETE:id]
	FactSkip   = knowledge.FactSkip   // [SKIP]
)

type jobKind uint8

const (
	jobFacts jobKind = iota
	jobEpisode
	jobReview  // review.go
	jobToolCtx // toolctx.go
	jobL4      // l4.go
)

func (k jobKind) String() string {
	switch k {
	case jobEpisode:
		return "episode"
	case jobReview:
		return "review"
	case jobToolCtx:
		return "tool_context"
	case jobL4:
		return "l4_merge"
	}
	return "facts"
}

// The kinds of the sidecar's own model calls, for Stats.
const (
	callFacts = iota
	callEpisode
	callSummary
)

// extractJob is one Extractor call for a session.
type extractJob struct {
	sess     *session
	kind     jobKind
	from, to uint64          // message seqs covered
	known    map[string]bool // fact ids shown in the prompt: the only ids ops may name
	prompt   string
	enc      Encoding
	model    string

	review     *reviewTask // jobReview: the fact and what it was when queued
	forPrepare uint64      // jobToolCtx: the Prepare the context is for
	l4         *l4Task     // jobL4: the session's facts when it was queued
}

const (
	maxEpisodeBytes = 4096 // an episode's text
	maxMemoryBytes  = 4096 // a memory added with AddMemory
	maxPromptFacts  = 60   // known facts shown in a prompt
)

// maybeExtractLocked queues an extraction job when one is due: an episode
// when EpisodeEvery messages accumulated since the last, else facts when
// Every did. Extraction is coalesced per session: one job at a time, at
// most one started per completed client turn, each covering every message
// that waited (the newest that fit Extraction.PromptBytes), so a request
// of thousands of messages costs one call, not one per Every messages. A
// full queue drops the job (counted) and the session's next turn tries
// again. Called with sess.mu held, from the worker.
func (kn *learner) maybeExtractLocked(sess *session) {
	if kn.opts.Extraction.Extractor == nil || sess.extracting || kn.ctx.Err() != nil || sess.turns == sess.extractTurn {
		return
	}
	job := kn.episodeJobLocked(sess)
	if job == nil {
		job = kn.factJobLocked(sess)
	}
	if job == nil {
		return
	}
	job.model = sess.lastModel
	if !kn.q.TryPut(job) {
		kn.stats.extractDropped.Add(1)
		return
	}
	sess.refs.Add(1) // resident until the job ran (runExtract)
	sess.extracting = true
	sess.extractTurn = sess.turns
}

// newestThatFit returns the tail of es whose prompt lines fit budget bytes
// (at least one message).
func newestThatFit(es []*entry, budget int) []*entry {
	used := 0
	i := len(es)
	for i > 0 {
		n := knowledge.PromptLen(knowledge.Line{Role: es[i-1].msg.Role, Text: es[i-1].text()})
		if used+n > budget && i < len(es) {
			break
		}
		used += n
		i--
	}
	return es[i:]
}

// waitingLocked returns the history after seq, newest that fit one
// extraction prompt, and the last seq waiting, once at least every (> 0)
// messages wait; else nil.
func (kn *learner) waitingLocked(sess *session, seq uint64, every int) ([]*entry, uint64) {
	if every <= 0 {
		return nil, 0
	}
	var es []*entry
	for _, e := range sess.hist {
		if e.seq > seq {
			es = append(es, e)
		}
	}
	if len(es) < every {
		return nil, 0
	}
	return newestThatFit(es, kn.opts.Extraction.PromptBytes), es[len(es)-1].seq
}

func (kn *learner) episodeJobLocked(sess *session) *extractJob {
	// One episode for everything that waited; the part that does not fit
	// one prompt is covered by it (it stays in the log and the indexes).
	es, to := kn.waitingLocked(sess, sess.episodeSeq, kn.opts.Extraction.EpisodeEvery)
	if es == nil {
		return nil
	}
	return &extractJob{sess: sess, kind: jobEpisode, from: es[0].seq, to: to, prompt: knowledge.EpisodePrompt(promptLines(es)), enc: sess.lastEnc}
}

func (kn *learner) factJobLocked(sess *session) *extractJob {
	es, to := kn.waitingLocked(sess, sess.factSeq, kn.opts.Extraction.Every)
	if es == nil {
		return nil
	}
	var facts []*Unit
	for _, u := range sess.units {
		if u.Category == CategoryFact || u.Category == CategoryCore {
			facts = append(facts, u)
		}
	}
	slices.SortFunc(facts, func(a, b *Unit) int {
		if c := cmp.Compare(b.Importance, a.Importance); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	facts = facts[:min(len(facts), maxPromptFacts)]
	slices.SortFunc(facts, func(a, b *Unit) int { return strings.Compare(a.ID, b.ID) })
	known := make(map[string]bool, len(facts))
	shown := make([]knowledge.KnownFact, len(facts))
	for i, u := range facts {
		known[u.ID] = true
		shown[i] = knowledge.KnownFact{ID: u.ID, Content: u.Content, Review: u.Review}
	}
	return &extractJob{sess: sess, kind: jobFacts, from: es[0].seq, to: to, known: known,
		prompt: knowledge.FactPrompt(shown, promptLines(es)), enc: sess.lastEnc}
}

// promptLines are the messages as a prompt shows them.
func promptLines(es []*entry) []knowledge.Line {
	ls := make([]knowledge.Line, len(es))
	for i, e := range es {
		ls[i] = knowledge.Line{Role: e.msg.Role, Text: e.text()}
	}
	return ls
}

func (kn *learner) runExtract(job *extractJob) {
	defer kn.reg.unpin(job.sess)
	switch job.kind {
	case jobReview:
		kn.runReview(job)
		return
	case jobToolCtx:
		kn.runToolCtx(job)
		return
	case jobL4:
		kn.runL4(job)
		return
	}
	kn.stats.extractJobs.Add(1)
	if job.kind == jobEpisode {
		kn.stats.calls[callEpisode].Add(1)
	} else {
		kn.stats.calls[callFacts].Add(1)
	}
	ctx, cancel := context.WithTimeout(kn.ctx, kn.opts.Extraction.Timeout)
	out, err := kn.opts.Extraction.Extractor.Extract(ctx, ExtractRequest{Tenant: job.sess.tenant, SessionID: job.sess.id,
		Model: job.model, Kind: job.kind.String(), Prompt: job.prompt})
	cancel()
	sess := job.sess
	sess.mu.Lock()
	sess.extracting = false
	if sess.gone.Load() || !sess.exists {
		sess.mu.Unlock()
		return
	}
	if err != nil {
		sess.mu.Unlock()
		kn.stats.extractErrs.Add(1)
		kn.logBackground(err, "memory: extraction", "err", err)
		return
	}
	now := kn.opts.Clock.Now()
	if job.kind == jobEpisode {
		kn.applyEpisodeLocked(job, out, now)
	} else {
		kn.applyFactOpsLocked(job, out, now)
	}
	kn.jrn.persistLocked(sess, now)
	sess.mu.Unlock()
	kn.wk.enqueue(sess) // index the new memories (a next job waits for the next turn)
}

func (kn *learner) applyEpisodeLocked(job *extractJob, out string, now time.Time) {
	sess := job.sess
	text := sanitize.Text(out, maxEpisodeBytes)
	if strings.EqualFold(strings.TrimSpace(text), "[SKIP]") {
		// The model found nothing worth keeping: the messages are covered.
		sess.episodeSeq = max(sess.episodeSeq, job.to)
		sess.seqDirty = true
		return
	}
	if text == "" {
		kn.stats.extractErrs.Add(1)
		kn.opts.Logger.Warn("memory: extraction: empty episode")
		return
	}
	id := episodeUnitID(job.to)
	if sess.units[id] == nil && !sess.deleted[id] {
		u := &Unit{ID: id, Type: UnitEpisode, Tier: PlaceWorking, Role: "episode", Content: text,
			Importance: 1, Tokens: kn.tok.Count(job.enc, text), CreatedAt: now, UpdatedAt: now, LastAccess: now,
			FromSeq: job.from, ToSeq: job.to, Category: CategoryEpisode}
		touch(u, now)
		setReview(u)
		sess.units[id] = u
		sess.unitsChanged()
		kn.stats.episodes.Add(1)
	}
	sess.episodeSeq = max(sess.episodeSeq, job.to)
	sess.seqDirty = true
}

// applyFactOpsLocked parses the reply and applies the valid operations;
// every rejection is logged and counted, and changes nothing.
func (kn *learner) applyFactOpsLocked(job *extractJob, out string, now time.Time) {
	sess := job.sess
	out, triples := knowledge.CutTripleLines(out)
	ops, addN, rejected := knowledge.ParseFactOpsNumbered(out)
	for _, err := range rejected {
		kn.stats.factOpsRejected.Add(1)
		kn.opts.Logger.Warn("memory: rejected fact operation", "session", sess.id, "err", err)
	}
	next := 0
	added := map[int]string{} // the reply's n-th [ADD] → the unit holding its text
	for i, op := range ops {
		id, err := kn.applyFactOpLocked(job, op, now, &next)
		if err != nil {
			kn.stats.factOpsRejected.Add(1)
			kn.opts.Logger.Warn("memory: rejected fact operation", "session", sess.id, "op", op.Kind.String(), "err", err)
			continue
		}
		if addN[i] > 0 {
			added[addN[i]] = id
		}
		if op.Kind != knowledge.FactSkip {
			kn.stats.factOps.Add(1)
		}
	}
	kn.applyTriplesLocked(job, triples, added, now)
	sess.factSeq = max(sess.factSeq, job.to)
	sess.seqDirty = true
}

// applyFactOpLocked applies one operation; for an ADD it returns the id of
// the unit that holds the text: the new one, or the known one (the lowest
// id) it deduplicated to.
func (kn *learner) applyFactOpLocked(job *extractJob, op knowledge.FactOp, now time.Time, next *int) (string, error) {
	sess := job.sess
	var u *Unit
	if op.ID != "" {
		if !job.known[op.ID] {
			return "", fmt.Errorf("%w: unknown id %q", ErrInvalid, op.ID)
		}
		if u = sess.units[op.ID]; u == nil {
			return "", fmt.Errorf("%w: id %q was deleted", ErrInvalid, op.ID)
		}
	}
	switch op.Kind {
	case knowledge.FactSkip:
	case knowledge.FactAdd:
		n, known := 0, ""
		for _, x := range sess.units {
			if x.Category == "" {
				continue
			}
			n++
			if strings.EqualFold(x.Content, op.Text) && (known == "" || x.ID < known) {
				known = x.ID
			}
		}
		if known != "" {
			return known, nil
		}
		if n >= kn.opts.Extraction.MaxFacts {
			return "", fmt.Errorf("%w: %d memories, the most a session keeps", ErrInvalid, n)
		}
		id := factUnitID(job.to, *next)
		for sess.units[id] != nil || sess.deleted[id] {
			*next++
			id = factUnitID(job.to, *next)
		}
		*next++
		nu := &Unit{ID: id, Type: UnitFact, Tier: PlaceWorking, Role: "fact", Content: op.Text, Importance: 1,
			Tokens: kn.tok.Count(job.enc, op.Text), CreatedAt: now, UpdatedAt: now, LastAccess: now,
			FromSeq: job.from, ToSeq: job.to, Category: CategoryFact}
		touch(nu, now)
		setReview(nu)
		sess.units[id] = nu
		sess.unitsChanged()
		return id, nil
	case knowledge.FactUpdate:
		if u.Category != CategoryFact && u.Category != CategoryCore {
			return "", fmt.Errorf("%w: %q is a %s memory", ErrInvalid, op.ID, u.Category)
		}
		u.Content, u.Tokens, u.bow = op.Text, kn.tok.Count(job.enc, op.Text), nil
		u.UpdatedAt = now
		touch(u, now)
		u.persisted, u.indexed = false, false
		sess.unitsChanged()
	case knowledge.FactBoost:
		if !u.Category.Decays() && u.Category != CategoryCore {
			return "", fmt.Errorf("%w: %q is a %s memory", ErrInvalid, op.ID, u.Category)
		}
		return "", kn.boostLocked(u, now)
	case knowledge.FactDelete:
		if !u.Category.Decays() {
			return "", fmt.Errorf("%w: %q is a %s memory", ErrInvalid, op.ID, u.Category)
		}
		sess.deleteUnit(op.ID)
	}
	return "", nil
}

// learner is the knowledge subsystem's glue to the sessions: what the
// sidecar learns in the background from a session's turns (extract.go,
// triples.go, review.go, l4.go, toolctx.go, categories.go), applied under
// the session's lock — fact extraction and episodes, fact operations and
// triples, the memory reviewer and its decisions logs, L4 compression,
// tool-result context, decay and boosts. The prompts' grammar, the
// algorithms, the options and the extraction queue are package
// memory/internal/knowledge's; the queue's goroutines are started and
// waited for here (start, wait).
//
// Invariants: never on the request path (Prepare only reads a condensed
// tool context, toolTurnLocked); a full queue drops a job (counted), never
// blocks; one job in flight per session, at most one started per
// completed client turn; a model's reply is parsed strictly and a bad line
// is rejected alone; a session stays resident while a job of it is queued
// or running (its refs, unpinned when the job ran); every change it makes
// to a session is made under the session's lock and written by persist.
type learner struct {
	*env
	recall  *retriever
	revLogs *reviewlog.Logs // the reviewer's decisions logs

	q *knowledge.Queue[*extractJob] // the extraction queue and its goroutines

	rev reviewer             // the reviewer's in-flight scopes and counters (review.go)
	tcs toolCtxStat          // tool-result context counters (toolctx.go)
	l4c knowledge.L4Counters // L4 compression counters (l4.go)

	// What knowledge asks of the other subsystems, wired at Open as the
	// worker's are: write what a session left unwritten (jrn), queue it
	// for the worker (wk), end a lookup (reg), find its user (users).
	jrn   *sessionJournal
	wk    *worker
	reg   *registry
	users *userScope
}

// wait waits for the extraction goroutines, which end with the store's
// ctx, until ctx ends; it reports whether they ended.
func (kn *learner) wait(ctx context.Context) bool { return kn.q.Wait(ctx) }

// start starts the extraction goroutines (none without an Extractor).
func (kn *learner) start() {
	if kn.opts.Extraction.Extractor == nil {
		return
	}
	kn.q.Start(kn.ctx, kn.opts.Extraction.Workers, kn.runExtract)
}

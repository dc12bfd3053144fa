package memory

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
	"github.com/kvsidecar/kvsidecar/memory/internal/pool"
	"github.com/kvsidecar/kvsidecar/memory/internal/retention"
	"github.com/kvsidecar/kvsidecar/memory/internal/reviewlog"
	"github.com/kvsidecar/kvsidecar/memory/internal/userlist"
)

// env is what the Store's subsystems share, fixed at Open: the options,
// the token counter, the logs' journal, the counters (atomics) and the
// store's lifetime (ctx, cancelled when Shutdown starts). Read-only.
type env struct {
	opts  Options
	tok   *Tokenizer
	j     *journal.Journal // the logs' files and format (memory/internal/journal)
	stats storeStats
	ctx   context.Context
}

// Store is memory's front: Open, Shutdown, Prepare a turn (Turn completes
// it), the session views, Delete, and thin calls into the subsystems it
// owns, each with its state, its lock and its goroutines. Open it once;
// Close it after the last request. Safe for concurrent use.
type Store struct {
	*env
	cancel context.CancelFunc // ends env.ctx
	files  *durable.Files     // bounds the log files held open

	reg    *registry       // what is loaded, and the closed flag (resident.go)
	jrn    *sessionJournal // the sessions' logs (sessionlog.go, shared.go)
	win    *windowBuilder  // builds the windows, no I/O (window.go, block.go)
	recall *retriever      // the indexes and what a turn recalls (recall.go)
	know   *learner        // what is learnt in the background; its goroutines (extract.go)
	wk     *worker         // the background writes; its goroutine (worker.go)
	users  *userScope      // which user a session recalls with (users.go)

	lists   *userlist.Lists    // the users' session lists (memory/internal/userlist)
	pools   *pool.Pools        // the tenants' shared pools (memory/internal/pool)
	sweeper *retention.Sweeper // the retention sweep; its goroutine (memory/internal/retention)
}

// Open opens (creating if needed) the store rooted at opts.Dir and starts
// its worker. Sessions load lazily on first use.
func Open(opts Options) (*Store, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("memory: create %s: %w", opts.Dir, err)
	}
	files := durable.NewFiles(opts.Storage.MaxOpenFiles)
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{
		env: &env{opts: opts, tok: NewTokenizer(opts.Window.TokenCacheEntries), ctx: ctx,
			j: journal.New(journal.Options{MaxRecord: opts.MaxRecordBytes, Quarantine: filepath.Join(opts.Dir, "quarantine"),
				Files: files, SyncAppends: opts.Fsync == FsyncAlways, NoSync: opts.Fsync == FsyncNever,
				Now: opts.Clock.Now, Logger: opts.Logger})},
		cancel: cancel,
		files:  files,
	}
	enc := CL100K
	if opts.Window.Encoding != "" {
		enc, _ = encodingByName(opts.Window.Encoding)
	}
	if err := s.tok.Load(enc); err != nil {
		cancel()
		return nil, fmt.Errorf("memory: load encoding %s: %w", enc, err)
	}
	// The subsystems with their own state, then what each needs of the
	// others, then their goroutines.
	s.lists = userlist.New(userlist.Options{Journal: s.j, NoSync: opts.Fsync == FsyncNever, Logger: opts.Logger})
	s.jrn = &sessionJournal{env: s.env}
	s.recall = &retriever{env: s.env, ixOpts: opts.Recall.Index}
	_, s.recall.localEmbedder = opts.Recall.Index.Embedder.(*index.HashEmbedder)
	s.reg = &registry{env: s.env, sessions: map[string]*session{}, users: map[string]*userMem{}, trimC: make(chan struct{}, 1)}
	s.know = &learner{env: s.env, q: knowledge.NewQueue[*extractJob](opts.Extraction.Queue),
		revLogs: reviewlog.New(reviewlog.Options{Dir: opts.Dir, Journal: s.j, Size: opts.Reviewer.LogSize})}
	s.wk = &worker{env: s.env, queue: make(chan *session, opts.QueueSize), stop: make(chan struct{}),
		sumSem: make(chan struct{}, max(1, opts.Extraction.MaxConcurrentSummaries))}
	s.users = &userScope{env: s.env, lists: s.lists}
	s.win = &windowBuilder{opts: &s.opts, tok: s.tok}
	s.pools = newPools(s)

	s.jrn.listSession = s.users.listSession
	s.jrn.loaded = func(sess *session, now time.Time) {
		s.know.maybeDecayLocked(sess, now)
		if sess.decayDirty {
			s.wk.enqueue(sess)
		}
	}
	s.recall.enqueue = s.wk.enqueue
	s.reg.jrn, s.reg.recall, s.reg.sync, s.reg.ensureUser = s.jrn, s.recall, s.wk.sync, s.users.ensureUser
	s.know.recall, s.know.jrn, s.know.wk, s.know.reg, s.know.users = s.recall, s.jrn, s.wk, s.reg, s.users
	s.wk.reg, s.wk.jrn, s.wk.recall, s.wk.know, s.wk.lists, s.wk.holdUserFor = s.reg, s.jrn, s.recall, s.know, s.lists, s.users.holdUserFor
	s.users.reg, s.users.recall, s.users.jrn = s.reg, s.recall, s.jrn

	s.wk.start()
	s.sweeper = newSweeper(s)
	s.know.start()
	return s, nil
}

// Close is Shutdown without a deadline.
func (s *Store) Close() error { return s.Shutdown(context.Background()) }

// Shutdown closes the store within ctx's deadline whatever is running. It
// first cancels everything in flight that waits or computes (token
// counting in Prepare and Complete, summaries, extraction, remote
// embedding), so no request holds a session for long; then it lets the
// worker drain its queue, writes what the last turns left (units, access
// counts) and the changed indexes, and closes (and, unless FsyncNever,
// fsyncs) every log. When ctx ends first it stops waiting: goroutines still
// running finish on their own, index files not yet saved are rebuilt on
// the next load, and sessions whose lock it could not take keep their log
// open until the process exits (every acknowledged record is already
// written). Turns not yet completed can no longer record their reply. Later
// calls return nil at once.
func (s *Store) Shutdown(ctx context.Context) error {
	s.reg.mu.Lock()
	if s.reg.closed {
		s.reg.mu.Unlock()
		return nil
	}
	s.reg.closed = true
	s.reg.mu.Unlock()
	s.cancel() // ends the extraction goroutines and what computes or waits
	s.wk.requestStop()
	var errs []error
	if !(s.sweeper.Stop(ctx) && s.wk.wait(ctx) && s.know.wait(ctx)) {
		errs = append(errs, fmt.Errorf("memory: shutdown: background work still running: %w", ctx.Err()))
	}
	s.reg.mu.Lock()
	loaded := make([]*session, 0, len(s.reg.sessions))
	for _, sess := range s.reg.sessions {
		loaded = append(loaded, sess)
	}
	s.reg.mu.Unlock()
	for _, sess := range loaded {
		if ctx.Err() != nil {
			break
		}
		// Write what the last turns left (units, deletions), then the indexes.
		if !lockCtx(ctx, &sess.mu) {
			break
		}
		if !sess.gone.Load() && sess.exists {
			s.jrn.persistLocked(sess, s.opts.Clock.Now())
		}
		sess.mu.Unlock()
		s.recall.syncIndex(sess, true)
		s.wk.syncUser(sess)
	}
	s.reg.mu.Lock()
	users := make([]*userMem, 0, len(s.reg.users))
	for _, um := range s.reg.users {
		users = append(users, um)
	}
	s.reg.mu.Unlock()
	for _, um := range users {
		if ctx.Err() != nil {
			break
		}
		s.recall.saveUser(um, true)
	}
	s.lists.Sync()
	errs = append(errs, s.pools.Close(), s.know.closeReviewLogs())
	skipped := 0
	for _, sess := range loaded {
		if !lockCtx(ctx, &sess.mu) {
			skipped++
			continue
		}
		if sess.log != nil {
			errs = append(errs, sess.log.Close())
			sess.log = nil
		}
		sess.gone.Store(true)
		sess.mu.Unlock()
	}
	if skipped > 0 {
		errs = append(errs, fmt.Errorf("memory: shutdown: %d sessions still busy: %w", skipped, ctx.Err()))
	}
	s.reg.mu.Lock()
	for _, sess := range loaded {
		s.reg.dropSessionLocked(sess)
	}
	s.reg.mu.Unlock()
	return errors.Join(errs...)
}

// waitGroup waits for wg until ctx ends; it reports whether wg finished.
func waitGroup(ctx context.Context, wg *sync.WaitGroup) bool {
	if ctx.Done() == nil {
		wg.Wait()
		return true
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// lockCtx locks mu unless ctx ends first; it reports whether it locked.
// Without a deadline it simply locks.
func lockCtx(ctx context.Context, mu *sync.Mutex) bool {
	if ctx.Done() == nil {
		mu.Lock()
		return true
	}
	for d := 50 * time.Microsecond; ; d = min(2*d, 10*time.Millisecond) {
		if mu.TryLock() {
			return true
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return mu.TryLock()
		case <-t.C:
		}
	}
}

// Encoding returns the encoding used for model.
func (s *Store) Encoding(model string) Encoding {
	if s.opts.Window.Encoding != "" {
		e, _ := encodingByName(s.opts.Window.Encoding)
		return e
	}
	if name, ok := lookupModel(s.opts.Window.ModelEncodings, model); ok {
		e, _ := encodingByName(name)
		return e
	}
	return EncodingForModel(model)
}

// Limit returns the window's hard token limit for model.
func (s *Store) Limit(model string) int {
	if l, ok := lookupModel(s.opts.Window.ModelLimits, model); ok {
		return l
	}
	return s.opts.Window.Limit
}

// CountTokensContext counts text with model's encoding for what goes into
// a window (the raw JSON of a request's tools/functions to pass to
// Prepare): it stops when ctx is done or the store closes, and once
// the count passes model's window limit, returning a lower bound above the
// limit that Prepare refuses (so huge tools cost about a window's worth of
// counting).
func (s *Store) CountTokensContext(ctx context.Context, model, text string) (int, error) {
	ctx, stop := s.withStore(ctx)
	defer stop()
	n, _, err := s.tok.countUpTo(ctx, s.Encoding(model), text, s.Limit(model))
	if err != nil {
		return 0, fmt.Errorf("memory: count tokens: %w", err)
	}
	return n, nil
}

// withStore returns ctx, also cancelled when the store closes, and the
// function that releases it.
func (e *env) withStore(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(e.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

package knowledge

import (
	"context"
	"sync"
)

// Queue is the extraction queue and the goroutines that drain it: every
// background model call of the subsystem (facts, episodes, reviews, tool
// context, L4 merges) is one job on it. It never blocks its caller: a full
// queue refuses the job (TryPut), which its caller counts and retries
// after the session's next turn. The goroutines run until the context
// given to Start ends; Wait waits for them. Safe for concurrent use.
type Queue[J any] struct {
	ch chan J
	wg sync.WaitGroup
}

// NewQueue returns a queue of size jobs (at least 1).
func NewQueue[J any](size int) *Queue[J] { return &Queue[J]{ch: make(chan J, max(1, size))} }

// TryPut queues j unless the queue is full; it reports whether it did.
func (q *Queue[J]) TryPut(j J) bool {
	select {
	case q.ch <- j:
		return true
	default:
		return false
	}
}

// Start starts n goroutines (at least 1) that run each queued job until
// ctx ends; jobs still queued then are not run.
func (q *Queue[J]) Start(ctx context.Context, n int, run func(J)) {
	for range max(1, n) {
		q.wg.Add(1)
		go func() {
			defer q.wg.Done()
			for {
				select {
				case j := <-q.ch:
					run(j)
				case <-ctx.Done():
					return
				}
			}
		}()
	}
}

// Wait waits for the goroutines until ctx ends; it reports whether they
// ended. Without a deadline it simply waits.
func (q *Queue[J]) Wait(ctx context.Context) bool {
	if ctx.Done() == nil {
		q.wg.Wait()
		return true
	}
	done := make(chan struct{})
	go func() { q.wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

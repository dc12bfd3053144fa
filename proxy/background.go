package proxy

// The Server's work after responses: reply recording and the engine's
// after-hooks run on goroutines bgTasks tracks, so Shutdown can wait for
// them; quietSignal lets tests wait until nothing is left running.

import (
	"sync"
	"sync/atomic"
)

// bgTasks runs work after responses in goroutines it tracks. Once closed
// (Shutdown ran out of grace while streams were still open) it runs new work
// inline, so a late stream never races a Wait. The zero value is ready.
type bgTasks struct {
	// mu protects closed and orders Add before Wait.
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
	// running counts tasks not yet done; quiet (when set) is poked as
	// each ends.
	running atomic.Int64
	quiet   *quietSignal
}

func (b *bgTasks) run(f func()) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		f()
		return
	}
	b.wg.Add(1)
	b.running.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		f()
		b.running.Add(-1)
		b.quiet.poke()
	}()
}

// quietSignal lets a waiter sleep until a condition on counters that other
// goroutines decrement holds (see Server.waitIdle in the tests): poke costs
// one atomic load while nobody waits. A nil *quietSignal ignores pokes;
// cond.L must be &mu before the first wait.
type quietSignal struct {
	waiting atomic.Int32
	// mu orders a waiter's check of its condition before its Wait against
	// a poke's Broadcast.
	mu   sync.Mutex
	cond sync.Cond
}

func (q *quietSignal) poke() {
	if q == nil || q.waiting.Load() == 0 {
		return
	}
	q.mu.Lock()
	q.cond.Broadcast()
	q.mu.Unlock()
}

// wait returns once done() is true; done is re-checked after every poke.
func (q *quietSignal) wait(done func() bool) {
	q.waiting.Add(1)
	defer q.waiting.Add(-1)
	q.mu.Lock()
	defer q.mu.Unlock()
	for !done() {
		q.cond.Wait()
	}
}

func (b *bgTasks) closeAndWait() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

package durable

import (
	"container/list"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
)

// Files bounds the file descriptors that open logs hold. Each Log opened
// with it is an entry of a least-recently-used list; when more than Max are
// open, the least recently used idle ones are closed (fsynced first unless
// NoSync) and reopen on their next append, which costs one open(2). A log
// busy in another goroutine is never waited for: it is skipped. If opening
// a file still hits the process's descriptor limit (EMFILE, ENFILE), half
// of the open logs are closed and the open is tried once more.
// Safe for concurrent use.
type Files struct {
	max int

	reopens, idled atomic.Int64

	// mu protects lru and every Log's elem.
	mu  sync.Mutex
	lru list.List // of *Log with an open file; front is the most recent
}

// NewFiles returns a bound of max open log files; max ≤ 0 means
// DefaultMaxOpen().
func NewFiles(max int) *Files {
	if max <= 0 {
		max = DefaultMaxOpen()
	}
	return &Files{max: max}
}

// Max returns the bound.
func (c *Files) Max() int { return c.max }

// FileStats count what Files did.
type FileStats struct {
	Open    int   // log files open now
	Max     int   // the bound
	Reopens int64 // idle logs reopened by an append
	Idled   int64 // log files closed to stay under the bound
}

// Stats returns the current counts.
func (c *Files) Stats() FileStats {
	c.mu.Lock()
	n := c.lru.Len()
	c.mu.Unlock()
	return FileStats{Open: n, Max: c.max, Reopens: c.reopens.Load(), Idled: c.idled.Load()}
}

// touch marks l (whose file is open, l.mu held) most recently used and
// closes the least recently used others beyond the bound.
func (c *Files) touch(l *Log) {
	c.mu.Lock()
	if l.elem == nil {
		l.elem = c.lru.PushFront(l)
	} else {
		c.lru.MoveToFront(l.elem)
	}
	victims := c.pickLocked(c.lru.Len()-c.max, l)
	c.mu.Unlock()
	c.idle(victims)
}

// shed closes half of the open logs other than keep (whose mu may be held),
// after the process ran out of descriptors.
func (c *Files) shed(keep *Log) {
	c.mu.Lock()
	victims := c.pickLocked(max(1, c.lru.Len()/2), keep)
	c.mu.Unlock()
	c.idle(victims)
}

// pickLocked takes up to n least recently used logs other than keep whose
// lock is free, removes them from the list and returns them locked.
func (c *Files) pickLocked(n int, keep *Log) []*Log {
	var out []*Log
	for e := c.lru.Back(); e != nil && len(out) < n; {
		prev := e.Prev()
		v := e.Value.(*Log)
		if v != keep && v.mu.TryLock() {
			c.lru.Remove(e)
			v.elem = nil
			out = append(out, v)
		}
		e = prev
	}
	return out
}

func (c *Files) idle(victims []*Log) {
	for _, v := range victims {
		v.idle()
		v.mu.Unlock()
		c.idled.Add(1)
	}
}

// forget removes a closing log (l.mu held).
func (c *Files) forget(l *Log) {
	c.mu.Lock()
	if l.elem != nil {
		c.lru.Remove(l.elem)
		l.elem = nil
	}
	c.mu.Unlock()
}

func isFDLimit(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

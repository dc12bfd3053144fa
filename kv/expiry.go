package kv

// The TTL: a min-heap of expiry times and the one goroutine the Cache owns
// that deletes blocks as they expire.

import (
	"container/heap"
	"time"
)

// expiryLoop deletes blocks as their TTL passes. It sleeps until the
// earliest expiry or until a Put wakes it.
func (c *Cache) expiryLoop() {
	defer c.wg.Done()
	for {
		now := c.opts.Clock.Now()
		next, ok := c.expireDue(now)
		var wake <-chan time.Time
		if ok {
			wake = c.opts.Clock.After(next.Sub(now))
		}
		select {
		case <-c.done:
			return
		case <-c.kick:
		case <-wake:
		}
	}
}

// expireDue deletes every block whose expiry is not after now and returns
// the next expiry.
func (c *Cache) expireDue(now time.Time) (time.Time, bool) {
	var due []string
	c.mu.Lock()
	for len(c.expHeap) > 0 {
		top := c.expHeap[0]
		if cur, ok := c.expires[top.key]; !ok || !cur.Equal(top.at) {
			heap.Pop(&c.expHeap) // superseded by a later Put, or gone
			continue
		}
		if top.at.After(now) {
			break
		}
		heap.Pop(&c.expHeap)
		if id, h, ok := parseCacheKey(top.key); ok {
			c.unindexLocked(top.key, id, h)
		}
		due = append(due, top.key)
	}
	var next time.Time
	ok := len(c.expHeap) > 0
	if ok {
		next = c.expHeap[0].at
	}
	c.mu.Unlock()
	for _, k := range due {
		_ = c.store.Delete(k) // already gone is fine
	}
	return next, ok
}

type expiryItem struct {
	at  time.Time
	key string
}

type expiryHeap []expiryItem

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiryItem)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

package cachesim

import (
	"container/heap"
	"math"
	"slices"
)

// Belady replays t under Belady's OPT on capacity entries: on a miss with a
// full cache, evict the entry whose next use lies furthest ahead (a key
// deleted before its next use has none).
func Belady(t Trace, capacity int) float64 {
	next := make([]int, len(t.Keys))
	last := map[uint64]int{}
	for i := len(t.Keys) - 1; i >= 0; i-- {
		k := t.Keys[i]
		if j, ok := last[k]; ok {
			next[i] = j
		} else {
			next[i] = math.MaxInt
		}
		if t.deleted(i) {
			delete(last, k)
		} else {
			last[k] = i
		}
	}
	cur := map[uint64]int{} // key → its next use
	h := &optHeap{}
	hits, n := 0, 0
	for i, k := range t.Keys {
		if t.deleted(i) {
			delete(cur, k) // its heap item is now stale
			continue
		}
		n++
		if _, ok := cur[k]; ok {
			hits++
		} else if len(cur) >= capacity {
			for {
				top := heap.Pop(h).(optItem)
				if n, ok := cur[top.key]; ok && n == top.next {
					delete(cur, top.key)
					break
				}
			}
		}
		cur[k] = next[i]
		heap.Push(h, optItem{key: k, next: next[i]})
	}
	return ratio(hits, n)
}

// optItem is a key and its next use; superseded items stay in the heap
// and are skipped when popped.
type optItem struct {
	key  uint64
	next int
}

type optHeap []optItem

func (h optHeap) Len() int           { return len(h) }
func (h optHeap) Less(i, j int) bool { return h[i].next > h[j].next }
func (h optHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *optHeap) Push(x any)        { *h = append(*h, x.(optItem)) }
func (h *optHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// StaticOracle is the hit ratio of a cache that holds the capacity most
// frequent keys of t from the start: every access to them is a hit but
// the first, and the first after each deletion.
func StaticOracle(t Trace, capacity int) float64 {
	count := map[uint64]int{} // accesses that can hit
	live := map[uint64]bool{}
	n := 0
	for i, k := range t.Keys {
		if t.deleted(i) {
			live[k] = false
			continue
		}
		n++
		if live[k] {
			count[k]++
		}
		live[k] = true
	}
	counts := make([]int, 0, len(count))
	for _, c := range count {
		counts = append(counts, c)
	}
	slices.SortFunc(counts, func(a, b int) int { return b - a })
	hits := 0
	for _, c := range counts[:min(capacity, len(counts))] {
		hits += c
	}
	return ratio(hits, n)
}

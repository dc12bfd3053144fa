package cachesim

import (
	"container/heap"
	"math"
	"slices"
)

// Belady replays t under Belady's OPT on capacity entries: on a miss with a
// full cache, evict the entry whose next use lies furthest ahead.
func Belady(t Trace, capacity int) float64 {
	next := make([]int, len(t.Keys))
	last := map[uint64]int{}
	for i := len(t.Keys) - 1; i >= 0; i-- {
		if j, ok := last[t.Keys[i]]; ok {
			next[i] = j
		} else {
			next[i] = math.MaxInt
		}
		last[t.Keys[i]] = i
	}
	cur := map[uint64]int{} // key → its next use
	h := &optHeap{}
	hits := 0
	for i, k := range t.Keys {
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
	return ratio(hits, len(t.Keys))
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
// frequent keys of t from the start: every access to them but the first
// is a hit.
func StaticOracle(t Trace, capacity int) float64 {
	count := map[uint64]int{}
	for _, k := range t.Keys {
		count[k]++
	}
	counts := make([]int, 0, len(count))
	for _, c := range count {
		counts = append(counts, c)
	}
	slices.SortFunc(counts, func(a, b int) int { return b - a })
	hits := 0
	for _, c := range counts[:min(capacity, len(counts))] {
		hits += c - 1
	}
	return ratio(hits, len(t.Keys))
}

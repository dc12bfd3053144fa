package main

import (
	"github.com/maypok86/otter/v2"

	"github.com/kvsidecar/kvsidecar/bench/workload/cachesim"
)

// wTinyLFU is the reference W-TinyLFU: otter's cache (Caffeine's design: an
// admission window, a count-min frequency sketch, segmented LRU for the
// main space, a hill climber that sizes the window), bounded by entries,
// its maintenance run inline as otter's own simulator does.
var wTinyLFU = cachesim.Contender{Name: "w-tinylfu (otter)", New: func(capacity int) (cachesim.Policy, error) {
	c, err := otter.New(&otter.Options[uint64, struct{}]{
		MaximumSize:     capacity,
		InitialCapacity: capacity,
		Executor:        func(fn func()) { fn() },
	})
	if err != nil {
		return nil, err
	}
	return otterPolicy{c}, nil
}}

type otterPolicy struct {
	c *otter.Cache[uint64, struct{}]
}

func (otterPolicy) Name() string { return "w-tinylfu (otter)" }

func (p otterPolicy) Get(k uint64) bool {
	_, ok := p.c.GetIfPresent(k)
	return ok
}

func (p otterPolicy) Set(k uint64) { p.c.Set(k, struct{}{}) }

func (p otterPolicy) Delete(k uint64) { p.c.Invalidate(k) }

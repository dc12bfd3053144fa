package main

import (
	"github.com/kvsidecar/kvsidecar/memory"
	"github.com/kvsidecar/kvsidecar/proxy"
)

// knowledge shows the memory store's knowledge base in the console
// (proxy.Knowledge).
type knowledge struct{ mem *memory.Store }

func (k knowledge) Triples(tenant, user string, limit int) ([]proxy.Triple, error) {
	ts, err := k.mem.Triples(tenant, user, limit)
	out := make([]proxy.Triple, len(ts))
	for i, t := range ts {
		out[i] = proxy.Triple{ID: t.ID, Subject: t.Subject, Predicate: t.Predicate, Object: t.Object, Support: t.Support, At: t.At}
	}
	return out, err
}

func (k knowledge) Reviews(tenant, user string, limit int) ([]proxy.Review, error) {
	rs, err := k.mem.Reviews(tenant, user, limit)
	out := make([]proxy.Review, len(rs))
	for i, r := range rs {
		out[i] = proxy.Review{FactID: r.FactID, Session: r.Session, Decision: r.Decision, Trigger: r.Trigger, Rounds: r.Rounds, At: r.At, Reason: r.Reason}
	}
	return out, err
}

func (k knowledge) DeleteTriple(tenant, user, id string) error {
	return k.mem.DeleteTriple(tenant, user, id)
}

package admin

// The knowledge base as the console sees it: Triple, Review and the
// Knowledge interface a Server is given, then the routes.

import (
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/memory"
)

// Triple and Review are the knowledge base's types as package memory
// defines them (one type per concept across the seam): the console serves
// them as they are.
type (
	Triple = memory.Triple
	Review = memory.Review
)

// Knowledge is what the console shows of the knowledge base beside the
// memories, per tenant and user ("" is the tenant's default user). Results
// are copies, newest first, at most limit. *memory.Store implements it;
// an unknown triple is an error matching memory.ErrNotFound.
type Knowledge interface {
	Triples(tenant, user string, limit int) ([]Triple, error)
	Reviews(tenant, user string, limit int) ([]Review, error)
	DeleteTriple(tenant, user, id string) error
}

// The console's knowledge routes: /admin/v1/triples and /admin/v1/reviews
// through Options.Knowledge.

func (a *adminReq) knowledgeUser() (string, bool) {
	u, ok := a.user()
	if !ok {
		return "", false
	}
	if u == nil {
		return "", true
	}
	return *u, true
}

func (a *adminReq) triples() {
	if a.done {
		return
	}
	user, ok := a.knowledgeUser()
	if !ok {
		return
	}
	out := []Triple{}
	if k := a.s.opts.Knowledge; k != nil {
		ts, err := k.Triples(a.tenantV, user, adminMaxList)
		if err != nil {
			a.storeErr(err)
			return
		}
		out = append(out, ts...)
	}
	a.ok(fasthttp.StatusOK, map[string]any{"object": "list", "data": out, "available": a.s.opts.Knowledge != nil})
}

func (a *adminReq) reviews() {
	if a.done {
		return
	}
	user, ok := a.knowledgeUser()
	if !ok {
		return
	}
	out := []Review{}
	if k := a.s.opts.Knowledge; k != nil {
		rs, err := k.Reviews(a.tenantV, user, adminMaxList)
		if err != nil {
			a.storeErr(err)
			return
		}
		out = append(out, rs...)
	}
	a.ok(fasthttp.StatusOK, map[string]any{"object": "list", "data": out, "available": a.s.opts.Knowledge != nil})
}

func (a *adminReq) deleteTriple(id string) {
	if a.done {
		return
	}
	user, ok := a.knowledgeUser()
	if !ok {
		return
	}
	k := a.s.opts.Knowledge
	if k == nil {
		a.fail(fasthttp.StatusNotFound, typeNotFound, "knowledge_disabled", "this sidecar keeps no triples")
		return
	}
	if err := k.DeleteTriple(a.tenantV, user, id); err != nil {
		if errors.Is(err, memory.ErrNotFound) {
			a.fail(fasthttp.StatusNotFound, typeNotFound, "triple_not_found", "no such triple for this tenant and user")
			return
		}
		a.storeErr(err)
		return
	}
	a.s.log.Info("admin: triple deleted", "tenant", a.tenantV, "user", user, "id", id)
	a.ok(fasthttp.StatusOK, map[string]any{"id": id, "object": "triple.deleted", "deleted": true})
}

package llamacpp

// Native requests: a client using llama.cpp's own API beside the OpenAI
// routes the proxy reads (/completion, /infill, /slots/{id}?action=…,
// with or without id_slot) while sessions run through the sidecar. A
// request that computes on a slot is placed like a stateless chat request
// (its id_slot, when the client named one, is honoured: the slot's
// session KV is saved first), so it never lands on a slot whose KV a
// session holds unsaved; a slot action keeps the connector's own saves and
// restores off that slot while it runs, saves a session's unsaved KV
// there before a restore or erase replaces it, and forgets what the slot
// held after. Every other native route is not the connector's business.

import (
	"bytes"
	"context"
	"net/url"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/kvsidecar/kvsidecar/engine"
)

// computeRoutes are llama.cpp's routes (tools/server/server.cpp at
// 3f545becc) whose requests run on a slot, beside the OpenAI chat and
// completions the proxy already hands the connector.
var computeRoutes = map[string]bool{
	"/completion": true, "/completions": true, "/chat/completions": true, "/infill": true,
	"/embedding": true, "/embeddings": true, "/v1/embeddings": true,
	"/rerank": true, "/reranking": true, "/v1/rerank": true, "/v1/reranking": true,
	"/v1/messages": true, "/v1/responses": true, "/responses": true,
	"/v1/messages/count_tokens": false, // tokenizes only
}

// Route is the connector's engine.Router: llama.cpp's native routes that
// touch its slots.
func (c *Connector) Route(method, path []byte) engine.Route {
	if string(method) != "POST" {
		return engine.Route{}
	}
	p, q, _ := bytes.Cut(path, []byte("?"))
	dec, err := url.PathUnescape(string(p)) // the server routes the decoded path
	if err != nil {
		return engine.Route{}
	}
	if computeRoutes[dec] {
		return engine.Route{Kind: engine.RouteCompute}
	}
	rest, ok := cutPrefix(dec, "/slots/")
	if !ok {
		return engine.Route{}
	}
	id, err := strconv.Atoi(rest)
	if err != nil || id < 0 || id >= len(c.ops) {
		return engine.Route{} // the server answers it; no slot of ours moves
	}
	v, _ := url.ParseQuery(string(q))
	return engine.Route{Kind: engine.RouteSlotAction, Slot: id, Changes: v.Get("action") != "save"}
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return "", false
	}
	return s[len(prefix):], true
}

// clientSlot is the id_slot a native request names, or -1.
func (c *Connector) clientSlot(body []byte) int {
	v := gjson.GetBytes(body, "id_slot")
	if v.Type != gjson.Number {
		return -1
	}
	if id := int(v.Int()); id >= 0 && id < len(c.ops) {
		return id
	}
	return -1
}

// beforeSlotAction brackets a client's slot action (see the file's
// comment); afterSlotAction ends it. The slot's operation lock is held
// from one to the other.
func (c *Connector) beforeSlotAction(ctx context.Context, req *request) ([]byte, error) {
	id := req.Native.Slot
	if c.closed.Load() || id < 0 || id >= len(c.ops) {
		return req.Body, nil
	}
	c.ops[id].Lock()
	req.action, req.slot = true, id
	c.mu.Lock()
	sl := c.sched.slots[id]
	sl.inflight++ // no placement chooses it while the action runs
	save := req.Native.Changes && sl.holds() && sl.dirty
	owner, ch, fp := sl.owner, sl.chain, c.fp
	c.mu.Unlock()
	if save {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.SlotTimeout)
		defer cancel()
		c.nativeSaves.Add(1)
		c.saver.save(sctx, id, owner, ch, fp, 0)
	}
	return req.Body, nil
}

func (c *Connector) afterSlotAction(req *request) {
	req.action = false
	c.mu.Lock()
	sl := c.sched.slots[req.slot]
	sl.inflight = max(0, sl.inflight-1)
	if req.Native.Changes {
		c.sched.lose(sl) // what the client put there is not ours to know
	}
	c.signalLocked()
	c.mu.Unlock()
	c.ops[req.slot].Unlock()
}

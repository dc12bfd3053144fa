package proxy

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/memory"
)

// fakeConnector rewrites the body and records the hooks it saw.
type fakeConnector struct {
	mu     sync.Mutex
	before []string
	after  []engine.Response
	forgot []string
}

func (f *fakeConnector) Name() string { return "fake" }
func (f *fakeConnector) Before(_ context.Context, r *engine.Request) ([]byte, error) {
	f.mu.Lock()
	f.before = append(f.before, r.Tenant+"/"+r.SessionID+"/"+r.Model)
	f.mu.Unlock()
	return append([]byte(`{"id_slot":3,`), bytes.TrimPrefix(r.Body, []byte("{"))...), nil
}
func (f *fakeConnector) After(_ context.Context, _ *engine.Request, resp *engine.Response) {
	r := *resp
	r.Body = append([]byte(nil), resp.Body...) // valid only during After
	f.mu.Lock()
	f.after = append(f.after, r)
	f.mu.Unlock()
}
func (f *fakeConnector) SessionStats(string, string) (engine.SessionStats, bool) {
	return engine.SessionStats{}, false
}
func (f *fakeConnector) Stats() engine.Stats                     { return engine.Stats{Connector: "fake", Enabled: true} }
func (f *fakeConnector) Close() error                            { return nil }
func (f *fakeConnector) Settle(context.Context, *engine.Request) {}
func (f *fakeConnector) Forget(_ context.Context, tenant, session string) error {
	f.mu.Lock()
	f.forgot = append(f.forgot, tenant+"/"+session)
	f.mu.Unlock()
	return nil
}

// Every chat request goes through the hooks, stateless ones too (a
// connector placing requests on slots must see them all).
func TestEngineHooksWrapEachRequest(t *testing.T) {
	up := newRecordingUpstream(t)
	fc := &fakeConnector{}
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Engine = fc })

	post(t, base+"/v1/chat/completions", chatBody, map[string]string{"X-Session-ID": "s1", "Authorization": "Bearer k"})
	post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hey"}]}`, map[string]string{"X-Session-ID": "s1", "Authorization": "Bearer k"})
	post(t, base+"/v1/chat/completions", chatBody, nil)                                     // stateless
	post(t, base+"/v1/chat/completions", chatBody, map[string]string{"X-Session-ID": "s1"}) // anonymous: stateless too
	waitFor(t, srv, func() bool { fc.mu.Lock(); defer fc.mu.Unlock(); return len(fc.after) == 4 })

	bodies := up.Bodies()
	for i, b := range bodies {
		if !strings.HasPrefix(b, `{"id_slot":3,`) {
			t.Fatalf("upstream body %d: %q", i, b)
		}
	}
	if len(bodies) != 4 {
		t.Fatalf("upstream bodies %q", bodies)
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if len(fc.before) != 4 || fc.before[0] != tenantOf([]byte("Bearer k"))+"/s1/m" || fc.before[2] != "//m" || fc.before[3] != "//m" {
		t.Fatalf("before hooks %q", fc.before)
	}
	var stream, plain *engine.Response
	for i := range fc.after {
		if fc.after[i].Stream {
			stream = &fc.after[i]
		} else {
			plain = &fc.after[i]
		}
	}
	if plain == nil || plain.Status != 200 || !strings.Contains(string(plain.Body), `"chat.completion"`) {
		t.Fatalf("after (plain) %+v", plain)
	}
	if stream == nil || stream.Status != 200 || !strings.Contains(string(stream.Body), `"hey"`) {
		t.Fatalf("after (stream) %+v", stream)
	}
}

// DELETE /v1/sessions/{id} has the connector forget the session's KV, for
// the caller's tenant only.
func TestSessionDeleteForgetsEngineKV(t *testing.T) {
	up := newRecordingUpstream(t)
	fc := &fakeConnector{}
	st := openMemory(t, memory.Options{})
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Engine, o.Memory = fc, st })
	post(t, base+"/v1/chat/completions", chatBody, map[string]string{"X-Session-ID": "s1", "Authorization": "Bearer k"})
	waitFor(t, srv, func() bool { fc.mu.Lock(); defer fc.mu.Unlock(); return len(fc.after) == 1 })
	for _, key := range []string{"other", "k"} {
		req, _ := http.NewRequest(http.MethodDelete, base+"/v1/sessions/s1", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := noPoolClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if len(fc.forgot) != 1 || fc.forgot[0] != tenantOf([]byte("Bearer k"))+"/s1" {
		t.Fatalf("forgot %q", fc.forgot)
	}
}

package proxy

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/kvsidecar/kvsidecar/engine"
)

// fakeConnector rewrites the body and records the hooks it saw.
type fakeConnector struct {
	mu     sync.Mutex
	before []string
	after  []engine.Response
}

func (f *fakeConnector) Name() string { return "fake" }
func (f *fakeConnector) Before(_ context.Context, r *engine.Request) ([]byte, error) {
	f.mu.Lock()
	f.before = append(f.before, r.Tenant+"/"+r.SessionID+"/"+r.Model)
	f.mu.Unlock()
	return append([]byte(`{"id_slot":3,`), bytes.TrimPrefix(r.Body, []byte("{"))...), nil
}
func (f *fakeConnector) After(_ context.Context, _ *engine.Request, resp *engine.Response) {
	f.mu.Lock()
	f.after = append(f.after, *resp)
	f.mu.Unlock()
}
func (f *fakeConnector) SessionStats(string, string) (engine.SessionStats, bool) {
	return engine.SessionStats{}, false
}
func (f *fakeConnector) Stats() engine.Stats { return engine.Stats{Connector: "fake", Enabled: true} }
func (f *fakeConnector) Close() error        { return nil }

func TestEngineHooksWrapEachSessionRequest(t *testing.T) {
	up := newRecordingUpstream(t)
	fc := &fakeConnector{}
	base, _ := startSidecar(t, up.URL, func(o *Options) { o.Engine = fc })

	post(t, base+"/v1/chat/completions", chatBody, map[string]string{"X-Session-ID": "s1", "Authorization": "Bearer k"})
	post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hey"}]}`, map[string]string{"X-Session-ID": "s1", "Authorization": "Bearer k"})
	post(t, base+"/v1/chat/completions", chatBody, nil)                                     // stateless: no hooks
	post(t, base+"/v1/chat/completions", chatBody, map[string]string{"X-Session-ID": "s1"}) // anonymous: stateless too
	waitFor(t, func() bool { fc.mu.Lock(); defer fc.mu.Unlock(); return len(fc.after) == 2 })

	up.mu.Lock()
	bodies := up.bodies
	up.mu.Unlock()
	if !strings.HasPrefix(bodies[0], `{"id_slot":3,`) || !strings.HasPrefix(bodies[1], `{"id_slot":3,`) || strings.Contains(bodies[2], "id_slot") || strings.Contains(bodies[3], "id_slot") {
		t.Fatalf("upstream bodies %q", bodies)
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if len(fc.before) != 2 || fc.before[0] != tenantOf([]byte("Bearer k"))+"/s1/m" {
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

package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/hctx"
	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
	"github.com/kvsidecar/kvsidecar/memory"
)

// fakeSnapConnector is a connector that keeps "states": its export is a
// string naming the session, its check refuses with refuse.
type fakeSnapConnector struct {
	fakeConnector
	smu      sync.Mutex
	refuse   error
	imported []string
}

func (f *fakeSnapConnector) ExportStates(_ context.Context, tenant, id string, maxBytes int64) ([]byte, engine.StatesInfo, error) {
	if maxBytes < 1000 {
		return []byte("none"), engine.StatesInfo{Skipped: 1}, nil
	}
	return []byte("states of " + id), engine.StatesInfo{States: 1, Tokens: 42, Bytes: 1000, Fingerprint: "fp"}, nil
}

func (f *fakeSnapConnector) CheckStates(_ context.Context, tenant string, section []byte) (engine.StatesInfo, error) {
	f.smu.Lock()
	defer f.smu.Unlock()
	if f.refuse != nil {
		return engine.StatesInfo{}, f.refuse
	}
	return engine.StatesInfo{States: 1}, nil
}

func (f *fakeSnapConnector) ImportStates(ctx context.Context, tenant, id string, section []byte) (engine.StatesInfo, error) {
	if _, err := f.CheckStates(ctx, tenant, section); err != nil {
		return engine.StatesInfo{}, err
	}
	f.smu.Lock()
	f.imported = append(f.imported, id+"="+string(section))
	f.smu.Unlock()
	return engine.StatesInfo{States: 1, Tokens: 42, Bytes: 1000, Fingerprint: "fp"}, nil
}

func doReq(t *testing.T, method, url string, body []byte, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	return sidecartest.Do(t, noPoolClient, method, url, string(body), hdr)
}

// A session's snapshot, exported from one sidecar and imported into
// another, gives the same session there: history, memory, and the engine's
// states. Only the caller's own session is exported, only into the same end
// user's; a damaged file, another model, a file too large are refused and
// write nothing.
func TestSnapshotExportImport(t *testing.T) {
	up := newRecordingUpstream(t)
	ea, eb := &fakeSnapConnector{}, &fakeSnapConnector{}
	ma, mb := openMemory(t, memory.Options{}), openMemory(t, memory.Options{})
	a, srvA := startSidecar(t, up.URL, func(o *Options) { o.Memory, o.Engine = ma, ea })
	b, _ := startSidecar(t, up.URL, func(o *Options) { o.Memory, o.Engine, o.MaxSnapshotBytes = mb, eb, 1<<20 })
	ann := map[string]string{"X-Session-ID": "s1", "Authorization": "Bearer k", "X-User-ID": "ann"}
	for i := range 3 {
		resp, body := post(t, a+"/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}]}`, i), ann)
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: %d %s", i, resp.StatusCode, body)
		}
	}
	srvA.waitIdle()
	key := map[string]string{"Authorization": "Bearer k", "X-User-ID": "ann"}

	// Only the caller's own session: the API key and the end user.
	for _, hdr := range []map[string]string{{"Authorization": "Bearer k"}, {"Authorization": "Bearer other", "X-User-ID": "ann"}, {"Authorization": "Bearer k", "X-User-ID": "bob"}} {
		resp, body := doReq(t, http.MethodGet, a+"/v1/sessions/s1/snapshot", nil, hdr)
		wantOpenAIError(t, resp, body, 404, "session_not_found")
	}
	resp, body := doReq(t, http.MethodGet, a+"/v1/sessions/s1/snapshot", nil, nil)
	wantOpenAIError(t, resp, body, 401, "missing_api_key")
	resp, file := doReq(t, http.MethodGet, a+"/v1/sessions/s1/snapshot", nil, key)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != SnapshotContentType {
		t.Fatalf("export: %d %s %.200s", resp.StatusCode, resp.Header.Get("Content-Type"), file)
	}
	secs, err := hctx.Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	var man snapshotManifest
	mj, _ := hctx.Find(secs, hctx.KindManifest)
	if err := json.Unmarshal(mj, &man); err != nil || man.Format != snapshotFormat || man.Session != "s1" || man.User != "ann" ||
		man.Memory.Messages != 6 || man.Engine == nil || man.Engine.States != 1 {
		t.Fatalf("manifest %s (%v)", mj, err)
	}
	if es, _ := hctx.Find(secs, hctx.KindEngine); string(es) != "states of s1" {
		t.Fatalf("engine section %q", es)
	}

	// Refused whole, nothing written: damage, another end user, another
	// model, a file over the bound, a newer version.
	refused := func(what string, f []byte, hdr map[string]string, status int, code string) {
		t.Helper()
		resp, body := doReq(t, http.MethodPut, b+"/v1/sessions/s1/snapshot", f, hdr)
		wantOpenAIError(t, resp, body, status, code)
		if resp, _ := doReq(t, http.MethodGet, b+"/v1/sessions/s1", nil, key); resp.StatusCode != 404 {
			t.Fatalf("%s: the refused import left a session (%d)", what, resp.StatusCode)
		}
	}
	for _, i := range []int{0, 5, 40, len(file) / 2, len(file) - 9, len(file) - 1} {
		x := bytes.Clone(file)
		x[i] ^= 1
		refused(fmt.Sprintf("byte %d flipped", i), x, key, 400, "snapshot_corrupt")
	}
	refused("cut", file[:len(file)-100], key, 400, "snapshot_corrupt")
	refused("empty", nil, key, 400, "snapshot_corrupt")
	refused("another end user", file, map[string]string{"Authorization": "Bearer k", "X-User-ID": "bob"}, 403, "user_mismatch")
	refused("no end user", file, map[string]string{"Authorization": "Bearer k"}, 403, "user_mismatch")
	refused("too large", append(bytes.Clone(file), make([]byte, 1<<20)...), key, 413, "body_too_large")
	eb.refuse = fmt.Errorf("%w: saved by model x", engine.ErrOtherModel)
	refused("another model", file, key, 409, "snapshot_other_model")
	eb.refuse = engine.ErrUnavailable
	refused("engine down", file, key, 503, "engine_unavailable")
	eb.refuse = nil
	resp, body = doReq(t, http.MethodPost, b+"/v1/sessions/s1/snapshot", file, key)
	wantOpenAIError(t, resp, body, 405, "method_not_allowed")

	// Imported: the same session, and the engine's states under it.
	resp, body = doReq(t, http.MethodPut, b+"/v1/sessions/s1/snapshot", file, key)
	var res snapshotResult
	if resp.StatusCode != 201 || json.Unmarshal(body, &res) != nil || res.Replaced || res.Memory.Messages != 6 || res.Engine == nil || res.Engine.States != 1 {
		t.Fatalf("import: %d %s", resp.StatusCode, body)
	}
	if len(eb.imported) != 1 || eb.imported[0] != "s1=states of s1" {
		t.Fatalf("engine imports %q", eb.imported)
	}
	get := func(base, path string) string {
		t.Helper()
		resp, body := doReq(t, http.MethodGet, base+path, nil, key)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		var v map[string]any
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatal(err)
		}
		delete(v, "updated_at")
		delete(v, "engine")
		out, _ := json.Marshal(v)
		return string(out)
	}
	for _, p := range []string{"/v1/sessions/s1", "/v1/sessions/s1/memory"} {
		if ga, gb := get(a, p), get(b, p); ga != gb {
			t.Fatalf("%s differs:\nA %s\nB %s", p, ga, gb)
		}
	}
	// The next turn on B continues the conversation.
	resp, body = post(t, b+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"question 3"}]}`, ann)
	if resp.StatusCode != 200 || !strings.Contains(up.Last(), "question 0") || !strings.Contains(up.Last(), "question 3") {
		t.Fatalf("next turn on B: %d %s, upstream saw %s", resp.StatusCode, body, up.Last())
	}
	// Again: the caller's session is replaced.
	resp, body = doReq(t, http.MethodPut, b+"/v1/sessions/s1/snapshot", file, key)
	if resp.StatusCode != 201 || json.Unmarshal(body, &res) != nil || !res.Replaced {
		t.Fatalf("re-import: %d %s", resp.StatusCode, body)
	}
	if eb.forgot[len(eb.forgot)-1] != tenantOf([]byte("Bearer k"))+"/s1" {
		t.Fatalf("the replaced session's KV was not dropped: %q", eb.forgot)
	}
	// Another end user's session of the same id is not overwritten.
	post(t, b+"/v1/chat/completions", chatBody, map[string]string{"X-Session-ID": "s9", "Authorization": "Bearer k", "X-User-ID": "bob"})
	resp, body = doReq(t, http.MethodPut, b+"/v1/sessions/s9/snapshot", file, key)
	wantOpenAIError(t, resp, body, 409, "session_exists")

	// An export keeps within the bound: states that do not fit stay out.
	c, _ := startSidecar(t, up.URL, func(o *Options) { o.Memory, o.Engine, o.MaxSnapshotBytes = mb, eb, 65<<10 })
	resp, file2 := doReq(t, http.MethodGet, c+"/v1/sessions/s1/snapshot", nil, key)
	secs, err = hctx.Parse(file2)
	if resp.StatusCode != 200 || err != nil {
		t.Fatalf("bounded export: %d %v", resp.StatusCode, err)
	}
	mj, _ = hctx.Find(secs, hctx.KindManifest)
	if json.Unmarshal(mj, &man) != nil || man.Engine == nil || man.Engine.States != 0 || man.Engine.Skipped != 1 {
		t.Fatalf("bounded manifest %s", mj)
	}

	// Counted.
	resp, body = doReq(t, http.MethodGet, adminURL(t, b)+"/metrics", nil, nil)
	for _, want := range []string{`sidecar_snapshots_total{outcome="imported"} 2`, `sidecar_snapshots_total{outcome="refused"} 12`} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("metrics lack %s:\n%s", want, body)
		}
	}
}

// Without an engine that keeps states, a snapshot still moves the memory;
// the answer says the KV did not come along.
func TestSnapshotWithoutStatefulEngine(t *testing.T) {
	up := newRecordingUpstream(t)
	ma, mb := openMemory(t, memory.Options{}), openMemory(t, memory.Options{})
	a, srvA := startSidecar(t, up.URL, func(o *Options) { o.Memory, o.Engine = ma, &fakeSnapConnector{} })
	b, _ := startSidecar(t, up.URL, func(o *Options) { o.Memory, o.Engine = mb, &fakeConnector{} })
	hdr := map[string]string{"X-Session-ID": "s1", "Authorization": "Bearer k"}
	post(t, a+"/v1/chat/completions", chatBody, hdr)
	srvA.waitIdle()
	key := map[string]string{"Authorization": "Bearer k"}
	_, file := doReq(t, http.MethodGet, a+"/v1/sessions/s1/snapshot", nil, key)
	resp, body := doReq(t, http.MethodPut, b+"/v1/sessions/s1/snapshot", file, key)
	var res snapshotResult
	if resp.StatusCode != 201 || json.Unmarshal(body, &res) != nil || res.Engine != nil || !strings.Contains(res.Note, "recomputes") || res.Memory.Messages != 2 {
		t.Fatalf("import: %d %s", resp.StatusCode, body)
	}
	// And a sidecar without such an engine exports memory only.
	_, file = doReq(t, http.MethodGet, b+"/v1/sessions/s1/snapshot", nil, key)
	secs, err := hctx.Parse(file)
	if _, ok := hctx.Find(secs, hctx.KindEngine); err != nil || ok || len(secs) != 2 {
		t.Fatalf("export without states: %v %+v", err, secs)
	}
}

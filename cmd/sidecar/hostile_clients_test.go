package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/faultup"
)

// The hostile harness's clients (see hostile_test.go): requests that meet
// each upstream fault, the issue 12 rows, KV PUTs, and random methods,
// paths, headers and bodies, each with the outcome a client must see.

type hostileWorker struct {
	w    int
	rng  *rand.Rand
	addr string
	run  *hostileRun
	seq  *atomic.Int64
}

// faultRequest sends a well-formed chat or completions request that meets
// one upstream fault and checks the outcome a client must see.
func (hw *hostileWorker) faultRequest() {
	rng := hw.rng
	f := faultup.All[rng.IntN(len(faultup.All))]
	stream := rng.IntN(2) == 0
	chat := rng.IntN(5) > 0
	n := hw.seq.Add(1)
	user := fmt.Sprintf("w%d says hello number %d", hw.w, n)
	hdr := [][2]string{{"X-Fault", string(f)}, {"Content-Type", "application/json"}}
	key, session := "", ""
	switch rng.IntN(4) {
	case 0: // stateless
	case 1: // anonymous with a session id: stateless too
		hdr = append(hdr, [2]string{"X-Session-ID", "anon"})
	default: // a tenant's session, owned by this worker
		key, session = fmt.Sprintf("key-%d", hw.w%3), fmt.Sprintf("w%d-s%d", hw.w, rng.IntN(3))
		hdr = append(hdr, [2]string{"Authorization", "Bearer " + key}, [2]string{"X-Session-ID", session}, [2]string{"X-Session-Mode", "append"})
	}
	path, body := "/v1/chat/completions", fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":%q}]}`, stream, user)
	if !chat {
		path, body = "/v1/completions", fmt.Sprintf(`{"model":"m","stream":%v,"prompt":%q}`, stream, user)
	}
	kind := fmt.Sprintf("fault %s stream=%v", f, stream)
	hw.run.count(hw.run.rep.Inputs, "upstream fault")
	r, err := rawDo(hw.addr, buildRequest("POST", path, hdr, []byte(body)), "POST", 30*time.Second)
	if err != nil {
		hw.run.count(hw.run.rep.NoResponse, "upstream fault")
		hw.run.fail("%s: no answer: %v", kind, err)
		return
	}
	want := faultup.Expect(f, stream)
	cause := "sidecar"
	code := errorCode(r.body)
	switch {
	case r.header.Get("X-Faultup") != "":
		cause = "upstream status passed through (injected)"
	case want == faultup.Broken && (strings.HasPrefix(code, "upstream_") || code == "upstream_timeout"):
		cause = "upstream fault (injected): " + code
	}
	hw.run.seen(r, cause)
	if r.status >= 500 && cause == "sidecar" {
		hw.run.fail("%s: %d %.200s", kind, r.status, r.body)
		return
	}
	switch want {
	case faultup.Clean:
		if r.status != 200 || r.readErr != nil {
			hw.run.fail("%s: want a whole answer, got %d %v %.200q", kind, r.status, r.readErr, r.body)
			return
		}
		if stream && !bytes.HasSuffix(r.body, []byte("data: [DONE]\n\n")) {
			hw.run.fail("%s: stream did not end with [DONE]: %.300q", kind, r.body)
			return
		}
		if session != "" && chat {
			reply := "the quick brown fox"
			if f == faultup.HugeEvent {
				return // a 2 MiB reply: checked by content elsewhere
			}
			hw.run.mu.Lock()
			hw.run.turns = append(hw.run.turns, ackedTurn{key, session, user, reply})
			hw.run.mu.Unlock()
		}
	case faultup.Broken:
		if r.status == 200 {
			if r.readErr == nil || !stream || !bytes.Contains(r.body, []byte("event: error")) || bytes.Contains(r.body, []byte("data: [DONE]")) {
				hw.run.fail("%s: a broken upstream reached the client as %d (read error %v): %.300q", kind, r.status, r.readErr, r.body)
			}
			return
		}
		if r.status != 502 && r.status != 504 || !strings.HasPrefix(code, "upstream_") {
			hw.run.fail("%s: want 502/504 upstream_*, got %d %.200s", kind, r.status, r.body)
		}
	case faultup.Passed:
		wantStatus := map[faultup.Fault]int{faultup.Status500: 500, faultup.Status429: 429}[f]
		if wantStatus == 0 {
			wantStatus = 200
		}
		if r.status != wantStatus {
			hw.run.fail("%s: want the upstream's %d, got %d %.200s", kind, wantStatus, r.status, r.body)
		}
	}
}

// kvPut stores a random blob under the worker's tenant and remembers it
// once acknowledged.
func (hw *hostileWorker) kvPut() {
	rng := hw.rng
	data := make([]byte, 2*(1+rng.IntN(32<<10)))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	key, ns, name := fmt.Sprintf("key-%d", hw.w%3), "ns"+strconv.Itoa(hw.w), fmt.Sprintf("blk/%d", hw.seq.Add(1))
	hw.run.count(hw.run.rep.Inputs, "kv put")
	r, err := rawDo(hw.addr, buildRequest("PUT", "/v1/kv/"+ns+"/"+name, [][2]string{{"Authorization", "Bearer " + key}, {"X-KV-Dtype", "f16"},
		{"X-KV-Shape", strconv.Itoa(len(data) / 2)}}, data), "PUT", 30*time.Second)
	if err != nil {
		hw.run.count(hw.run.rep.NoResponse, "kv put")
		hw.run.fail("kv put: %v", err)
		return
	}
	hw.run.seen(r, "sidecar")
	if r.status != 201 {
		hw.run.fail("kv put: %d %.200s", r.status, r.body)
		return
	}
	hw.run.mu.Lock()
	hw.run.blobs = append(hw.run.blobs, ackedBlob{key, ns, name, data})
	hw.run.mu.Unlock()
}

// rowRequest sends one of the reproductions and checks it.
func (hw *hostileWorker) rowRequest() {
	rng := hw.rng
	auth := [2]string{"Authorization", "Bearer key-rows"}
	type check func(r *rawResp) string
	want4xx := func(r *rawResp) string {
		if r.status < 400 || r.status >= 500 || bytes.Contains(r.body, []byte("fault upstream")) {
			return fmt.Sprintf("want a 4xx from the sidecar, got %d %.200s", r.status, r.body)
		}
		return ""
	}
	wantStatus := func(s int) check {
		return func(r *rawResp) string {
			if r.status != s {
				return fmt.Sprintf("want %d, got %d %.200s", s, r.status, r.body)
			}
			return ""
		}
	}
	cases := []struct {
		row          string
		method, path string
		hdr          [][2]string
		body         string
		check        check
	}{
		{"5", "PUT", "/v1/kv/%2e%2e/key", [][2]string{auth}, "ab", want4xx},
		{"5", "PUT", "/v1/kv/ns/../../etc/passwd", [][2]string{auth}, "ab", want4xx},
		{"5", "GET", "/v1/sessions/../../etc/passwd", [][2]string{auth}, "", want4xx},
		{"5", "DELETE", "/v1//kv/ns/key", [][2]string{auth}, "", want4xx},
		{"5", "GET", "/v1/pool%2F..%2Fx", [][2]string{auth}, "", want4xx},
		{"5", "GET", "/v1/sessions/", [][2]string{auth}, "", want4xx},
		{"5", "DELETE", "/v1/sessions", [][2]string{auth}, "", want4xx}, // GET lists the key's own sessions
		{"7", "GET", "/v1/sessions/w0-s0", nil, "", wantStatus(401)},
		{"7", "DELETE", "/v1/sessions/w1-s0", [][2]string{{"Authorization", "Bearer"}}, "", wantStatus(401)},
		{"7", "GET", "/v1/pool", [][2]string{{"Authorization", ""}}, "", wantStatus(401)},
		{"7", "GET", "/v1/kv/ns0/blk%2F1", nil, "", wantStatus(401)},
		{"8", "PUT", "/v1/kv/ns/shape", [][2]string{auth, {"X-KV-Shape", "1099511627776,16777216"}}, "", wantStatus(400)},
		{"8", "PUT", "/v1/kv/ns/shape", [][2]string{auth, {"X-KV-Dtype", "f16"}, {"X-KV-Shape", "1099511627776,16777216"}}, "", wantStatus(400)},
		{"4", "POST", "/v1/chat/completions", [][2]string{auth, {"X-Fault", "stop"}, {"X-Session-ID", "rows-stop"}},
			`{"stream":true,"messages":[{"role":"user","content":"cut me"}]}`, func(r *rawResp) string {
				if r.readErr == nil || !bytes.Contains(r.body, []byte("upstream_stream_incomplete")) {
					return fmt.Sprintf("a stream without [DONE] ended as %d %v %.200q", r.status, r.readErr, r.body)
				}
				return ""
			}},
	}
	c := cases[rng.IntN(len(cases))]
	hw.run.count(hw.run.rep.Inputs, "issue row "+c.row)
	r, err := rawDo(hw.addr, buildRequest(c.method, c.path, c.hdr, []byte(c.body)), c.method, 30*time.Second)
	if err != nil {
		hw.run.count(hw.run.rep.NoResponse, "issue row "+c.row)
		hw.run.fail("row %s %s %s: no answer: %v", c.row, c.method, c.path, err)
		return
	}
	hw.run.seen(r, "sidecar")
	if msg := c.check(r); msg != "" {
		hw.run.fail("row %s %s %s: %s", c.row, c.method, c.path, msg)
	}
}

var (
	fuzzMethods  = []string{"GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS", "TRACE", "get", "PROPFIND", "X"}
	fuzzPrefixes = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/sessions/", "/v1/kv/",
		"/v1/pool", "/v1/pool/", "/v1/", "/v1", "/", "/healthz", "/readyz", "/metrics", "/v2/x", "*", "http://h/v1/models", "/v1/files/"}
	fuzzSegments = []string{"", "a", "ns", "k", "..", ".", "%2e%2e", "%2E", "%2F", "%2f..%2f", "%00", "%", "%zz", "%ff", "é", "%C3%A9",
		"memory", "kv", "sessions", "fz-s0", ";x", "a?b=c", "#f", "\\..\\", "~", strings.Repeat("a", 300), strings.Repeat("%41", 200)}
	// Header values by name. Authorization and session ids come from
	// short lists so that the sessions a run touches are the ones warmUp
	// opens first (each loaded session holds its log open). None is a
	// session whose turns the workers check ("w*-s*"): the fuzz may
	// delete what it names.
	fuzzAuth     = []string{"", "Bearer", "Bearer ", "Bearer key-0", "Bearer key-1", "Basic dTpw", "bearer\tkey-0"}
	fuzzSessions = []string{"", "..", ".", "fz-s0", "é ☃", "a/b", strings.Repeat("s", 256), strings.Repeat("s", 257), "x\x01y", "pk0"}
	fuzzHeaders  = map[string][]string{
		"X-Session-Mode":    {"", "append", "full", "garbage"},
		"X-KV-Dtype":        {"", "f16", "bf16", "q8", "f32", "f64", "F16"},
		"X-KV-Shape":        {"", "1,2,3", "-1", "0", "1099511627776,16777216", "9223372036854775807", "4,", ",", "1,1,1,1,1,1,1,1,1,1"},
		"Content-Type":      {"", "application/json", "text/plain", "multipart/form-data; boundary=x", "application/octet-stream"},
		"Accept-Encoding":   {"gzip", "br", "identity", "*"},
		"Range":             {"bytes=0-1", "bytes=-5", "x"},
		"X-Forwarded-For":   {"1.2.3.4", strings.Repeat("v", 2000)},
		"Cookie":            {"a=b", "é\u00a0"},
		"Expect":            {"100-continue"},
		"Transfer-Encoding": {"chunked", "gzip"},
		"Upgrade":           {"websocket", "h2c"},
	}
	fuzzHeaderNames = []string{"X-Session-Mode", "X-KV-Dtype", "X-KV-Shape", "Content-Type", "Accept-Encoding", "Range",
		"X-Forwarded-For", "Cookie", "Expect", "Transfer-Encoding", "Upgrade"}
)

// warmUp sends one chat request for every tenant and session id the
// workers use, so session logs are open before the baseline is taken.
func warmUp(t *testing.T, p *child) {
	t.Helper()
	var ids []string
	for _, id := range fuzzSessions {
		ids = append(ids, id, "pk0", "pk1", "pk2", "rows-stop")
	}
	for w := 0; w < hostileWorkers; w++ {
		for i := 0; i < 3; i++ {
			ids = append(ids, fmt.Sprintf("w%d-s%d", w, i))
		}
	}
	for _, auth := range append(fuzzAuth, "Bearer key-2", "Bearer key-rows") {
		for _, id := range ids {
			if id == "" || strings.ContainsRune(id, 1) || len(id) > 256 {
				continue
			}
			hdr := [][2]string{{"Authorization", auth}, {"X-Session-ID", id}, {"X-Session-Mode", "append"}}
			r, err := rawDo(p.addr, buildRequest("POST", "/v1/chat/completions", hdr, []byte(`{"model":"m","messages":[{"role":"user","content":"warm up"}]}`)), "POST", 30*time.Second)
			if err != nil || r.status != 200 {
				t.Fatalf("warm-up %q %q: %v %+v", auth, id, err, r)
			}
		}
	}
}

// fuzzRequest fires a random request; the sidecar must answer without a
// 5xx of its own and without hanging. malformed requests (bad request
// line, bad headers) may be refused by closing the connection.
func (hw *hostileWorker) fuzzRequest() {
	rng := hw.rng
	method := fuzzMethods[rng.IntN(len(fuzzMethods))]
	path := fuzzPrefixes[rng.IntN(len(fuzzPrefixes))]
	for i := rng.IntN(4); i > 0; i-- {
		if !strings.HasSuffix(path, "/") {
			path += "/"
		}
		path += fuzzSegments[rng.IntN(len(fuzzSegments))]
	}
	malformed := strings.ContainsAny(path, " \\#") || path == ""
	var hdr [][2]string
	if rng.IntN(4) > 0 {
		hdr = append(hdr, [2]string{"Authorization", fuzzAuth[rng.IntN(len(fuzzAuth))]})
	}
	if rng.IntN(2) == 0 {
		hdr = append(hdr, [2]string{"X-Session-ID", fuzzSessions[rng.IntN(len(fuzzSessions))]})
	}
	for i := rng.IntN(4); i > 0; i-- {
		name := fuzzHeaderNames[rng.IntN(len(fuzzHeaderNames))]
		vals := fuzzHeaders[name]
		if name == "Transfer-Encoding" || name == "Expect" || name == "Upgrade" {
			malformed = true // framing this raw client does not follow
		}
		hdr = append(hdr, [2]string{name, vals[rng.IntN(len(vals))]})
	}
	body := fuzzBody(rng)
	if rng.IntN(50) == 0 {
		body = bytes.Repeat([]byte("x"), 1<<20+rng.IntN(1000)) // over the body limit
		malformed = true                                       // the server may close before reading it all
	}
	hw.run.count(hw.run.rep.Inputs, "fuzz")
	timeout := 30 * time.Second
	if malformed {
		// The sidecar may rightly wait for body bytes this client never
		// sends (chunked framing, 100-continue): no answer is no failure.
		timeout = 3 * time.Second
	}
	r, err := rawDo(hw.addr, buildRequest(method, path, hdr, body), method, timeout)
	if err != nil {
		hw.run.count(hw.run.rep.NoResponse, "fuzz")
		if !malformed {
			hw.run.fail("fuzz %s %.200q %.300q: no answer: %v", method, path, hdr, err)
		}
		return
	}
	hw.run.seen(r, "sidecar")
	if r.status >= 500 {
		hw.run.fail("fuzz %s %.200q %.300q body %.100q: %d %.300s", method, path, hdr, body, r.status, r.body)
	}
}

// fuzzBody returns a random body: a chat request (valid or mutated),
// JSON of the wrong shape, or random bytes.
func fuzzBody(rng *rand.Rand) []byte {
	switch rng.IntN(6) {
	case 0:
		return nil
	case 1:
		b := make([]byte, rng.IntN(512))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	case 2:
		return []byte([]string{`[]`, `{}`, `null`, `"x"`, `{"messages":null}`, `{"messages":{}}`, `{"messages":[null]}`,
			`{"messages":[{"role":5}]}`, `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, `{"value":1}`,
			strings.Repeat("[", 20000), `{"stream":true,"messages":[{"role":"user","content":"x"}],"n":3}`,
			`{"prompt":[1,2,3]}`, `{"input":""}`, `{"model":"` + strings.Repeat("m", 5000) + `"}`}[rng.IntN(15)])
	}
	var msgs []string
	for i := rng.IntN(30); i >= 0; i-- {
		role := []string{"user", "assistant", "system", "tool", "developer", "", "USER"}[rng.IntN(7)]
		var content string
		switch rng.IntN(4) {
		case 0:
			content = strconv.Quote(strings.Repeat("word ", rng.IntN(200)))
		case 1:
			content = `[{"type":"text","text":"part"},{"type":"image_url","image_url":{"url":"data:x"}}]`
		case 2:
			content = "null"
		default:
			content = strconv.Quote(fmt.Sprintf("hello %d é ☃ %s", rng.IntN(1000), strings.Repeat("x", rng.IntN(1500))))
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":%q,"content":%s}`, role, content))
	}
	b := []byte(fmt.Sprintf(`{"model":"m","stream":%v,"messages":[%s],"prompt_cache_key":"pk%d"}`, rng.IntN(2) == 0, strings.Join(msgs, ","), rng.IntN(3)))
	if rng.IntN(3) == 0 && len(b) > 0 { // mutate
		for i := rng.IntN(4) + 1; i > 0; i-- {
			switch j := rng.IntN(len(b)); rng.IntN(3) {
			case 0:
				b[j] = byte(rng.Uint32())
			case 1:
				b = b[:j]
			default:
				b = append(b[:j], append([]byte(`"},{`), b[j:]...)...)
			}
			if len(b) == 0 {
				break
			}
		}
	}
	return b
}

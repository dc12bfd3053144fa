package proxy

// Every route of an engine passes through as if direct: a scripted
// upstream with routes shaped after llama.cpp's (its route table in
// tools/server/server.cpp at 3f545becc), vLLM's, SGLang's and Ollama's
// (the native routes their docs list: /health, /version, /tokenize,
// /pooling, /score; /generate, /get_model_info, /flush_cache; /api/chat
// and /api/generate streaming NDJSON, /api/tags, /api/show) is asked each
// request direct and through the sidecar; the answers must match: status,
// end-to-end headers, body, and streams as they arrive. The real
// llama-server is asked the same way in cmd/sidecar (native_e2e_test.go)
// and by its own suite (scripts/llama-suite.sh).

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// engineShaped is a scripted upstream with the routes of four engines.
// Streamed routes send their first part, then wait on release before the
// rest, so a test sees whether the first part arrived before the end.
type engineShaped struct {
	*httptest.Server
	release chan struct{}
	blob    []byte
}

func newEngineShaped(t *testing.T) *engineShaped {
	e := &engineShaped{release: make(chan struct{}, 64), blob: make([]byte, 300<<10)}
	for i := range e.blob {
		e.blob[i] = byte(i*7 + i>>9)
	}
	e.Server = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.Close)
	return e
}

func (e *engineShaped) wait() {
	select {
	case <-e.release:
	case <-time.After(5 * time.Second):
	}
}

func (e *engineShaped) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h := w.Header()
	h.Set("X-Engine-Echo", r.Method+" "+r.RequestURI)
	h.Set("X-Body-Sum", fmt.Sprintf("%x", sha256.Sum256(body)))
	if v := r.Header.Get("X-Client"); v != "" {
		h.Set("X-Client-Seen", v)
	}
	fl := w.(http.Flusher)
	switch r.Method + " " + r.URL.Path {
	// llama.cpp
	case "GET /":
		h.Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, "<!doctype html><title>llama.cpp</title><div id=app></div>")
	case "GET /health", "GET /v1/health":
		h.Set("Content-Type", "application/json; charset=utf-8")
		_, _ = io.WriteString(w, `{"status":"ok"}`)
	case "GET /metrics":
		h.Set("Content-Type", "text/plain; version=0.0.4")
		h.Set("Process-Start-Time-Unix", "1780000000")
		_, _ = io.WriteString(w, "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 42\n")
	case "GET /props", "GET /slots":
		h.Set("Content-Type", "application/json; charset=utf-8")
		_, _ = io.WriteString(w, `{"total_slots":2,"default_generation_settings":{"n_ctx":4096}}`)
	case "POST /tokenize", "POST /detokenize", "POST /apply-template", "POST /infill", "POST /rerank", "POST /slots/0":
		h.Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprintf(w, `{"route":%q,"query":%q,"len":%d}`, r.URL.Path, r.URL.RawQuery, len(body))
	case "POST /completion", "POST /generate":
		// llama.cpp's native completion and SGLang's /generate: SSE when
		// streamed, "data: {...}\n\n" events.
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			h.Set("Content-Type", "application/json; charset=utf-8")
			_, _ = io.WriteString(w, `{"content":"hello","stop":true}`)
			return
		}
		h.Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"content\":\"hel\",\"stop\":false}\n\n")
		fl.Flush()
		e.wait()
		_, _ = io.WriteString(w, "data: {\"content\":\"lo\",\"stop\":true}\n\n")
	// Ollama
	case "POST /api/chat", "POST /api/generate":
		h.Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, `{"model":"m","message":{"role":"assistant","content":"hel"},"done":false}`+"\n")
		fl.Flush()
		e.wait()
		_, _ = io.WriteString(w, `{"model":"m","message":{"role":"assistant","content":"lo"},"done":true,"eval_count":2}`+"\n")
	case "GET /api/tags", "POST /api/show", "GET /api/version", "GET /get_model_info", "POST /flush_cache", "GET /version", "POST /pooling", "POST /score":
		h.Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprintf(w, `{"route":%q}`, r.URL.Path)
	case "HEAD /":
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("Content-Length", "17")
	case "DELETE /api/delete", "PUT /lora-adapters":
		w.WriteHeader(http.StatusOK)
	// static files, caching, CORS
	case "GET /assets/model.bin":
		h.Set("Content-Type", "application/octet-stream")
		h.Set("ETag", `"blob-1"`)
		if r.Header.Get("If-None-Match") == `"blob-1"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		_, _ = w.Write(e.blob)
	case "OPTIONS /v1/chat/completions":
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Allow-Methods", "POST, OPTIONS")
		w.WriteHeader(http.StatusNoContent)
	case "GET /v1/files", "POST /v1/messages", "POST /v1/responses":
		h.Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","route":%q}`, r.URL.Path)
	default:
		h.Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}`)
	}
}

// rawAnswer sends raw on a fresh connection and reads one answer: its
// status line, headers (Date and hop-by-hop aside, sorted) and body, and
// when the first body byte came.
func rawAnswer(t *testing.T, addr, raw string, head bool, onFirst func()) (status string, hdr []string, body []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	req := &http.Request{Method: "GET"}
	if head {
		req.Method = "HEAD"
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		switch k {
		case "Date", "Connection", "Keep-Alive", "Transfer-Encoding":
			continue
		}
		hdr = append(hdr, k+": "+strings.Join(vs, ","))
	}
	slices.Sort(hdr)
	if onFirst != nil {
		b := make([]byte, 1)
		if n, _ := io.ReadFull(resp.Body, b); n == 1 {
			onFirst()
			body = append(body, b...)
		}
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%q: body: %v", raw, err)
	}
	return resp.Status, hdr, append(body, rest...)
}

func TestEveryEngineRoutePassesThrough(t *testing.T) {
	e := newEngineShaped(t)
	base, _ := startSidecar(t, e.URL, nil)
	through := strings.TrimPrefix(base, "http://")
	direct := strings.TrimPrefix(e.URL, "http://")
	req := func(method, target, body string, extra ...string) string {
		s := method + " " + target + " HTTP/1.1\r\nHost: engine\r\nX-Client: c1\r\nConnection: close\r\n" + strings.Join(extra, "")
		if body != "" || method == "POST" || method == "PUT" {
			s += fmt.Sprintf("Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
		}
		return s + "\r\n" + body
	}
	chunked := "POST /tokenize HTTP/1.1\r\nHost: engine\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n{\"cont\r\n10\r\nent\":\"hi there\"}\r\n0\r\n\r\n"
	type tc struct {
		name, raw string
		head      bool
		streamed  bool // the upstream holds the rest until released
	}
	cases := []tc{
		{name: "web UI", raw: req("GET", "/", "")},
		{name: "health", raw: req("GET", "/health", "")},
		{name: "v1 health", raw: req("GET", "/v1/health", "")},
		{name: "engine metrics", raw: req("GET", "/metrics", "")},
		{name: "props", raw: req("GET", "/props", "")},
		{name: "slots", raw: req("GET", "/slots", "")},
		{name: "slot action with query", raw: req("POST", "/slots/0?action=save", `{"filename":"a.bin"}`)},
		{name: "tokenize", raw: req("POST", "/tokenize", `{"content":"hello"}`)},
		{name: "tokenize chunked", raw: chunked},
		{name: "detokenize", raw: req("POST", "/detokenize", `{"tokens":[1,2]}`)},
		{name: "apply-template", raw: req("POST", "/apply-template", `{"messages":[]}`)},
		{name: "infill", raw: req("POST", "/infill", `{"input_prefix":"a","input_suffix":"b"}`)},
		{name: "rerank", raw: req("POST", "/rerank", `{"query":"q","documents":["a"]}`)},
		{name: "native completion", raw: req("POST", "/completion", `{"prompt":"hi"}`)},
		{name: "native completion streamed", raw: req("POST", "/completion", `{"prompt":"hi","stream":true}`), streamed: true},
		{name: "sglang generate streamed", raw: req("POST", "/generate", `{"text":"hi","stream":true}`), streamed: true},
		{name: "ollama chat ndjson", raw: req("POST", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`), streamed: true},
		{name: "ollama generate ndjson", raw: req("POST", "/api/generate", `{"model":"m","prompt":"hi"}`), streamed: true},
		{name: "ollama tags", raw: req("GET", "/api/tags", "")},
		{name: "ollama show", raw: req("POST", "/api/show", `{"model":"m"}`)},
		{name: "ollama delete", raw: req("DELETE", "/api/delete", `{"model":"m"}`)},
		{name: "ollama head", raw: req("HEAD", "/", ""), head: true},
		{name: "vllm version", raw: req("GET", "/version", "")},
		{name: "vllm pooling", raw: req("POST", "/pooling", `{"input":"x"}`)},
		{name: "vllm score", raw: req("POST", "/score", `{"text_1":"a","text_2":"b"}`)},
		{name: "sglang model info", raw: req("GET", "/get_model_info", "")},
		{name: "sglang flush cache", raw: req("POST", "/flush_cache", "")},
		{name: "lora put", raw: req("PUT", "/lora-adapters", `[]`)},
		{name: "binary with length", raw: req("GET", "/assets/model.bin", "")},
		{name: "not modified", raw: req("GET", "/assets/model.bin", "", "If-None-Match: \"blob-1\"\r\n")},
		{name: "cors preflight", raw: req("OPTIONS", "/v1/chat/completions", "", "Origin: http://ui\r\nAccess-Control-Request-Method: POST\r\n")},
		{name: "other v1 route", raw: req("GET", "/v1/files?purpose=x", "")},
		{name: "anthropic messages", raw: req("POST", "/v1/messages", `{"model":"m","messages":[]}`)},
		{name: "responses", raw: req("POST", "/v1/responses", `{"model":"m","input":"hi"}`)},
		{name: "escaped path as sent", raw: req("GET", "/api/t%61gs", "")},
		{name: "engine 404", raw: req("GET", "/no/such/route", "")},
		{name: "next year's route", raw: req("POST", "/v3/agents/run?x=1", `{"a":1}`)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var firstGap time.Duration
			var onFirst func()
			if c.streamed {
				onFirst = func() {
					// The first part is here while the upstream holds
					// the rest: nothing waited for the end.
					firstGap = time.Millisecond
					e.release <- struct{}{}
				}
			}
			ds, dh, db := rawAnswer(t, direct, c.raw, c.head, onFirst)
			dGap := firstGap
			firstGap = 0
			ts, th, tb := rawAnswer(t, through, c.raw, c.head, onFirst)
			if ds != ts || !bytes.Equal(db, tb) {
				t.Fatalf("direct %s %q\nthrough %s %q", ds, trunc(db), ts, trunc(tb))
			}
			if strings.Join(dh, "\n") != strings.Join(th, "\n") {
				t.Fatalf("headers differ\ndirect:  %q\nthrough: %q", dh, th)
			}
			if c.streamed && (dGap == 0 || firstGap == 0) {
				t.Fatalf("the stream's first part did not arrive before its end (direct %v, through %v)", dGap, firstGap)
			}
		})
	}
}

func trunc(b []byte) []byte {
	if len(b) > 200 {
		return b[:200]
	}
	return b
}

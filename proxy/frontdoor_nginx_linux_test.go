//go:build linux

package proxy

// The front door, side by side with a real nginx (Debian's, 1.22): one
// corpus of framing, pipelining and header cases — the front-door issue's
// table and the classic smuggling families — sent on raw sockets to nginx
// and to the sidecar with its event loop and without, each in front of its
// own recording upstream. For every case the sidecar answers as nginx does
// (the same class of status, or a stricter 4xx that ends the connection),
// in time, and its upstream receives no request nginx's did not.
//
// nginx is found on PATH or at /usr/sbin/nginx; without it the test skips,
// unless KVSIDECAR_REQUIRE_NGINX=1 (as .ci/run sets), which makes it fail.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// findNginx returns nginx's path, or skips (fails under
// KVSIDECAR_REQUIRE_NGINX=1).
func findNginx(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	if os.Getenv("KVSIDECAR_REQUIRE_NGINX") == "1" {
		t.Fatal("nginx not found (apt-get install nginx) and KVSIDECAR_REQUIRE_NGINX=1")
	}
	t.Skip("nginx not found (apt-get install nginx); KVSIDECAR_REQUIRE_NGINX=1 makes this a failure")
	return ""
}

// startNginx runs nginx as a reverse proxy to upstream, as a user would put
// it in front of an engine (HTTP/1.1 and keep-alive to the upstream,
// request bodies read whole first), and returns its address.
func startNginx(t *testing.T, upstream string) string {
	bin := findNginx(t)
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;" // workers read the temporary folders under TempDir (0700)
	}
	conf := fmt.Sprintf(`%s
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log info;
daemon off;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path %[2]s/client_body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  client_max_body_size 1m;
  upstream llm { server %[3]s; keepalive 16; }
  server {
    listen %[4]s;
    location / {
      proxy_pass http://llm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
`, user, dir, upstream, addr)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", path, "-p", dir+"/", "-e", dir+"/error.log")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx did not start: %v\n%s\n%s", err, out.String(), log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// upRequest is one request a recording upstream received.
type upRequest struct {
	Case   string // its X-Case header
	Line   string // method and target
	Names  []string
	Header http.Header
	Body   string
}

// caseRecorder answers every request 200 with a small JSON body and
// keeps what it received.
type caseRecorder struct {
	addr string
	mu   sync.Mutex
	reqs []upRequest
}

func newCaseRecorder(t *testing.T) *caseRecorder {
	u := &caseRecorder{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var names []string
		for k := range r.Header {
			names = append(names, k)
		}
		sort.Strings(names)
		u.mu.Lock()
		u.reqs = append(u.reqs, upRequest{Case: r.Header.Get("X-Case"), Line: r.Method + " " + r.RequestURI, Names: names, Header: r.Header.Clone(), Body: string(body)})
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return u
}

func (u *caseRecorder) byCase(c string) []upRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []upRequest
	for _, r := range u.reqs {
		if r.Case == c {
			out = append(out, r)
		}
	}
	return out
}

// fdCase is one case of the corpus: parts written in order on one
// connection, with pause between them.
type fdCase struct {
	name  string
	parts []string
	pause time.Duration
	// want, when set, is the sidecar's first status, whatever nginx says.
	want int
	// firstWithin bounds the wait for the first answer (0: 3 s).
	firstWithin time.Duration
}

// fdResult is what a client saw.
type fdResult struct {
	statuses []int // final answers, 1xx left out
	first    time.Duration
	closed   bool
	bodies   []string
	err      string
}

// runCase sends c to addr and reads answers until the connection closes or
// nothing more comes for idle (within 5 s in all).
func runCase(addr string, c fdCase, idle time.Duration) fdResult {
	var res fdResult
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		res.err = err.Error()
		return res
	}
	defer conn.Close()
	start := time.Now()
	for i, p := range c.parts {
		if i > 0 && c.pause > 0 {
			time.Sleep(c.pause)
		}
		if _, err := io.WriteString(conn, p); err != nil {
			break // refused early: what was answered is read below
		}
	}
	var got bytes.Buffer
	buf := make([]byte, 64<<10)
	end := start.Add(5 * time.Second)
	for {
		dl := time.Now().Add(idle)
		if dl.After(end) {
			dl = end
		}
		_ = conn.SetReadDeadline(dl)
		n, err := conn.Read(buf)
		if n > 0 && res.first == 0 {
			res.first = time.Since(start)
		}
		got.Write(buf[:n])
		if err != nil {
			var ne net.Error
			res.closed = !(errorsAs(err, &ne) && ne.Timeout())
			break
		}
	}
	br := bufio.NewReader(&got)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode >= 200 {
			res.statuses = append(res.statuses, resp.StatusCode)
			res.bodies = append(res.bodies, string(b))
		}
	}
	return res
}

func errorsAs(err error, ne *net.Error) bool {
	e, ok := err.(net.Error)
	if ok {
		*ne = e
	}
	return ok
}

// frontDoorCorpus is the differential test's corpus; every request carries
// X-Case so each upstream's requests are told apart.
func frontDoorCorpus() []fdCase {
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	var cs []fdCase
	add := func(c fdCase) { cs = append(cs, c) }
	id := func(name string) string { return "X-Case: " + name + "\r\n" }
	post := func(name, extra, body string) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n" + id(name) + extra +
			fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)) + body
	}
	get := func(name, extra string) string {
		return "GET /v1/models HTTP/1.1\r\nHost: sidecar\r\n" + id(name) + extra + "\r\n"
	}
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	single := func(name, raw string, want int) { add(fdCase{name: name, parts: []string{raw}, want: want}) }

	// Plain requests, to show both sides forward them.
	single("plain post", post("plain post", "", chat), 200)
	single("plain get", get("plain get", ""), 200)

	// CL.TE and TE.CL: a second request inside the body.
	smuggled := "GET /v1/smuggled HTTP/1.1\r\nHost: sidecar\r\n" + id("cl.te") + "\r\n"
	inner := "0\r\n\r\n" + smuggled
	single("cl.te", "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\n"+id("cl.te")+fmt.Sprintf("Content-Length: %d\r\n", len(inner))+
		"Transfer-Encoding: chunked\r\n\r\n"+inner, 400)
	single("te.cl", "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\n"+id("te.cl")+"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"+
		"5c\r\nGPOST /v1/smuggled HTTP/1.1\r\nHost: sidecar\r\nX-Case: te.cl\r\nContent-Length: 15\r\n\r\nx=1\r\n0\r\n\r\n", 400)
	// TE.TE obfuscations, each with a Content-Length and a request inside.
	embedded := func(name string) string {
		return "GET /v1/smuggled HTTP/1.1\r\nHost: sidecar\r\n" + id(name) + "\r\n"
	}
	for i, te := range []string{
		"Transfer-Encoding: identity", "Transfer-Encoding: xchunked", "Transfer-Encoding: chunked, identity",
		"Transfer-Encoding: identity, chunked", "Transfer-Encoding : chunked", "Transfer-Encoding:\x0bchunked",
		"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity", "Transfer-encoding: cow",
		"X: y\r\n Transfer-Encoding: chunked", "X: y\r\n\tTransfer-Encoding: chunked", "Transfer-Encoding\t: chunked",
		"Transfer_Encoding: chunked", "Transfer-Encoding: \"chunked\"", "Transfer-Encoding: chunk",
	} {
		name := fmt.Sprintf("te.te %d", i)
		body := "0\r\n\r\n" + embedded(name)
		single(name, "POST /v1/echo HTTP/1.1\r\nHost: sidecar\r\n"+id(name)+te+"\r\n"+
			fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body))+body, 0)
	}
	// A TE in HTTP/1.0.
	single("te in 1.0", "POST /v1/chat/completions HTTP/1.0\r\n"+id("te in 1.0")+"Transfer-Encoding: chunked\r\n\r\n"+chunk(chat)+"0\r\n\r\n", 400)
	// Chunked bodies: plain, extensions, trailers that must never be
	// headers, bad sizes.
	single("chunked", "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"+id("chunked")+
		"Transfer-Encoding: chunked\r\n\r\n"+chunk(chat[:10])+chunk(chat[10:])+"0\r\n\r\n", 200)
	single("chunk extensions", "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"+id("chunk extensions")+
		"Transfer-Encoding: chunked\r\n\r\n"+fmt.Sprintf("%x;a=b;c=\"d\"\r\n%s\r\n", len(chat), chat)+"0;x\r\n\r\n", 200)
	single("trailers", "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\nAuthorization: Bearer k1\r\n"+
		id("trailers")+"X-User-ID: mallory\r\nTransfer-Encoding: chunked\r\n\r\n"+chunk(chat)+
		"0\r\nX-Session-ID: from-trailer\r\nX-User-ID: alice\r\nAuthorization: Bearer other\r\n\r\n", 200)
	single("chunk size overflow", "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\n"+id("chunk size overflow")+
		"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffffff1\r\nabc\r\n0\r\n\r\n", 400)
	single("chunk size junk", "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\n"+id("chunk size junk")+
		"Transfer-Encoding: chunked\r\n\r\n3x\r\nabc\r\n0\r\n\r\n", 400)
	single("chunk data too long", "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\n"+id("chunk data too long")+
		"Transfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", 400)
	// Content-Length variants.
	for i, cl := range []string{"Content-Length: +4", "Content-Length: 4, 4", "Content-Length: 4\r\nContent-Length: 4",
		"Content-Length: 4\r\nContent-Length: 5", "Content-Length: -4", "Content-Length: 0x4", "Content-Length: 4 4"} {
		name := fmt.Sprintf("content-length %d", i)
		single(name, "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\n"+id(name)+cl+"\r\n\r\nabcd"+embedded(name), 400)
	}
	// Heads.
	single("obs-fold", "POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\n"+id("obs-fold")+"X-A: 1\r\n Transfer-Encoding: chunked\r\n"+
		"Content-Length: 4\r\n\r\n0\r\n\r\n"+embedded("obs-fold"), 400)
	single("bare LF head", strings.ReplaceAll(post("bare LF head", "", chat), "\r\n", "\n"), 200)
	single("bare CR", "GET /v1/models HTTP/1.1\r\nHost: sidecar\r"+id("bare CR")+"\r\n", 400)
	single("inner space in a name", get("inner space in a name", "Author ization: Bearer k\r\n"), 400)
	single("space before colon", get("space before colon", "Authorization : Bearer k\r\n"), 400)
	single("lower-case method", strings.Replace(get("lower-case method", ""), "GET", "get", 1), 400)
	single("two authorizations", get("two authorizations", "Authorization: Bearer a\r\nAuthorization: Bearer b\r\n"), 400)
	single("two hosts", get("two hosts", "Host: other\r\n"), 400)
	single("no host", "GET /v1/models HTTP/1.1\r\n"+id("no host")+"\r\n", 400)
	for i, h := range []string{"a b", "", "%x", "a..b", "a/b", "[::1]:80", "sidecar."} {
		name := fmt.Sprintf("host %d", i)
		want := 0
		if h == "%x" {
			want = 200 // as nginx: a request that works without a session works with one
		}
		single(name, "GET /v1/models HTTP/1.1\r\nHost: "+h+"\r\n"+id(name)+"\r\n", want)
	}
	single("5 KiB head", get("5 KiB head", "Cookie: "+strings.Repeat("c", 5<<10)+"\r\n"), 200)
	single("20 KiB head", get("20 KiB head", strings.Repeat("X-Pad: "+strings.Repeat("p", 4000)+"\r\n", 5)), 200)
	single("10 KiB line", get("10 KiB line", "Cookie: "+strings.Repeat("c", 10<<10)+"\r\n"), 0)
	single("40 KiB head", get("40 KiB head", strings.Repeat("X-Pad: "+strings.Repeat("p", 7000)+"\r\n", 6)), 0)
	single("NUL in a value", get("NUL in a value", "X-A: a\x00b\r\n"), 400)
	single("connection lists authorization", get("connection lists authorization", "Authorization: Bearer k\r\nConnection: Authorization\r\n"), 0)
	single("absolute-form", strings.Replace(get("absolute-form", ""), "/v1/models", "http://elsewhere.example/v1/models", 1), 200)
	single("http/2 version", strings.Replace(get("http/2 version", ""), "HTTP/1.1", "HTTP/2.0", 1), 0)
	single("underscore header", get("underscore header", "X_User_ID: alice\r\n"), 200)
	// Pipelining: two whole requests; then one whose successor is cut
	// short (its answer must not wait on it); then 100-continue.
	single("pipelined", post("pipelined", "X-Session-ID: s1\r\nAuthorization: Bearer k1\r\n", chat)+get("pipelined", "Authorization: Bearer k2\r\n"), 200)
	r2 := post("held", "", chat)
	add(fdCase{name: "held", parts: []string{post("held", "X-Session-ID: s1\r\nAuthorization: Bearer k1\r\n", chat) + r2[:len(r2)-10]}, want: 200})
	add(fdCase{name: "held, loop's route", parts: []string{post("held, loop's route", "", chat) + r2[:len(r2)-10]}, want: 200})
	add(fdCase{name: "expect 100-continue", parts: []string{
		strings.Replace(post("expect 100-continue", "Expect: 100-continue\r\n", chat), chat, "", 1), chat}, pause: 300 * time.Millisecond, want: 200})
	// A request split at every byte: the same answer whatever the cut.
	for i := 1; ; i++ {
		w := post(fmt.Sprintf("s%03d", i), "Authorization: Bearer k1\r\nConnection: close\r\n", chat)
		if i >= len(w) {
			break
		}
		add(fdCase{name: fmt.Sprintf("split at %d", i), parts: []string{w[:i], w[i:]}, pause: 5 * time.Millisecond, want: 200})
	}
	return cs
}

// caseID is the X-Case a case's requests carry.
func caseID(c fdCase) string {
	if strings.HasPrefix(c.name, "split at ") {
		var i int
		_, _ = fmt.Sscanf(c.name, "split at %d", &i)
		return fmt.Sprintf("s%03d", i)
	}
	return c.name
}

func TestFrontDoorAgainstNginx(t *testing.T) {
	upN, upLoop, upPlain := newCaseRecorder(t), newCaseRecorder(t), newCaseRecorder(t)
	nginx := startNginx(t, upN.addr)
	mod := func(loop bool) func(*Options) {
		return func(o *Options) {
			o.EventLoop = loop
			o.MaxBodyBytes = 1 << 20
			o.ReadTimeout = 60 * time.Second
		}
	}
	loopURL, loopSrv := startSidecar(t, "http://"+upLoop.addr, mod(true))
	plainURL, _ := startSidecar(t, "http://"+upPlain.addr, mod(false))
	eventually(t, func() bool { return loopOf(loopSrv) != nil })
	targets := []struct {
		name string
		addr string
		up   *caseRecorder
	}{
		{"nginx", nginx, upN},
		{"event loop", strings.TrimPrefix(loopURL, "http://"), upLoop},
		{"fasthttp", strings.TrimPrefix(plainURL, "http://"), upPlain},
	}

	corpus := frontDoorCorpus()
	results := make([][3]fdResult, len(corpus))
	sem := make(chan struct{}, 48)
	var wg sync.WaitGroup
	for i, c := range corpus {
		for j, tg := range targets {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				results[i][j] = runCase(tg.addr, c, 1500*time.Millisecond)
			}()
		}
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond) // the upstreams' last records

	class := func(s int) int { return s / 100 }
	for i, c := range corpus {
		n := results[i][0]
		if n.err != "" {
			t.Fatalf("%s: nginx: %s", c.name, n.err)
		}
		nReqs := upN.byCase(caseID(c))
		for j := 1; j < 3; j++ {
			tg, r := targets[j], results[i][j]
			where := fmt.Sprintf("%s via %s", c.name, tg.name)
			if r.err != "" {
				t.Errorf("%s: %s", where, r.err)
				continue
			}
			// Answers: nginx's, class by class, or a prefix of them
			// and then one stricter 4xx that ends the connection.
			same := len(r.statuses) == len(n.statuses)
			for k := 0; same && k < len(r.statuses); k++ {
				same = class(r.statuses[k]) == class(n.statuses[k])
			}
			stricter := false
			if !same && len(r.statuses) > 0 && len(r.statuses) <= len(n.statuses) {
				k := len(r.statuses) - 1
				stricter = class(r.statuses[k]) == 4 && r.closed
				for m := 0; stricter && m < k; m++ {
					stricter = class(r.statuses[m]) == class(n.statuses[m])
				}
			}
			if !same && !stricter {
				t.Errorf("%s: answered %v (closed %v), nginx %v (closed %v)", where, r.statuses, r.closed, n.statuses, n.closed)
			}
			if c.want != 0 && (len(r.statuses) == 0 || r.statuses[0] != c.want) {
				t.Errorf("%s: answered %v, want %d first", where, r.statuses, c.want)
			}
			within := c.firstWithin
			if within == 0 {
				within = 3 * time.Second
			}
			if len(n.statuses) > 0 && (r.first == 0 || r.first > within) {
				t.Errorf("%s: first byte after %v, nginx answered (bound %v)", where, r.first, within)
			}
			// No request nginx did not forward: each request the
			// sidecar's upstream saw matches one nginx's saw (line,
			// body, header names within nginx's).
			got := tg.up.byCase(caseID(c))
			if len(got) > len(nReqs) {
				t.Errorf("%s: upstream received %d requests, nginx's %d: %v", where, len(got), len(nReqs), lines(got))
			}
			for _, g := range got {
				if !slices.ContainsFunc(nReqs, func(w upRequest) bool { return sameRequest(g, w) }) {
					t.Errorf("%s: upstream received %q %v %q, which nginx did not forward (nginx's: %v)", where, g.Line, g.Names, g.Body, describe(nReqs))
				}
			}
			for _, b := range r.bodies {
				if strings.Contains(b, "Bearer") || strings.Contains(b, "X-Case") {
					t.Errorf("%s: an answer quotes the request: %q", where, b)
				}
			}
		}
	}
	// The trailer case, spelled out: no trailer field reached an upstream
	// or acted as a header.
	for _, tg := range targets[1:] {
		for _, r := range tg.up.byCase("trailers") {
			if r.Header.Get("X-Session-ID") != "" || r.Header.Get("X-User-ID") != "mallory" || len(r.Header.Values("X-User-ID")) != 1 ||
				r.Header.Get("Authorization") != "Bearer k1" {
				t.Errorf("via %s: trailers reached the upstream as headers: %v", tg.name, r.Header)
			}
		}
	}
	if t.Failed() || testing.Verbose() {
		for i, c := range corpus {
			if strings.HasPrefix(c.name, "split at ") && !t.Failed() {
				continue
			}
			t.Logf("%-32q nginx %v | loop %v | fasthttp %v", c.name, results[i][0].statuses, results[i][1].statuses, results[i][2].statuses)
		}
	}
}

// sameRequest: g (through the sidecar) is w (through nginx): the same
// method and target, body, and no header name nginx did not send but
// those the sidecar sets itself.
func sameRequest(g, w upRequest) bool {
	if g.Line != w.Line || g.Body != w.Body {
		return false
	}
	for _, k := range g.Names {
		switch k {
		case "Content-Length", "Accept-Encoding", "User-Agent", "Connection":
			continue
		}
		if !slices.Contains(w.Names, k) {
			return false
		}
	}
	return true
}

func lines(rs []upRequest) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Line)
	}
	return out
}

func describe(rs []upRequest) string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%q %v %q", r.Line, r.Names, r.Body))
	}
	return strings.Join(out, "; ")
}

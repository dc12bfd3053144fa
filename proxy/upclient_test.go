package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// rawUpstream answers each request on a loopback port with the bytes
// answer returns for it (conn and req count from 1), then keeps the
// connection or closes it.
func rawUpstream(t *testing.T, answer func(conn, req int) (reply string, keep bool)) (url string, accepted, requests *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted, requests = new(atomic.Int64), new(atomic.Int64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conn := int(accepted.Add(1))
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for req := 1; ; req++ {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, r.Body)
					requests.Add(1)
					reply, keep := answer(conn, req)
					if _, err := io.WriteString(c, reply); err != nil || !keep {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String(), accepted, requests
}

const okReply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

// TestUpstreamPathPrefix: an upstream URL with a path keeps it, for
// forwarded requests and the readiness probe; a trailing /v1 is the API
// root.
func TestUpstreamPathPrefix(t *testing.T) {
	for _, c := range []struct{ suffix, want string }{
		{"/prefix/v1", "/prefix/v1"},
		{"/prefix", "/prefix/v1"},
		{"/prefix/v1/", "/prefix/v1"},
		{"/a/b/v1", "/a/b/v1"},
		{"/pre%20fix/v1", "/pre%20fix/v1"},
		{"/a%2Fb", "/a%2Fb/v1"},
		{"/v1", "/v1"},
		{"", "/v1"},
	} {
		t.Run(c.suffix, func(t *testing.T) {
			var mu sync.Mutex
			var seen []string
			up, _, _ := rawUpstream(t, func(int, int) (string, bool) { return okReply, true })
			// rawUpstream does not report paths: put a recorder in front.
			rec := newPathRecorder(t, strings.TrimPrefix(up, "http://"), func(p string) {
				mu.Lock()
				seen = append(seen, p)
				mu.Unlock()
			})
			base, _ := startSidecar(t, "http://"+rec+c.suffix, nil)
			resp, b := post(t, base+"/v1/chat/completions?x=1", chatBody, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			r2, err := noPoolClient.Get(base + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			r2.Body.Close()
			if r2.StatusCode != 200 {
				t.Fatalf("/readyz %d", r2.StatusCode)
			}
			mu.Lock()
			defer mu.Unlock()
			want := []string{c.want + "/chat/completions?x=1", c.want + "/models"}
			if fmt.Sprint(seen) != fmt.Sprint(want) {
				t.Fatalf("upstream saw %q, want %q", seen, want)
			}
		})
	}
}

// newPathRecorder forwards raw TCP to target and reports each request
// line's target.
func newPathRecorder(t *testing.T, target string, seen func(string)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				out, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(c, out); _ = c.Close() }()
				br := bufio.NewReader(c)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					seen(r.RequestURI)
					if err := r.Write(out); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

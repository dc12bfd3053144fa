// Package ceilingtest holds what the yardstick proxies' tests share: an
// upstream that answers like an OpenAI-compatible engine, a client that sends
// requests one after another on one TCP connection, and the exchange every
// proxy must relay unchanged. It is used by tests only.
package ceilingtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ChatPath is the one route the upstream serves.
const ChatPath = "/v1/chat/completions"

// connDeadline bounds every exchange on a test connection, so a proxy that
// stops relaying fails its test instead of hanging it. It is a guard, not a
// speed goal.
const connDeadline = 10 * time.Second

// StreamEvents is how many token events a streamed answer holds before its
// final "data: [DONE]".
const StreamEvents = 5

// ChatAnswer is the upstream's JSON answer to a chat request whose body is
// reqBody (valid JSON): the request is echoed inside it, so a large request
// makes a large answer.
func ChatAnswer(reqBody string) string {
	return `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"echo":` + reqBody + `}`
}

// longPad is how much a streamed answer for the model "long" pads each
// token: its events (and its chunks) are larger than half the yardsticks'
// 16 KiB buffers, so they straddle reads.
const longPad = 10 << 10

// StreamEvent is the i-th event of a streamed answer for model (i ==
// StreamEvents is the final one).
func StreamEvent(model string, i int) string {
	if i == StreamEvents {
		return "data: [DONE]\n\n"
	}
	tok := fmt.Sprintf("tok%d", i)
	if model == "long" {
		tok += strings.Repeat(".", longPad)
	}
	return fmt.Sprintf("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", tok)
}

// StreamAnswer is the whole body of a streamed answer for model.
func StreamAnswer(model string) string {
	var b strings.Builder
	for i := 0; i <= StreamEvents; i++ {
		b.WriteString(StreamEvent(model, i))
	}
	return b.String()
}

// ChatBody is a chat request body for model whose one message is content;
// stream asks for a streamed answer.
func ChatBody(model, content string, stream bool) string {
	s := ""
	if stream {
		s = `,"stream":true`
	}
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]%s}`, model, content, s)
}

// NewUpstream starts an httptest server that answers POST ChatPath:
//   - a body that is not JSON: 400 with a JSON error (Content-Length);
//   - model "busy": 429 with a JSON error (Content-Length);
//   - a body containing "stream":true: 200 with StreamAnswer(model), chunked,
//     one flush per event; when hold is not nil, after the first event the
//     handler waits until hold is closed (or the request is gone);
//   - otherwise: 200 with ChatAnswer (Content-Length).
//
// Any other method or path gets 404 with a JSON error. The server is closed
// when the test ends.
func NewUpstream(t testing.TB, hold <-chan struct{}) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if r.Method != http.MethodPost || r.URL.Path != ChatPath {
			writeJSON(w, http.StatusNotFound, `{"error":{"message":"no route","type":"invalid_request_error"}}`)
			return
		}
		var req struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			writeJSON(w, http.StatusBadRequest, `{"error":{"message":"bad JSON","type":"invalid_request_error"}}`)
			return
		}
		if req.Model == "busy" {
			writeJSON(w, http.StatusTooManyRequests, `{"error":{"message":"busy","type":"rate_limit_error"}}`)
			return
		}
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			writeJSON(w, http.StatusOK, ChatAnswer(string(body)))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := 0; i <= StreamEvents; i++ {
			io.WriteString(w, StreamEvent(req.Model, i))
			f.Flush()
			if i == 0 && hold != nil {
				select {
				case <-hold:
				case <-r.Context().Done():
					return
				}
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// Conn is one client TCP connection on which requests go one after another.
type Conn struct {
	t    testing.TB
	addr string
	c    net.Conn
	br   *bufio.Reader
}

// Dial connects to addr; the connection is closed when the test ends.
func Dial(t testing.TB, addr string) *Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &Conn{t: t, addr: addr, c: c, br: bufio.NewReader(c)}
}

// Close closes the connection.
func (c *Conn) Close() { c.c.Close() }

// Raw returns the underlying connection and its reader, for tests that write
// bytes of their own; it sets the connection's deadline like Do.
func (c *Conn) Raw() (net.Conn, *bufio.Reader) {
	c.c.SetDeadline(time.Now().Add(connDeadline))
	return c.c, c.br
}

// Response is what Do read back.
type Response struct {
	Status int
	Body   string
	Header http.Header
	Close  bool // the response says the connection closes after it
}

// NewRequest returns a request for path on addr with body (JSON when not
// empty).
func NewRequest(t testing.TB, method, addr, path, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// Do sends one request and reads its whole response; it fails the test
// (from the test's goroutine only) on any error.
func (c *Conn) Do(method, path, body string) Response {
	c.t.Helper()
	r, err := c.do(method, path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

func (c *Conn) do(method, path, body string) (Response, error) {
	req, err := http.NewRequest(method, "http://"+c.addr+path, strings.NewReader(body))
	if err != nil {
		return Response{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	c.c.SetDeadline(time.Now().Add(connDeadline))
	if err := req.Write(c.c); err != nil {
		return Response{}, fmt.Errorf("%s %s via %s: write: %w", method, path, c.addr, err)
	}
	return readResponse(c.br, req)
}

// ReadResponse reads one whole response to req from br.
func ReadResponse(t testing.TB, br *bufio.Reader, req *http.Request) Response {
	t.Helper()
	r, err := readResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func readResponse(br *bufio.Reader, req *http.Request) (Response, error) {
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return Response{}, fmt.Errorf("%s %s: read response: %w", req.Method, req.URL.Path, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return Response{}, fmt.Errorf("%s %s: read body: %w", req.Method, req.URL.Path, err)
	}
	return Response{Status: resp.StatusCode, Body: string(b), Header: resp.Header, Close: resp.Close}, nil
}

// Exchange is one request of CheckRelay's sequence and its expected status.
type Exchange struct {
	Name   string
	Method string
	Path   string
	Body   string
	Status int
	Stream bool // the answer is streamed
}

func (e Exchange) model() string {
	var req struct {
		Model string `json:"model"`
	}
	json.Unmarshal([]byte(e.Body), &req)
	return req.Model
}

// Exchanges returns CheckRelay's sequence: chat answers small and large (a
// 64 KiB message, larger than the yardsticks' 16 KiB buffers), the error
// statuses, and, with stream, streamed answers between them (one with events
// larger than half those buffers).
func Exchanges(stream bool) []Exchange {
	big := strings.Repeat("0123456789abcdef", 4<<10)
	ex := []Exchange{
		{Name: "chat", Method: http.MethodPost, Path: ChatPath, Body: ChatBody("m", "hi", false), Status: http.StatusOK},
		{Name: "stream", Method: http.MethodPost, Path: ChatPath, Body: ChatBody("m", "hi", true), Status: http.StatusOK, Stream: true},
		{Name: "not found", Method: http.MethodPost, Path: "/v1/nothing", Body: ChatBody("m", "hi", false), Status: http.StatusNotFound},
		{Name: "busy", Method: http.MethodPost, Path: ChatPath, Body: ChatBody("busy", "hi", false), Status: http.StatusTooManyRequests},
		{Name: "big chat", Method: http.MethodPost, Path: ChatPath, Body: ChatBody("m", big, false), Status: http.StatusOK},
		{Name: "big stream", Method: http.MethodPost, Path: ChatPath, Body: ChatBody("m", big, true), Status: http.StatusOK, Stream: true},
		{Name: "long stream", Method: http.MethodPost, Path: ChatPath, Body: ChatBody("long", "hi", true), Status: http.StatusOK, Stream: true},
		{Name: "chat again", Method: http.MethodPost, Path: ChatPath, Body: ChatBody("m", "again", false), Status: http.StatusOK},
	}
	if stream {
		return ex
	}
	out := ex[:0]
	for _, e := range ex {
		if !e.Stream {
			out = append(out, e)
		}
	}
	return out
}

// CheckRelay sends Exchanges(stream) twice over, on one connection to the
// upstream and on one keep-alive connection to the proxy, and fails t where
// a status or body through the proxy differs from the upstream's, or where
// the proxy closes the connection.
func CheckRelay(t *testing.T, proxyAddr, upstreamAddr string, stream bool) {
	t.Helper()
	direct := Dial(t, upstreamAddr)
	via := Dial(t, proxyAddr)
	for round := range 2 {
		for _, e := range Exchanges(stream) {
			want := direct.Do(e.Method, e.Path, e.Body)
			if want.Status != e.Status {
				t.Fatalf("%s: upstream answered %d, want %d", e.Name, want.Status, e.Status)
			}
			if e.Stream && want.Body != StreamAnswer(e.model()) {
				t.Fatalf("%s: upstream streamed %q", e.Name, want.Body)
			}
			got := via.Do(e.Method, e.Path, e.Body)
			if got.Status != want.Status {
				t.Errorf("round %d, %s: status %d through the proxy, %d from the upstream", round, e.Name, got.Status, want.Status)
			}
			if got.Body != want.Body {
				t.Errorf("round %d, %s: body through the proxy differs from the upstream's:\n got %.200q (%d bytes)\nwant %.200q (%d bytes)",
					round, e.Name, got.Body, len(got.Body), want.Body, len(want.Body))
			}
			if got.Close {
				t.Fatalf("round %d, %s: the proxy closes the client connection", round, e.Name)
			}
		}
	}
}

// CheckConcurrent runs clients connections to the proxy at once, each
// sending rounds requests (streamed ones too, with stream) one after another,
// and fails t where an answer is not the one its request asked for.
func CheckConcurrent(t *testing.T, proxyAddr string, clients, rounds int, stream bool) {
	t.Helper()
	conns := make([]*Conn, clients)
	for i := range conns {
		conns[i] = Dial(t, proxyAddr)
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i, c := range conns {
		wg.Go(func() {
			for r := range rounds {
				body := ChatBody("m", fmt.Sprintf("client %d round %d", i, r), false)
				want := ChatAnswer(body)
				if stream && r%2 == 1 {
					body = ChatBody("long", fmt.Sprintf("client %d round %d", i, r), true)
					want = StreamAnswer("long")
				}
				got, err := c.do(http.MethodPost, ChatPath, body)
				if err != nil {
					errs <- fmt.Errorf("client %d round %d: %w", i, r, err)
					return
				}
				if got.Status != http.StatusOK || got.Body != want {
					errs <- fmt.Errorf("client %d round %d: %d %.200q, want 200 %.200q", i, r, got.Status, got.Body, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

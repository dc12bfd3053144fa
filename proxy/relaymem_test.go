package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/kvsidecar/kvsidecar/engine"
)

// markConnector remembers each request's marker (the user's message) at
// Before and checks at After that the answer it hears carries that marker
// and no other: the relay's pooled memory reaches After (relayMem.answer).
type markConnector struct {
	fakeConnector
	mu    sync.Mutex
	marks map[*engine.Request]string
	bad   []string
	heard int
}

var markRe = regexp.MustCompile(`user-\d+-\d+`)

func (c *markConnector) Before(_ context.Context, r *engine.Request) ([]byte, error) {
	c.mu.Lock()
	c.marks[r] = markRe.FindString(string(r.Body))
	c.mu.Unlock()
	return nil, nil
}

func (c *markConnector) After(_ context.Context, r *engine.Request, resp *engine.Response) {
	body := string(resp.Body) // read during After only, as the contract says
	c.mu.Lock()
	defer c.mu.Unlock()
	want := c.marks[r]
	delete(c.marks, r)
	if resp.Status != 200 || body == "" {
		return // a client that left early may end before any event
	}
	c.heard++
	for _, m := range markRe.FindAllString(body, -1) {
		if m != want {
			c.bad = append(c.bad, fmt.Sprintf("request %s: after-hook heard %s", want, m))
		}
	}
}

// Streams from many clients at once, each answer made of the client's own
// marker, through relays whose buffers are pooled: every client reads only
// its own words, and so does the engine's after-hook, also when streams
// end early (the client leaves) and when events outgrow the pooled
// buffers. Run with -race, a pooled buffer still read by one stream while
// another fills it is also a reported race.
func TestRelayPooledMemoryNeverMixesStreams(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mark := markRe.FindString(string(b))
		w.Header().Set("Content-Type", "text/event-stream")
		var n int
		_, _ = fmt.Sscanf(mark, "user-%d-%d", new(int), &n)
		for i := range 12 {
			pad := strings.Repeat(mark+" ", (n*131+i*977)%(80<<10)/len(mark)) // up to 80 KiB: past relayKeep
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s %d %s\"}}]}\n\n", mark, i, pad)
			if i%3 == 0 {
				w.(http.Flusher).Flush()
			}
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"note\":\"%s\"}}\n\ndata: [DONE]\n\n", mark)
	}))
	t.Cleanup(up.Close)
	mc := &markConnector{marks: map[*engine.Request]string{}}
	base, srv := startSidecar(t, up.URL, func(o *Options) { o.Engine = mc })

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
	var wg sync.WaitGroup
	errs := make(chan error, 1024)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 15 {
				mark := fmt.Sprintf("user-%d-%d", g, i)
				body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + mark + `"}]}`
				resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					errs <- err
					return
				}
				leave := (g+i)%5 == 0 // this client leaves after a few events
				br := bufio.NewReader(resp.Body)
				events := 0
				for {
					ev, err := readEvent(br)
					if err != nil {
						break
					}
					events++
					for _, m := range markRe.FindAllString(ev, -1) {
						if m != mark {
							errs <- fmt.Errorf("client %s read %s", mark, m)
						}
					}
					if leave && events == 3 {
						break
					}
				}
				resp.Body.Close()
				if !leave && events != 14 {
					errs <- fmt.Errorf("client %s read %d events, want 14", mark, events)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	srv.waitIdle()
	eventually(t, func() bool {
		mc.mu.Lock()
		defer mc.mu.Unlock()
		return len(mc.marks) == 0
	})
	mc.mu.Lock()
	defer mc.mu.Unlock()
	for _, b := range mc.bad {
		t.Error(b)
	}
	if mc.heard < 8*15*3/4 {
		t.Errorf("after-hook heard %d answers, want most of %d", mc.heard, 8*15)
	}
}

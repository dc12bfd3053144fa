package main

// Native endpoints are safe for sessions (issue 33): a client using
// llama.cpp's own API through the sidecar — /completion with and without
// id_slot, /slots/{id}?action=save|restore|erase — while sessions run
// through it with --engine llamacpp on the real llama-server. No session
// turn fails, no session's KV is lost to a native request (a returning
// session reprocesses only its new tokens), and the native requests get
// the engine's own answers.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
)

func TestRealEngineNativeRequestsBesideSessions(t *testing.T) {
	s := newRealStack(t, 2, llamatest.Model(t), "--llamacpp-preload=false")
	base := "http://" + s.sc.addr
	native := func(path, body string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var v map[string]any
		_ = json.Unmarshal(b, &v)
		return resp.StatusCode, v
	}
	// The engine's own surface on the main port: its web UI, health,
	// props and metrics, byte for byte as direct (metrics: the same
	// series; their values move between two scrapes).
	get := func(url string) (int, string, []byte) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), b
	}
	for _, path := range []string{"/", "/health", "/props", "/v1/models", "/slots"} {
		dc, dt, db := get(s.llama.URL() + path)
		tc, tt, tb := get(base + path)
		if dc != tc || dt != tt || (path != "/slots" && string(db) != string(tb)) {
			t.Errorf("%s: direct %d %s %d bytes, through %d %s %d bytes", path, dc, dt, len(db), tc, tt, len(tb))
		}
	}
	series := func(b []byte) string {
		var names []string
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 2 && !strings.HasPrefix(l, "#") {
				names = append(names, f[0])
			}
		}
		return strings.Join(names, ",")
	}
	dc, _, dm := get(s.llama.URL() + "/metrics")
	tc, _, tm := get(base + "/metrics")
	if dc != 200 || tc != 200 || series(dm) != series(tm) || !strings.Contains(string(tm), "llamacpp:") || strings.Contains(string(tm), "sidecar_") {
		t.Errorf("/metrics through the main port is not the engine's: %d %d\n%s\n%s", dc, tc, series(dm), series(tm))
	}

	cs := s.convos("native", 2, 40)
	for _, c := range cs {
		s.say(c, "What is the first item?")
	}
	s.waitIdle()
	// Native completions naming each slot, in flight while the sessions
	// come back: the connector saves the sessions' KV before the native
	// requests take their slots, and restores it for their next turns
	// (without it each session would find its slot holding a native
	// prompt and reprocess its whole conversation).
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"prompt":"Native client %d writes a long story about boats","n_predict":48,"id_slot":%d,"grammar":"root ::= [a-z ]+"}`, i, i)
			resp, err := http.Post(base+"/completion", "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || !strings.Contains(string(b), `"content"`) {
				errs <- fmt.Errorf("native completion on slot %d: %d %s", i, resp.StatusCode, tail(string(b), 300))
			}
		}()
	}
	time.Sleep(150 * time.Millisecond) // the native requests are on their slots
	for _, c := range cs {
		checkReused(t, "session beside native completions "+c.id, s.say(c, "And the second?"))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if code, v := native("/completion", `{"prompt":"No slot named","n_predict":4,"grammar":"root ::= [a-z ]+"}`); code != 200 || v["content"] == nil {
		t.Fatalf("native completion without id_slot: %d %v", code, v)
	}
	s.waitIdle()

	// The client's own slot API: save slot 1 to a file of its own, erase
	// slot 0, restore its file into slot 1.
	file := fmt.Sprintf("native-client-%d.bin", 1)
	if code, v := native("/slots/1?action=save", `{"filename":"`+file+`"}`); code != 200 {
		t.Fatalf("native save: %d %v", code, v)
	}
	if code, v := native("/slots/0?action=erase", `{}`); code != 200 {
		t.Fatalf("native erase: %d %v", code, v)
	}
	if code, v := native("/slots/1?action=restore", `{"filename":"`+file+`"}`); code != 200 {
		t.Fatalf("native restore: %d %v", code, v)
	}
	for _, c := range cs {
		checkReused(t, "session after native slot actions "+c.id, s.say(c, "And the third?"))
	}
	if n := s.metric("sidecar_engine_native_saves_total") + s.metric("sidecar_engine_native_placed_total"); n == 0 {
		t.Errorf("the connector saw no native request it had to place or save for")
	}
}

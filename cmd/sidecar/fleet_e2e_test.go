package main

// A fleet of sidecars on a real redis-server (issue 13): the binary with
// --remote, several replicas (with real llama-servers, where KV is
// measured: cmd/sidecar-bench's TestFleetRealParts). Where redis-server is
// missing the tests skip, or fail under KVSIDECAR_REQUIRE_REDIS=1 (as in
// CI).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver/redistest"
)

// Concurrent turns of one session sent to two replicas never fork its
// history: each turn's question and reply end up side by side, each once,
// on both replicas' view (append-mode clients, a scripted upstream).
func TestFleetConcurrentTurnsNeverFork(t *testing.T) {
	srv := redistest.Start(t, redisserver.Options{})
	up := newScriptedUpstream(t)
	var reps []*child
	for range 2 {
		reps = append(reps, startChild(t, nil, "--upstream", up.URL, "--engine", "none", "--extract=false",
			"--remote", srv.URL(), "--log-format", "json"))
	}
	const turns = 16
	var wg sync.WaitGroup
	errs := make(chan error, turns)
	for i := range turns {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"tiny","messages":[{"role":"user","content":"question %d"}]}`, i)
			req, _ := http.NewRequest(http.MethodPost, "http://"+reps[i%2].addr+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer k")
			req.Header.Set("X-Session-ID", "shared")
			req.Header.Set("X-Session-Mode", "append")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				errs <- fmt.Errorf("turn %d: HTTP %d", i, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for k, rep := range reps {
		req, _ := http.NewRequest(http.MethodGet, "http://"+rep.addr+"/v1/sessions/shared", nil)
		req.Header.Set("Authorization", "Bearer k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Messages []struct{ Role, Content string }
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for j := 0; j < len(v.Messages); j += 2 {
			u, a := v.Messages[j], v.Messages[min(j+1, len(v.Messages)-1)]
			if u.Role != "user" || a.Role != "assistant" || a.Content != "echo: "+u.Content || seen[u.Content] {
				t.Fatalf("replica %d: messages %d-%d are %+v, %+v: a turn split, repeated or forked", k, j, j+1, u, a)
			}
			seen[u.Content] = true
		}
		if len(seen) != turns {
			t.Fatalf("replica %d holds %d turns of %d", k, len(seen), turns)
		}
	}
}

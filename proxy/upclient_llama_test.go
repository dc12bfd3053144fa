package proxy

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver/llamatest"
)

// TestRealLlamaServerRestart: two clients at once against a real
// llama-server that is killed (-9) and restarted on the same port between
// rounds; every request of every round succeeds. The pool's idle bound is
// high, so what saves the round after a restart is the check on checkout
// and the retry on a fresh connection, not the bound.
func TestRealLlamaServerRestart(t *testing.T) {
	llama := llamatest.Start(t, llamaserver.Options{Slots: 2, Threads: 1})
	base, s := startSidecar(t, llama.URL(), func(o *Options) { o.UpstreamIdleTimeout = time.Hour })
	body := `{"model":"m","max_tokens":2,"grammar":"root ::= [a-z ]+","messages":[{"role":"user","content":"hi"}]}`
	round := func(r int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]string, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, b := post(t, base+"/v1/chat/completions", body, nil)
				if resp.StatusCode != 200 {
					errs[i] = fmt.Sprintf("round %d client %d: %d %s", r, i, resp.StatusCode, b)
				}
			}()
		}
		wg.Wait()
		for _, e := range errs {
			if e != "" {
				t.Error(e)
			}
		}
	}
	round(0)
	for r := 1; r <= 3; r++ {
		llama.Kill()
		if err := llama.Restart(context.Background()); err != nil {
			t.Fatal(err)
		}
		round(r)
	}
	if t.Failed() {
		return
	}
	if _, ok := s.metrics.upErrors.Load(upErrUnreachable); ok {
		t.Error("an unreachable upstream was counted")
	}
}

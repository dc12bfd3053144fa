package main

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
)

// TestKVAcknowledgedPutsSurviveKill9 PUTs blocks through the KV API of the
// running binary from several clients, kills the process with SIGKILL while
// writes are in flight, restarts it on the same data dir and reads every
// block whose PUT was acknowledged: same bytes, same metadata.
func TestKVAcknowledgedPutsSurviveKill9(t *testing.T) {
	dataDir := t.TempDir()
	sc := startChild(t, nil, "--data-dir", dataDir, "--upstream", "http://127.0.0.1:1")
	type block struct {
		key  string
		data []byte
	}
	var (
		mu    sync.Mutex
		acked []block
		wg    sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				data := make([]byte, 2*(1+rng.IntN(128<<10))) // f16 elements
				for j := range data {
					data[j] = byte(rng.Uint32())
				}
				key := fmt.Sprintf("w%d/block-%d", w, i)
				req, _ := http.NewRequest(http.MethodPut, "http://"+sc.addr+"/v1/kv/llama/"+key, bytes.NewReader(data))
				req.Header.Set("X-KV-Dtype", "f16")
				req.Header.Set("Authorization", "Bearer crash")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // the process is gone
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusCreated {
					mu.Lock()
					acked = append(acked, block{key, data})
					mu.Unlock()
				}
			}
		}(w)
	}
	// Let some writes land, then kill without warning.
	waitUntil(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) >= 40 })
	if err := sc.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	<-sc.done

	sc2 := startChild(t, nil, "--data-dir", dataDir, "--upstream", "http://127.0.0.1:1")
	mu.Lock()
	defer mu.Unlock()
	for _, b := range acked {
		req, _ := http.NewRequest(http.MethodGet, "http://"+sc2.addr+"/v1/kv/llama/"+b.key, nil)
		req.Header.Set("Authorization", "Bearer crash")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Equal(got, b.data) || resp.Header.Get("X-KV-Dtype") != "f16" {
			t.Fatalf("acknowledged block %s after kill -9: status %d, %d bytes (want %d), dtype %q",
				b.key, resp.StatusCode, len(got), len(b.data), resp.Header.Get("X-KV-Dtype"))
		}
	}
	t.Logf("%d acknowledged blocks intact after kill -9", len(acked))
}

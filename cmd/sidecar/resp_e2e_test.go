package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// freePort returns a loopback address nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRESPKill9 SETs values through --resp-listen from four go-redis
// clients, kills the binary with SIGKILL while SETs are in flight,
// restarts it on the same folder and reads every acknowledged key: each is
// its exact bytes or missing, never other bytes; with --resp-fsync always
// none is missing, and with background at most --resp-unsynced-bytes (and
// the value being written) are.
func TestRESPKill9(t *testing.T) {
	const unsynced = 4 << 20
	for _, mode := range []string{"background", "always"} {
		t.Run(mode, func(t *testing.T) {
			dataDir := t.TempDir()
			addr := freePort(t)
			args := []string{"--data-dir", dataDir, "--upstream", "http://127.0.0.1:1", "--resp-listen", addr,
				"--kv-ram-bytes", "8MiB", "--resp-fsync", mode, "--resp-unsynced-bytes", strconv.Itoa(unsynced)}
			sc := startChild(t, nil, args...)
			ctx := context.Background()
			type kv struct {
				key  string
				data []byte
			}
			var (
				mu    sync.Mutex
				acked []kv
				wg    sync.WaitGroup
			)
			stop := make(chan struct{})
			for w := range 4 {
				wg.Go(func() {
					c := redis.NewClient(&redis.Options{Addr: addr, Password: "crash-test", MaxRetries: -1})
					defer c.Close()
					rng := rand.New(rand.NewPCG(uint64(w), 9))
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						data := make([]byte, 16<<10+rng.IntN(128<<10))
						for j := range data {
							data[j] = byte(rng.Uint32())
						}
						key := fmt.Sprintf("model@%08x@0@%064x", w, i)
						if c.Set(ctx, key, data, 0).Err() != nil {
							return // the process is gone
						}
						mu.Lock()
						acked = append(acked, kv{key, data})
						mu.Unlock()
					}
				})
			}
			// The race detector makes the Archive's compression slow: wait
			// for acknowledgements by count with room to spare.
			for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				mu.Lock()
				n := len(acked)
				mu.Unlock()
				if n >= 80 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d SETs acknowledged in 90 s", n)
				}
			}
			if err := sc.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			close(stop)
			wg.Wait()
			<-sc.done

			startChild(t, nil, args...)
			c := redis.NewClient(&redis.Options{Addr: addr, Password: "crash-test"})
			defer c.Close()
			other := redis.NewClient(&redis.Options{Addr: addr, Password: "another-tenant"})
			defer other.Close()
			mu.Lock()
			defer mu.Unlock()
			var lost, lostBytes, served int
			for _, v := range acked {
				got, err := c.Get(ctx, v.key).Bytes()
				switch {
				case errors.Is(err, redis.Nil):
					lost++
					lostBytes += len(v.data)
				case err != nil:
					t.Fatal(err)
				case !bytes.Equal(got, v.data):
					t.Fatalf("%s after kill -9: %d bytes that are not the %d acknowledged", v.key, len(got), len(v.data))
				default:
					served++
				}
			}
			if n, err := other.Exists(ctx, acked[0].key).Result(); err != nil || n != 0 {
				t.Fatalf("another tenant finds the key: %d %v", n, err)
			}
			t.Logf("%s: %d of %d acknowledged values served again after kill -9, %d lost (%d bytes)", mode, served, len(acked), lost, lostBytes)
			if mode == "always" && lost > 0 {
				t.Fatalf("--resp-fsync always lost %d acknowledged values", lost)
			}
			if lostBytes > unsynced+144<<10 {
				t.Fatalf("lost %d bytes, over --resp-unsynced-bytes (%d) and one value", lostBytes, unsynced)
			}
		})
	}
}

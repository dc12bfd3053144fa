package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvsidecar/kvsidecar/bench/harness/faultup"
)

// Nothing acknowledged is lost: every acknowledged turn and KV blob reads
// back after a restart and after kill -9 (verifyAcked), also with an
// archive file damaged on purpose.

// verifyAcked reads every acknowledged turn and blob from a (restarted)
// sidecar. It returns the turns missing and the blob bytes lost; with
// allowMissing ≥ 0, exactly that many blobs may answer 404 to both HEAD and
// GET (files the test corrupted on purpose).
func verifyAcked(t *testing.T, addr string, turns []ackedTurn, blobs []ackedBlob, allowMissing int) (lostTurns int, lostBytes int64) {
	t.Helper()
	type view struct {
		Messages []struct {
			Role, Content string
			Partial       bool
		}
	}
	bySession := map[[2]string][]ackedTurn{}
	for _, tn := range turns {
		k := [2]string{tn.key, tn.session}
		bySession[k] = append(bySession[k], tn)
	}
	for k, ts := range bySession {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/sessions/"+k[1], nil)
		req.Header.Set("Authorization", "Bearer "+k[0])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var v view
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_ = json.Unmarshal(b, &v)
		for _, tn := range ts {
			found := false
			for i := 0; i+1 < len(v.Messages); i++ {
				if v.Messages[i].Role == "user" && v.Messages[i].Content == tn.user {
					m := v.Messages[i+1]
					found = m.Role == "assistant" && m.Content == tn.reply && !m.Partial
					break
				}
			}
			if !found {
				lostTurns++
				if lostTurns <= 5 {
					t.Errorf("acknowledged turn lost: session %s/%s user %q (status %d)", k[0], k[1], tn.user, resp.StatusCode)
				}
			}
		}
	}
	missing := 0
	for _, bl := range blobs {
		url := "http://" + addr + "/v1/kv/" + bl.ns + "/" + bl.name
		head, _ := http.NewRequest(http.MethodHead, url, nil)
		head.Header.Set("Authorization", "Bearer "+bl.key)
		hr, err := http.DefaultClient.Do(head)
		if err != nil {
			t.Fatal(err)
		}
		hr.Body.Close()
		get, _ := http.NewRequest(http.MethodGet, url, nil)
		get.Header.Set("Authorization", "Bearer "+bl.key)
		gr, err := http.DefaultClient.Do(get)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(gr.Body)
		gr.Body.Close()
		switch {
		case gr.StatusCode == 200 && hr.StatusCode == 200 && bytes.Equal(got, bl.data) && hr.ContentLength == int64(len(bl.data)):
		case allowMissing >= 0 && gr.StatusCode == 404 && hr.StatusCode == 404:
			missing++
		default:
			lostBytes += int64(len(bl.data))
			t.Errorf("acknowledged blob %s/%s: HEAD %d (length %d), GET %d with %d bytes (want %d)",
				bl.ns, bl.name, hr.StatusCode, hr.ContentLength, gr.StatusCode, len(got), len(bl.data))
		}
	}
	if allowMissing >= 0 && missing != allowMissing {
		t.Errorf("%d blobs missing, want %d", missing, allowMissing)
		lostBytes++
	}
	return lostTurns, lostBytes
}

// corruptOneArchiveFile flips one payload byte of one archive file.
func corruptOneArchiveFile(t *testing.T, dir string) {
	t.Helper()
	var files []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.Contains(p, "quarantine") && !strings.HasSuffix(p, ".tmp") {
			if fi, _ := d.Info(); fi != nil && fi.Size() > 256 {
				files = append(files, p)
			}
		}
		return nil
	})
	if len(files) == 0 {
		t.Fatal("no archive file to corrupt")
	}
	sort.Strings(files)
	f := files[len(files)/2]
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-16] ^= 0xa5
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHostileAckedTurnsSurviveKill9: clients run chat turns (streamed and
// not, through openai-go) and KV PUTs; the sidecar is killed with SIGKILL
// the moment a reply is acknowledged, then restarted on the same data:
// every acknowledged turn's reply is in GET /v1/sessions/{id} and every
// acknowledged blob reads byte for byte (issue 12 row 15).
func TestHostileAckedTurnsSurviveKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary through kill -9 and restarts")
	}
	_, upstream := startFaultUpstream(t, faultup.Options{})
	dataDir := t.TempDir()
	args := []string{"--upstream", upstream}
	rounds := 3
	var turns []ackedTurn
	var blobs []ackedBlob
	for round := 0; round < rounds; round++ {
		p := startProc(t, dataDir, args...)
		var (
			mu     sync.Mutex
			killed atomic.Bool
			acks   int
			wg     sync.WaitGroup
		)
		// kill ends the process right after an acknowledgement, once
		// enough turns went through.
		ack := func(tn *ackedTurn, bl *ackedBlob) {
			mu.Lock()
			defer mu.Unlock()
			if killed.Load() {
				return // acknowledged after the kill: cannot be
			}
			if tn != nil {
				turns = append(turns, *tn)
			}
			if bl != nil {
				blobs = append(blobs, *bl)
			}
			acks++
			if tn != nil && acks >= 20 {
				killed.Store(true)
				_ = p.cmd.Process.Kill()
			}
		}
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				key := fmt.Sprintf("k%d", w%2)
				session := fmt.Sprintf("r%d-w%d", round, w)
				client := openai.NewClient(option.WithBaseURL("http://"+p.addr+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0),
					option.WithHeader("X-Session-ID", session), option.WithHeader("X-Session-Mode", "append"))
				rng := rand.New(rand.NewPCG(uint64(w), uint64(round)))
				for i := 0; !killed.Load(); i++ {
					user := fmt.Sprintf("round %d worker %d turn %d", round, w, i)
					params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(user)}}
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					var reply string
					var err error
					if rng.IntN(2) == 0 {
						s := client.Chat.Completions.NewStreaming(ctx, params)
						for s.Next() {
							if len(s.Current().Choices) > 0 {
								reply += s.Current().Choices[0].Delta.Content
							}
						}
						err = s.Err()
					} else {
						var c *openai.ChatCompletion
						if c, err = client.Chat.Completions.New(ctx, params); err == nil && len(c.Choices) > 0 {
							reply = c.Choices[0].Message.Content
						}
					}
					cancel()
					if err == nil {
						ack(&ackedTurn{key, session, user, reply}, nil)
					}
					if i%3 == 0 && !killed.Load() {
						data := make([]byte, 2*(1+rng.IntN(16<<10)))
						for j := range data {
							data[j] = byte(rng.Uint32())
						}
						name := fmt.Sprintf("r%d/w%d/%d", round, w, i)
						req, _ := http.NewRequest(http.MethodPut, "http://"+p.addr+"/v1/kv/crash/"+name, bytes.NewReader(data))
						req.Header.Set("Authorization", "Bearer "+key)
						if resp, err := http.DefaultClient.Do(req); err == nil {
							resp.Body.Close()
							if resp.StatusCode == 201 {
								ack(nil, &ackedBlob{key, "crash", name, data})
							}
						}
					}
				}
			}(w)
		}
		wg.Wait()
		<-p.done
		if c := p.crashes(); len(c) > 0 {
			t.Fatalf("child output: %q", c)
		}
	}
	p := startProc(t, dataDir, args...)
	lostTurns, lostBytes := verifyAcked(t, p.addr, turns, blobs, -1)
	t.Logf("kill -9 ×%d: %d acknowledged turns, %d acknowledged blobs; lost %d turns, %d bytes", rounds, len(turns), len(blobs), lostTurns, lostBytes)
	if lostTurns > 0 || lostBytes > 0 {
		t.Fatalf("lost %d acknowledged turns and %d bytes across kill -9", lostTurns, lostBytes)
	}
}

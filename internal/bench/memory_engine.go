package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// EngineOptions configure RunEngine.
type EngineOptions struct {
	// Data is a LoCoMo-format JSON file; Sidecar the running sidecar's base
	// URL, in front of a real llama.cpp server. Required.
	Data, Sidecar string
	// Model names the requests' model. Empty: "locomo-replay".
	Model string
	// Conversations and Turns limit the replay (zero: all).
	Conversations, Turns int
	// Progress, when set, receives a line per conversation.
	Progress io.Writer
}

// EngineReport is what the engine itself reports of the replay: how many
// prompt tokens it took from its cache (timings.cache_n) and how many it
// computed (timings.prompt_n), in its own tokens.
type EngineReport struct {
	Turns          int     `json:"turns"` // turns after each conversation's first
	CachedTokens   int64   `json:"cached_tokens"`
	ComputedTokens int64   `json:"computed_tokens"`
	CachedPct      float64 `json:"cached_pct"` // Σ cached / Σ (cached + computed), from the second turn
	MedianPct      float64 `json:"median_pct"` // per-turn cached share
	P10Pct         float64 `json:"p10_pct"`
	Seconds        float64 `json:"seconds"`
}

// RunEngine replays conversations as the drop-in client (system message and
// newest user message, no header) through a sidecar in front of a real
// llama.cpp server and reads the engine's prompt-cache figures from each
// answer's timings. The engine answers for the other speaker (with a
// grammar and a few tokens: a random-weight test model emits invalid bytes
// otherwise), so only the user side follows the recording.
func RunEngine(o EngineOptions) (EngineReport, error) {
	if o.Data == "" || o.Sidecar == "" {
		return EngineReport{}, errors.New("bench: engine: Data and Sidecar are required")
	}
	if o.Model == "" {
		o.Model = "locomo-replay"
	}
	convs, err := LoadLocomo(o.Data)
	if err != nil {
		return EngineReport{}, err
	}
	if o.Conversations > 0 && o.Conversations < len(convs) {
		convs = convs[:o.Conversations]
	}
	start := time.Now()
	hc := &http.Client{Timeout: 5 * time.Minute}
	var rep EngineReport
	var shares []float64
	for _, c := range convs {
		turns := locomoReplay(c)
		if o.Turns > 0 && o.Turns < len(turns) {
			turns = turns[:o.Turns]
		}
		for i, t := range turns {
			body, _ := json.Marshal(map[string]any{"model": o.Model, "max_tokens": 8, "grammar": "root ::= [a-z ]+",
				"messages": []memMsg{{"system", memorySystem}, {"user", t.user}}})
			req, _ := http.NewRequest(http.MethodPost, strings.TrimSuffix(o.Sidecar, "/")+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer bench-memory")
			req.Header.Set("X-Session-ID", c.ID+"/engine")
			resp, err := hc.Do(req)
			if err != nil {
				return rep, err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return rep, fmt.Errorf("bench: engine: %s turn %d: status %d: %.300s", c.ID, i, resp.StatusCode, b)
			}
			var out struct {
				Timings struct {
					CacheN  int64 `json:"cache_n"`
					PromptN int64 `json:"prompt_n"`
				} `json:"timings"`
			}
			if err := json.Unmarshal(b, &out); err != nil {
				return rep, fmt.Errorf("bench: engine: answer: %w", err)
			}
			if i == 0 {
				continue // nothing to reuse yet
			}
			rep.Turns++
			rep.CachedTokens += out.Timings.CacheN
			rep.ComputedTokens += out.Timings.PromptN
			if n := out.Timings.CacheN + out.Timings.PromptN; n > 0 {
				shares = append(shares, 100*float64(out.Timings.CacheN)/float64(n))
			}
		}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "%s: %d turns through the engine\n", c.ID, len(turns))
		}
	}
	if n := rep.CachedTokens + rep.ComputedTokens; n > 0 {
		rep.CachedPct = recallRound1(100 * float64(rep.CachedTokens) / float64(n))
	}
	if len(shares) > 0 {
		slices.Sort(shares)
		rep.MedianPct = recallRound1(shares[len(shares)/2])
		rep.P10Pct = recallRound1(shares[len(shares)/10])
	}
	rep.Seconds = float64(int(time.Since(start).Seconds()*10)) / 10
	return rep, nil
}

// WriteEngineTable prints r for people.
func WriteEngineTable(w io.Writer, r EngineReport) error {
	_, err := fmt.Fprintf(w, "drop-in replay through the sidecar in front of a real llama.cpp server: %d turns in %.0f s\n"+
		"engine prompt tokens taken from its cache: %.1f%% (%d cached, %d computed); per turn median %.1f%%, p10 %.1f%%\n",
		r.Turns, r.Seconds, r.CachedPct, r.CachedTokens, r.ComputedTokens, r.MedianPct, r.P10Pct)
	return err
}

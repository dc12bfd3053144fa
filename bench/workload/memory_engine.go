package workload

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
	// Direct, when set, is that llama.cpp server's own URL: the same turns
	// are then replayed straight to it by a full-history client (trimming
	// its oldest turns when the engine refuses the context), after the
	// sidecar's replay, for the per-turn comparison.
	Direct string
	// Model names the requests' model. Empty: "locomo-replay".
	Model string
	// Conversations and Turns limit the replay (zero: all).
	Conversations, Turns int
	// Only, when set, replays only the conversations with these
	// (zero-based) positions in the file, as MemoryOptions.Only.
	Only []int
	// Progress, when set, receives a line per conversation.
	Progress io.Writer
	// PerTurn keeps each turn's engine figures in the report.
	PerTurn bool
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
	// Per turn, tokens the engine computed: the sidecar's (median, mean,
	// p90) and, with Direct, the direct client's.
	ComputedMedian, ComputedMean, ComputedP90 float64
	// Direct is the direct full-history client's replay (nil without
	// EngineOptions.Direct); OverDirectMean is the sidecar's mean per-turn
	// computed tokens minus the direct client's.
	Direct         *EngineReport `json:"direct,omitempty"`
	OverDirectMean float64       `json:"over_direct_mean,omitempty"`
	// PerTurn is each counted turn's [cached, computed] engine tokens, in
	// replay order (EngineOptions.PerTurn).
	PerTurn [][2]int64 `json:"per_turn,omitempty"`
	Seconds float64    `json:"seconds"`
}

// RunEngine replays conversations as the drop-in client (system message and
// newest user message, no header) through a sidecar in front of a real
// llama.cpp server and reads the engine's prompt-cache figures from each
// answer's timings; with Direct, the same turns again straight to the
// engine as a full-history client. The engine answers for the other
// speaker (with a grammar and a few tokens: a random-weight test model
// emits invalid bytes otherwise), so only the user side follows the
// recording.
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
	if len(o.Only) > 0 {
		var only []LocomoConversation
		for _, i := range o.Only {
			if i < 0 || i >= len(convs) {
				return EngineReport{}, fmt.Errorf("bench: engine: conversation %d: the file has %d", i, len(convs))
			}
			only = append(only, convs[i])
		}
		convs = only
	}
	if o.Conversations > 0 && o.Conversations < len(convs) {
		convs = convs[:o.Conversations]
	}
	start := time.Now()
	rep, err := replayEngine(o, convs, false)
	if err != nil || o.Direct == "" {
		rep.Seconds = float64(int(time.Since(start).Seconds()*10)) / 10
		return rep, err
	}
	d, err := replayEngine(o, convs, true)
	if err != nil {
		return rep, err
	}
	rep.Direct = &d
	rep.OverDirectMean = recallRound1(rep.ComputedMean - d.ComputedMean)
	rep.Seconds = float64(int(time.Since(start).Seconds()*10)) / 10
	return rep, nil
}

// engineTimings is what one answer says of its prompt.
type engineTimings struct {
	Timings struct {
		CacheN  int64 `json:"cache_n"`
		PromptN int64 `json:"prompt_n"`
	} `json:"timings"`
	Choices []struct {
		Message memMsg `json:"message"`
	} `json:"choices"`
}

func replayEngine(o EngineOptions, convs []LocomoConversation, direct bool) (EngineReport, error) {
	hc := &http.Client{Timeout: 5 * time.Minute}
	var rep EngineReport
	var shares, computed []float64
	post := func(url, session string, msgs []memMsg) (engineTimings, int, []byte, error) {
		body, _ := json.Marshal(map[string]any{"model": o.Model, "max_tokens": 8, "grammar": "root ::= [a-z ]+", "messages": msgs})
		req, _ := http.NewRequest(http.MethodPost, strings.TrimSuffix(url, "/")+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer bench-memory")
		req.Header.Set("X-Session-ID", session)
		resp, err := hc.Do(req)
		if err != nil {
			return engineTimings{}, 0, nil, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out engineTimings
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(b, &out); err != nil {
				return out, resp.StatusCode, b, fmt.Errorf("bench: engine: answer: %w", err)
			}
		}
		return out, resp.StatusCode, b, nil
	}
	for _, c := range convs {
		turns := locomoReplay(c)
		if o.Turns > 0 && o.Turns < len(turns) {
			turns = turns[:o.Turns]
		}
		hist := []memMsg{{"system", memorySystem}}
		for i, t := range turns {
			var (
				out    engineTimings
				status int
				b      []byte
				err    error
			)
			if direct {
				hist = append(hist, memMsg{"user", t.user})
				for {
					out, status, b, err = post(o.Direct, c.ID+"/direct", hist)
					if err != nil || status != http.StatusBadRequest || len(hist) <= 3 {
						break
					}
					// The engine refused the context: a trimming client
					// drops its oldest quarter of turns and sends again.
					drop := max(2, (len(hist)-2)/4) &^ 1
					hist = append(hist[:1], hist[1+drop:]...)
				}
			} else {
				out, status, b, err = post(o.Sidecar, c.ID+"/engine", []memMsg{{"system", memorySystem}, {"user", t.user}})
			}
			if err != nil {
				return rep, err
			}
			if status != http.StatusOK {
				return rep, fmt.Errorf("bench: engine: %s turn %d: status %d: %.300s", c.ID, i, status, b)
			}
			if direct && len(out.Choices) > 0 {
				hist = append(hist, out.Choices[0].Message)
			}
			if i == 0 {
				continue // nothing to reuse yet
			}
			rep.Turns++
			rep.CachedTokens += out.Timings.CacheN
			rep.ComputedTokens += out.Timings.PromptN
			if o.PerTurn {
				rep.PerTurn = append(rep.PerTurn, [2]int64{out.Timings.CacheN, out.Timings.PromptN})
			}
			computed = append(computed, float64(out.Timings.PromptN))
			if n := out.Timings.CacheN + out.Timings.PromptN; n > 0 {
				shares = append(shares, 100*float64(out.Timings.CacheN)/float64(n))
			}
		}
		if o.Progress != nil {
			who := "through the sidecar"
			if direct {
				who = "direct"
			}
			fmt.Fprintf(o.Progress, "%s: %d turns %s\n", c.ID, len(turns), who)
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
	if len(computed) > 0 {
		slices.Sort(computed)
		sum := 0.0
		for _, v := range computed {
			sum += v
		}
		rep.ComputedMedian = computed[len(computed)/2]
		rep.ComputedMean = recallRound1(sum / float64(len(computed)))
		rep.ComputedP90 = computed[len(computed)*9/10]
	}
	return rep, nil
}

// WriteEngineTable prints r for people.
func WriteEngineTable(w io.Writer, r EngineReport) error {
	_, err := fmt.Fprintf(w, "drop-in replay through the sidecar in front of a real llama.cpp server: %d turns in %.0f s\n"+
		"engine prompt tokens taken from its cache: %.1f%% (%d cached, %d computed); per turn median %.1f%%, p10 %.1f%%\n"+
		"tokens computed per turn: median %.0f, mean %.1f, p90 %.0f\n",
		r.Turns, r.Seconds, r.CachedPct, r.CachedTokens, r.ComputedTokens, r.MedianPct, r.P10Pct, r.ComputedMedian, r.ComputedMean, r.ComputedP90)
	if err != nil || r.Direct == nil {
		return err
	}
	d := r.Direct
	_, err = fmt.Fprintf(w, "the same turns straight to the engine, full history (oldest quarter dropped when the engine refuses the context):\n"+
		"engine prompt tokens taken from its cache: %.1f%% (%d cached, %d computed); per turn median %.1f%%, p10 %.1f%%\n"+
		"tokens computed per turn: median %.0f, mean %.1f, p90 %.0f; the sidecar's mean minus the direct client's: %+.1f tokens a turn\n",
		d.CachedPct, d.CachedTokens, d.ComputedTokens, d.MedianPct, d.P10Pct, d.ComputedMedian, d.ComputedMean, d.ComputedP90, r.OverDirectMean)
	return err
}

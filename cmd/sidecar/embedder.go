package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/obs"
)

// openEmbedder returns the recall embedder --embedder names: nil for the
// offline one, else an OpenAI-compatible client of --embedding-url (default
// --upstream), probed once so a persisted index of another vector space is
// not loaded as is. A probe that fails is only logged: recall falls back to
// words until the endpoint answers.
func openEmbedder(ctx context.Context, c *serveConfig, log *slog.Logger) (*index.OpenAIEmbedder, error) {
	switch c.embedder {
	case "offline", "":
		return nil, nil
	case "upstream":
	default:
		return nil, fmt.Errorf("--embedder %q: want offline or upstream", c.embedder)
	}
	url := c.embeddingURL
	if url == "" {
		url = c.upstream
	}
	e, err := index.NewOpenAIEmbedder(index.OpenAIOptions{BaseURL: url, APIKey: c.summaryKey, Model: c.embeddingModel,
		Dim: c.embeddingDim, Timeout: c.embedTimeout, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("--embedder upstream: %w", err)
	}
	t := time.Now()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := e.Probe(pctx); err != nil {
		log.Warn("embeddings endpoint not answering at start: recall uses words until it does", "url", url, "err", err)
	} else {
		st := e.Stats()
		log.Info("embeddings endpoint", "url", url, "space", st.Space, "dim", st.Dim, "ms", time.Since(t).Milliseconds())
	}
	return e, nil
}

// exportEmbedderMetrics mirrors the remote embedder's counters into reg at
// each scrape.
func exportEmbedderMetrics(reg *obs.Registry, e *index.OpenAIEmbedder) {
	reg.OnScrape(func() { mirrorEmbedder(reg, e.Stats()) })
}

func mirrorEmbedder(reg *obs.Registry, st index.EmbedderStats) {
	for _, c := range []struct {
		name, help string
		v          int64
	}{
		{"calls", "Embedding calls (a batch of one session's or one user's texts, or a query).", st.Calls},
		{"failures", "Embedding calls that failed: recall fell back to words, or the texts are indexed at a later sync.", st.Failures},
		{"fast_failures", "Of the failures, calls refused during the endpoint's cooldown without a request.", st.FastFails},
		{"requests", "Requests to the embeddings endpoint, retries included.", st.Requests},
		{"retries", "Requests sent again after a broken connection, a timeout, a 429 or a 5xx.", st.Retries},
		{"texts", "Texts asked for.", st.Texts},
		{"cache_hits", "Texts answered from the cache or another call's request.", st.CacheHits},
		{"embedded", "Texts the endpoint embedded.", st.Embedded},
		{"truncated", "Texts cut to the endpoint's input limit before they were sent.", st.Truncated},
		{"space_changes", "Changes of the endpoint's vector space (model or dimension): indexes re-embed their documents.", st.SpaceChanges},
	} {
		reg.SetCounter("sidecar_embedder_"+c.name+"_total", c.help, c.v)
	}
	reg.SetFloatCounter("sidecar_embedder_request_seconds_total", "Time spent in requests to the embeddings endpoint.", st.RequestSeconds)
	down := 0
	if st.Down {
		down = 1
	}
	for _, g := range []struct {
		name, help string
		v          int64
	}{
		{"cache_entries", "Embeddings cached.", int64(st.CacheEntries)},
		{"cache_bytes", "Bytes of the cached embeddings.", st.CacheBytes},
		{"dimension", "The endpoint's vector dimension (0: not known yet).", int64(st.Dim)},
		{"input_limit_bytes", "Texts are cut to this many bytes (lowered when the endpoint refuses an input as too large).", int64(st.InputCap)},
		{"down", "1 while the endpoint is failing (recall by words), else 0.", int64(down)},
	} {
		reg.SetGauge("sidecar_embedder_"+g.name, g.help, float64(g.v))
	}
}

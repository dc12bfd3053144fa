package admin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/histogram"
	"github.com/kvsidecar/kvsidecar/internal/sidecartest"
	"github.com/kvsidecar/kvsidecar/memory/memorytest"
	"github.com/kvsidecar/kvsidecar/proxy"
)

// The admin listener's tests run it as the sidecar does (cmd/sidecar
// wires the two): a proxy.Server on a main listener and a Server on an
// admin listener, reading its requests through the proxy's front door.

// sidecarOptions are a test sidecar's: the proxy's, and the admin
// listener's console options beside them.
type sidecarOptions struct {
	proxy.Options
	AdminToken         string
	Pprof              bool
	Knowledge          Knowledge
	RESP               RESP
	ConsoleSampleEvery time.Duration
}

// startSidecar serves a proxy for upstreamURL and its admin listener on
// loopback ports and returns the main listener's base URL (adminURL gives
// the admin listener's) and the proxy. Both are shut down when the test
// ends.
func startSidecar(t *testing.T, upstreamURL string, mod func(*sidecarOptions)) (string, *proxy.Server) {
	t.Helper()
	o := sidecarOptions{Options: proxy.Options{Upstream: upstreamURL, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), NoContextProbe: true}}
	o.EventLoop = os.Getenv("SIDECAR_TEST_EVENT_LOOP") != ""
	if mod != nil {
		mod(&o)
	}
	var win *Windows
	if o.AdminToken != "" {
		win = NewWindows(ConsoleWindows)
		o.Windows = win
	}
	px, err := proxy.New(o.Options)
	if err != nil {
		t.Fatal(err)
	}
	ao := Options{Token: o.AdminToken, Pprof: o.Pprof, SampleEvery: o.ConsoleSampleEvery, Logger: o.Logger,
		Front: px, Health: px, Metrics: px.Metrics(), Sessions: px, Windows: win, Knowledge: o.Knowledge, RESP: o.RESP}
	if m, ok := o.Memory.(Memory); ok {
		ao.Memory = m
	}
	if o.KV != nil {
		ao.KV = o.KV
	}
	if h := engine.Wrap(o.Engine); h != nil {
		ao.Engine = h
	}
	adm, err := New(ao)
	if err != nil {
		t.Fatal(err)
	}
	base := sidecartest.ServeSidecar(t, px.Serve, adm.Serve, func(ctx context.Context) {
		_ = px.Shutdown(ctx)
		_ = adm.Shutdown(ctx)
	})
	return base, px
}

// The helpers the admin and proxy tests share (package sidecartest).
var (
	adminURL        = sidecartest.AdminURL // the admin listener of the sidecar startSidecar started at a base URL
	noPoolClient    = sidecartest.NoPoolClient
	post            = sidecartest.Post
	getJSON         = sidecartest.GetJSON
	wantOpenAIError = sidecartest.WantOpenAIError
	// eventually polls for what lands after a response (a reply
	// recorded, package memory's background work).
	eventually           = sidecartest.Eventually
	newRecordingUpstream = sidecartest.NewRecordingUpstream
	openMemory           = memorytest.Open
)

// tenantOf is the tenant the proxy derives from an Authorization header
// (package proxy's session.go): "t_" and the first 8 bytes of the
// bearer token's SHA-256 in hex.
func tenantOf(authorization []byte) string {
	tok := strings.TrimSpace(string(authorization))
	if len(tok) >= 6 && strings.EqualFold(tok[:6], "bearer") && (len(tok) == 6 || tok[6] == ' ') {
		tok = strings.TrimSpace(tok[6:])
	}
	if tok == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(tok))
	return "t_" + hex.EncodeToString(sum[:8])
}

// fakeSessions is a Sessions whose window counters the test sets.
type fakeSessions struct {
	mu                          sync.Mutex
	turns, windowTokens, limits uint64
	recall                      []time.Duration
}

func (f *fakeSessions) DeleteSession(context.Context, string, string) error { return nil }

func (f *fakeSessions) WindowCounters() (turns, windowTokens, windowLimit uint64, recall histogram.Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h histogram.Histogram
	for _, d := range f.recall {
		h.Observe(d)
	}
	return f.turns, f.windowTokens, f.limits, h.Snapshot()
}

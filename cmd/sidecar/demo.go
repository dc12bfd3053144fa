package main

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/mockup"
)

// defaultUpstream is --upstream's default: where --demo looks for a
// running server before it starts its own.
const defaultUpstream = "http://127.0.0.1:8000"

// upstreamDialTimeout bounds the start's reachability check of the
// upstream.
const upstreamDialTimeout = time.Second

// dialUpstream reports whether a TCP connection to the upstream URL's host
// and port opens within timeout (nil), or why not. It is the start's check,
// not readiness: /readyz asks the server itself.
func dialUpstream(raw string, timeout time.Duration) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("not a URL with a host: %q", raw)
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	c, err := net.DialTimeout("tcp", host, timeout)
	if err != nil {
		return err
	}
	return c.Close()
}

// unreachableWarning is what the start logs when the upstream does not
// answer: the URL, why, and the ways out.
func unreachableWarning(upstream string, err error) string {
	return fmt.Sprintf("UPSTREAM UNREACHABLE at %s (%v): chat requests get 502 until a server answers there. "+
		"Start your OpenAI-compatible server (llama-server, vLLM, Ollama …) at that address, or point --upstream "+
		"(SIDECAR_UPSTREAM) at it; to try the sidecar without one, run make run or sidecar serve --demo", upstream, err)
}

// demoStart is what --demo started: the embedded upstream to close, and
// whether the sidecar serves in front of it (false: a real upstream was
// configured or found).
type demoStart struct {
	embedded bool
	close    func() error
	// extractEvery is memory's Extraction.Every: with the embedded
	// upstream, facts are extracted after every turn (2 messages), so the
	// first turn already shows one; otherwise 0, the default.
	extractEvery int
}

// startDemo decides what --demo does, before anything else opens. With an
// upstream configured (c.upstreamSet) or one answering at the default
// address, nothing: the sidecar serves in front of it. Otherwise it starts
// the embedded demo upstream (mockup.Demo) on a loopback port, points
// c.upstream at it, keeps the demo's data in <data-dir>/demo apart from a
// real upstream's, and turns the console on with a generated admin token
// when none is set. Its first log lines say so.
func startDemo(c *serveConfig, log *slog.Logger) (demoStart, error) {
	if c.upstreamSet {
		return demoStart{}, nil
	}
	lookAt := cmp.Or(c.demoLookAt, defaultUpstream)
	if err := dialUpstream(lookAt, upstreamDialTimeout); err == nil {
		log.Info("demo: an upstream answers at the default address; serving in front of it", "upstream", lookAt)
		c.upstream = lookAt
		return demoStart{}, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return demoStart{}, fmt.Errorf("demo upstream: %w", err)
	}
	up := mockup.New(mockup.Demo())
	served := make(chan error, 1)
	go func() { served <- up.Serve(ln) }()
	c.upstream = "http://" + ln.Addr().String()
	c.dataDir = filepath.Join(c.dataDir, "demo")
	if c.adminToken == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b) // never fails (crypto/rand's contract)
		c.adminToken = "demo-" + hex.EncodeToString(b)
	}
	log.Warn("DEMO MODE: no upstream is configured (--upstream, SIDECAR_UPSTREAM) and none answers at "+lookAt+
		"; the sidecar serves in front of an embedded demo upstream whose answers describe what the sidecar sent it (no model). "+
		"For a real server: SIDECAR_UPSTREAM=http://host:port make run",
		"demo_upstream", c.upstream, "data_dir", c.dataDir)
	return demoStart{embedded: true, extractEvery: 2, close: func() error {
		err := up.Close()
		<-served
		return err
	}}, nil
}

// consoleURL is the console's address for a sidecar listening on addr:
// the one place that says where the console is.
func consoleURL(addr string) string { return "http://" + addr + "/ui/" }

// writeDemoHints prints what to try against a demo sidecar listening on
// addr: two chat turns of one session, its memory, and the console on the
// admin listener consoleAddr ("" when it is off).
func writeDemoHints(w io.Writer, addr, consoleAddr, adminToken string) {
	base := "http://" + addr
	chat := func(text string) string {
		return "curl -s " + base + "/v1/chat/completions -H 'Authorization: Bearer sk-demo' -H 'X-Session-ID: demo-1' \\\n" +
			"       -d '{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"" + text + "\"}]}'"
	}
	var b strings.Builder
	b.WriteString("\nkvsidecar is running in front of the embedded demo upstream. Try, in another terminal:\n\n")
	b.WriteString("  # 1. a chat turn in session demo-1 (any API key works; it names your tenant)\n")
	b.WriteString("  " + chat("My name is Ada and I write Go.") + "\n")
	b.WriteString("  # 2. the next turn sends only the new message: the answer lists the history the sidecar added\n")
	b.WriteString("  " + chat("Which language do I write?") + "\n")
	b.WriteString("  # 3. what the sidecar keeps of the session (its messages and the facts extracted in the background)\n")
	b.WriteString("  curl -s " + base + "/v1/sessions/demo-1/memory -H 'Authorization: Bearer sk-demo'\n")
	if consoleAddr != "" {
		b.WriteString("  # 4. the console, in a browser: " + consoleURL(consoleAddr) + " with the admin token " + adminToken + "\n\n")
	} else {
		b.WriteString("  # 4. the console is off with --admin-listen off\n\n")
	}
	_, _ = io.WriteString(w, b.String())
}

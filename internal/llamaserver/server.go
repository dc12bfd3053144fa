package llamaserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configure Start. Model is required; every zero value is a
// documented default.
type Options struct {
	// Binary is the llama-server to run. Empty: FindServer().
	Binary string
	// Model is the GGUF file to serve (-m). Required.
	Model string
	// Slots is -np, the parallel slots. Zero: 1.
	Slots int
	// Ctx is -c, the context of all slots together. Zero: 4096 per slot
	// (the tiny model's training context; the server caps a slot there).
	Ctx int
	// SlotDir is --slot-save-path. Empty: a folder in the server's
	// temporary folder, which Close removes.
	SlotDir string
	// CacheRAMMiB is --cache-ram, the size of the server's RAM prompt
	// cache. Zero: not passed (the server's default, 8192 MiB); negative:
	// the cache is off (--cache-ram 0).
	CacheRAMMiB int
	// Threads is -t, the server's CPU threads. Zero: the server's default
	// (all cores; two servers side by side then oversubscribe the CPU).
	Threads int
	// Args are appended to the command line after the ones this package
	// sets (-m, --host, --port, -c, -np, --slot-save-path, --cache-ram, -t,
	// --metrics, --no-jinja, --chat-template chatml, --reasoning-format none).
	Args []string
	// LogFile receives the server's stdout and stderr, appended across
	// restarts. Empty: llama-server.log in the server's temporary folder.
	LogFile string
	// StartTimeout bounds each start, until GET /health answers 200. Zero:
	// 60 s.
	StartTimeout time.Duration
	// Env is added to the server's environment.
	Env []string
}

func (o *Options) validate() error {
	switch {
	case o.Model == "":
		return errors.New("llamaserver: no Model")
	case o.Slots < 0 || o.Ctx < 0 || o.StartTimeout < 0 || o.Threads < 0:
		return errors.New("llamaserver: negative option")
	}
	if o.Binary == "" {
		b, err := FindServer()
		if err != nil {
			return err
		}
		o.Binary = b
	}
	if o.Slots == 0 {
		o.Slots = 1
	}
	if o.Ctx == 0 {
		o.Ctx = 4096 * o.Slots
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 60 * time.Second
	}
	return nil
}

// Server is a running (or killed, then restartable) llama-server. Create one
// with Start and Close it. Safe for concurrent use.
type Server struct {
	opts Options
	tmp  string // owned temporary folder ("" when none was needed)

	// mu protects the fields below.
	mu    sync.Mutex
	port  int
	model string
	proc  *proc // the latest process; nil before the first start
	log   *os.File
}

// proc is one llama-server process and the goroutine that reaps it.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd was reaped
	err  error         // cmd.Wait's error, readable after done
}

// Start runs llama-server on a free loopback port and returns once GET
// /health answers 200. On error nothing is left running.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, model: opts.Model}
	if opts.SlotDir == "" || opts.LogFile == "" {
		tmp, err := os.MkdirTemp("", "llamaserver-*")
		if err != nil {
			return nil, fmt.Errorf("llamaserver: %w", err)
		}
		s.tmp = tmp
		if s.opts.SlotDir == "" {
			s.opts.SlotDir = filepath.Join(tmp, "slots")
		}
		if s.opts.LogFile == "" {
			s.opts.LogFile = filepath.Join(tmp, "llama-server.log")
		}
	}
	if err := os.MkdirAll(s.opts.SlotDir, 0o755); err != nil {
		s.removeTmp()
		return nil, fmt.Errorf("llamaserver: slot dir: %w", err)
	}
	f, err := os.OpenFile(s.opts.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.removeTmp()
		return nil, fmt.Errorf("llamaserver: log: %w", err)
	}
	s.log = f
	// A free port can be taken between closing the probe listener and the
	// server's bind: try a few.
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			s.Close()
			return nil, err
		}
		s.mu.Lock()
		s.port = port
		err = s.startLocked(ctx)
		s.mu.Unlock()
		if err == nil {
			return s, nil
		}
		if attempt < 3 && strings.Contains(strings.ToLower(s.LogTail(4096)), "bind") {
			continue
		}
		s.Close()
		return nil, err
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("llamaserver: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// args is the command line for the current model and port.
func (s *Server) args() []string {
	o := s.opts
	a := []string{"-m", s.model, "--host", "127.0.0.1", "--port", strconv.Itoa(s.port),
		"-c", strconv.Itoa(o.Ctx), "-np", strconv.Itoa(o.Slots), "--slot-save-path", o.SlotDir}
	switch {
	case o.CacheRAMMiB > 0:
		a = append(a, "--cache-ram", strconv.Itoa(o.CacheRAMMiB))
	case o.CacheRAMMiB < 0:
		a = append(a, "--cache-ram", "0")
	}
	if o.Threads > 0 {
		a = append(a, "-t", strconv.Itoa(o.Threads))
	}
	a = append(a, "--metrics", "--no-jinja", "--chat-template", "chatml", "--reasoning-format", "none")
	return append(a, o.Args...)
}

// startLocked starts the process and waits for its health. Called with
// s.mu held and no process running.
func (s *Server) startLocked(ctx context.Context) error {
	args := s.args()
	fmt.Fprintf(s.log, "=== %s llamaserver: %s %s\n", time.Now().Format(time.RFC3339Nano), s.opts.Binary, strings.Join(args, " "))
	cmd := exec.Command(s.opts.Binary, args...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.Env = append(os.Environ(), s.opts.Env...)
	cmd.SysProcAttr = SysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("llamaserver: start %s: %w", s.opts.Binary, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	s.proc = p
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	ctx, cancel := context.WithTimeout(ctx, s.opts.StartTimeout)
	defer cancel()
	url := s.urlLocked() + "/health"
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("llamaserver: exited before it was healthy (%v); log %s ends:\n%s", p.err, s.opts.LogFile, s.LogTail(2048))
		case <-ctx.Done():
			s.killLocked()
			return fmt.Errorf("llamaserver: not healthy after %v: %w; log %s ends:\n%s", s.opts.StartTimeout, ctx.Err(), s.opts.LogFile, s.LogTail(2048))
		case <-tick.C:
		}
	}
}

// killLocked sends SIGKILL and waits until the process is reaped. Called
// with s.mu held; it releases mu while it waits.
func (s *Server) killLocked() {
	p := s.proc
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	s.mu.Unlock()
	<-p.done
	s.mu.Lock()
}

// URL is the server's base URL, http://127.0.0.1:PORT (no /v1). It stays
// the same across restarts.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.urlLocked()
}

func (s *Server) urlLocked() string { return "http://127.0.0.1:" + strconv.Itoa(s.port) }

// SlotDir is the server's --slot-save-path.
func (s *Server) SlotDir() string { return s.opts.SlotDir }

// Slots is the server's -np.
func (s *Server) Slots() int { return s.opts.Slots }

// Model is the GGUF file the server runs (or ran last).
func (s *Server) Model() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.model
}

// LogPath is the file the server's output goes to.
func (s *Server) LogPath() string { return s.opts.LogFile }

// Running reports whether the process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runningLocked()
}

func (s *Server) runningLocked() bool {
	if s.proc == nil {
		return false
	}
	select {
	case <-s.proc.done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL (kill -9) and returns once the process is reaped.
// Killing a stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Stop sends SIGTERM and waits up to 10 s for the process to exit, then
// kills it.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.runningLocked() {
		return
	}
	p := s.proc
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	s.mu.Unlock()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	s.mu.Lock()
	s.killLocked()
}

// Restart kills the process if it still runs and starts it again on the
// same port, slot folder and model.
func (s *Server) Restart(ctx context.Context) error { return s.RestartWithModel(ctx, "") }

// RestartWithModel is Restart serving another GGUF file (empty: the same).
func (s *Server) RestartWithModel(ctx context.Context, model string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return errors.New("llamaserver: restart after Close")
	}
	s.killLocked()
	if model != "" {
		s.model = model
	}
	return s.startLocked(ctx)
}

// Close kills the process and removes the temporary folder Start made
// (the slot folder and log when they were not given). Safe to call twice.
func (s *Server) Close() error {
	s.mu.Lock()
	s.killLocked()
	if s.log != nil {
		s.log.Close()
		s.log = nil
	}
	s.mu.Unlock()
	s.removeTmp()
	return nil
}

func (s *Server) removeTmp() {
	if s.tmp != "" {
		os.RemoveAll(s.tmp)
	}
}

// LogTail returns at most the last n bytes of the server's log.
func (s *Server) LogTail(n int) string {
	f, err := os.Open(s.opts.LogFile)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(0, fi.Size()-int64(n))
	b := make([]byte, fi.Size()-off)
	nr, _ := f.ReadAt(b, off)
	return string(b[:nr])
}

// Tokenize returns the number of tokens the server's model makes of text
// (POST /tokenize, no special tokens).
func (s *Server) Tokenize(ctx context.Context, text string) (int, error) {
	body, _ := json.Marshal(map[string]any{"content": text, "add_special": false})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("llamaserver: tokenize: %w", err)
	}
	defer resp.Body.Close()
	var out struct {
		Tokens []json.RawMessage `json:"tokens"`
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("llamaserver: tokenize: HTTP %d: %s", resp.StatusCode, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("llamaserver: tokenize: %w", err)
	}
	return len(out.Tokens), nil
}

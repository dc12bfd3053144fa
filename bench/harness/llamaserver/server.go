package llamaserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
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
	log  *os.File
	proc *launch.Process

	// mu protects the fields below.
	mu    sync.Mutex
	model string
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
	s.proc, err = launch.Start(ctx, launch.Options{
		Name: "llamaserver", Binary: s.opts.Binary, Args: s.args, Env: s.opts.Env,
		Output: f, LogPath: s.opts.LogFile, Ready: launch.HTTPReady("/health"), ReadyName: "healthy",
		StartTimeout: s.opts.StartTimeout, BindError: "bind",
	})
	if err != nil {
		f.Close()
		s.removeTmp()
		return nil, err
	}
	return s, nil
}

// args is the command line for the current model and port.
func (s *Server) args(port int) []string {
	o := s.opts
	a := []string{"-m", s.Model(), "--host", "127.0.0.1", "--port", strconv.Itoa(port),
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

// URL is the server's base URL, http://127.0.0.1:PORT (no /v1). It stays
// the same across restarts.
func (s *Server) URL() string { return "http://" + s.proc.Addr() }

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
func (s *Server) Running() bool { return s.proc.Running() }

// Kill sends SIGKILL (kill -9) and returns once the process is reaped.
// Killing a stopped server does nothing.
func (s *Server) Kill() { s.proc.Kill() }

// Stop sends SIGTERM and waits up to 10 s for the process to exit, then
// kills it.
func (s *Server) Stop() { s.proc.Stop() }

// Restart kills the process if it still runs and starts it again on the
// same port, slot folder and model.
func (s *Server) Restart(ctx context.Context) error { return s.RestartWithModel(ctx, "") }

// RestartWithModel is Restart serving another GGUF file (empty: the same).
func (s *Server) RestartWithModel(ctx context.Context, model string) error {
	if model != "" {
		s.mu.Lock()
		s.model = model
		s.mu.Unlock()
	}
	return s.proc.Restart(ctx)
}

// Close kills the process and removes the temporary folder Start made
// (the slot folder and log when they were not given). Safe to call twice.
func (s *Server) Close() error {
	s.proc.Close()
	s.mu.Lock()
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
func (s *Server) LogTail(n int) string { return launch.Tail(s.opts.LogFile, n) }

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

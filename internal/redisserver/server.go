package redisserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvServer names the redis-server binary to run instead of the one on
// PATH.
const EnvServer = "REDIS_SERVER"

// ErrNotFound marks a machine without redis-server.
var ErrNotFound = errors.New("redisserver: not found")

// Find returns $REDIS_SERVER when set, else redis-server or valkey-server
// on PATH. The error wraps ErrNotFound.
func Find() (string, error) {
	if v := os.Getenv(EnvServer); v != "" {
		if fi, err := os.Stat(v); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%w: $%s=%s is not an executable file", ErrNotFound, EnvServer, v)
		}
		return v, nil
	}
	for _, name := range []string{"redis-server", "valkey-server"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: neither redis-server nor valkey-server is on PATH (apt-get install redis-server, or set $%s)", ErrNotFound, EnvServer)
}

// Options configure Start. Every zero value is a documented default.
type Options struct {
	// Binary is the server to run. Empty: Find().
	Binary string
	// Dir holds the AOF and the log. Empty: a temporary folder that Close
	// removes.
	Dir string
	// AppendFsync is the AOF fsync policy: "always" (the default: a write
	// is on disk before the server answers it), "everysec" or "no".
	AppendFsync string
	// Password, when set, is required from clients (requirepass).
	Password string
	// Args are appended to the command line (e.g. "--maxmemory", "1gb").
	Args []string
	// StartTimeout bounds each start until the server answers PING
	// (after loading its AOF). Zero: 30 s.
	StartTimeout time.Duration
}

func (o *Options) validate() error {
	switch o.AppendFsync {
	case "":
		o.AppendFsync = "always"
	case "always", "everysec", "no":
	default:
		return fmt.Errorf("redisserver: AppendFsync %q: want always, everysec or no", o.AppendFsync)
	}
	if o.StartTimeout < 0 {
		return errors.New("redisserver: negative StartTimeout")
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 30 * time.Second
	}
	if o.Binary == "" {
		b, err := Find()
		if err != nil {
			return err
		}
		o.Binary = b
	}
	return nil
}

// Server is a running (or killed, then restartable) redis-server. Create
// one with Start and Close it. Safe for concurrent use.
type Server struct {
	opts Options
	tmp  bool // Dir is a temporary folder Close removes

	// mu protects the fields below.
	mu   sync.Mutex
	port int
	proc *proc
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd was reaped
	err  error         // cmd.Wait's error, readable after done
}

// Start runs redis-server on a free loopback port and returns once it
// answers PING. On error nothing is left running.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts}
	if s.opts.Dir == "" {
		d, err := os.MkdirTemp("", "redisserver-*")
		if err != nil {
			return nil, fmt.Errorf("redisserver: %w", err)
		}
		s.opts.Dir, s.tmp = d, true
	} else if err := os.MkdirAll(s.opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("redisserver: %w", err)
	}
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
		if attempt < 3 && strings.Contains(strings.ToLower(s.LogTail(2048)), "address already in use") {
			continue
		}
		s.Close()
		return nil, err
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redisserver: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) args() []string {
	o := s.opts
	a := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", o.Dir,
		"--appendonly", "yes", "--appendfsync", o.AppendFsync, "--save", "",
		"--daemonize", "no", "--logfile", s.LogPath(), "--protected-mode", "no",
	}
	if o.Password != "" {
		a = append(a, "--requirepass", o.Password)
	}
	return append(a, o.Args...)
}

// startLocked starts the process and waits until it answers PING. Called
// with s.mu held and no process running.
func (s *Server) startLocked(ctx context.Context) error {
	cmd := exec.Command(s.opts.Binary, s.args()...)
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redisserver: start %s: %w", s.opts.Binary, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	s.proc = p
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	ctx, cancel := context.WithTimeout(ctx, s.opts.StartTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.pingLocked() == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("redisserver: exited before answering (%v); log %s ends:\n%s", p.err, s.LogPath(), s.LogTail(2048))
		case <-ctx.Done():
			s.killLocked()
			return fmt.Errorf("redisserver: no PONG after %v: %w; log %s ends:\n%s", s.opts.StartTimeout, ctx.Err(), s.LogPath(), s.LogTail(2048))
		case <-tick.C:
		}
	}
}

// pingLocked sends AUTH (when set) and PING on a fresh connection; a
// server still loading its AOF answers -LOADING, which is an error here.
func (s *Server) pingLocked() error {
	c, err := net.DialTimeout("tcp", s.addrLocked(), time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	r := bufio.NewReader(c)
	if s.opts.Password != "" {
		fmt.Fprintf(c, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(s.opts.Password), s.opts.Password)
		if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
			return fmt.Errorf("redisserver: AUTH: %q %v", line, err)
		}
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("redisserver: PING: %q", strings.TrimSpace(line))
	}
	return nil
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

// Addr is host:port. It stays the same across restarts.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrLocked()
}

func (s *Server) addrLocked() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL is redis://[:password@]host:port/0.
func (s *Server) URL() string {
	auth := ""
	if s.opts.Password != "" {
		auth = ":" + s.opts.Password + "@"
	}
	return "redis://" + auth + s.Addr() + "/0"
}

// Dir is the server's data folder (the AOF lives under it).
func (s *Server) Dir() string { return s.opts.Dir }

// LogPath is the server's log file.
func (s *Server) LogPath() string { return filepath.Join(s.opts.Dir, "redis-server.log") }

// Running reports whether the process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
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

// Stop sends SIGTERM (the server writes its AOF and exits) and waits up to
// 10 s, then kills it.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return
	}
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
// same port and folder; it returns once the AOF is loaded.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
	return s.startLocked(ctx)
}

// Close kills the process and removes the folder when Start made it. Safe
// to call twice.
func (s *Server) Close() error {
	s.mu.Lock()
	s.killLocked()
	s.mu.Unlock()
	if s.tmp {
		os.RemoveAll(s.opts.Dir)
	}
	return nil
}

// LogTail returns at most the last n bytes of the server's log.
func (s *Server) LogTail(n int) string {
	f, err := os.Open(s.LogPath())
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

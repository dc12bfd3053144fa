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
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
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
	proc *launch.Process
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
	p, err := launch.Start(ctx, launch.Options{
		Name: "redisserver", Binary: s.opts.Binary, Args: s.args, LogPath: s.LogPath(),
		Ready: s.ping, ReadyName: "answering PING", Poll: 10 * time.Millisecond,
		StartTimeout: s.opts.StartTimeout, BindError: "address already in use",
	})
	if err != nil {
		s.removeTmp()
		return nil, err
	}
	s.proc = p
	return s, nil
}

func (s *Server) args(port int) []string {
	o := s.opts
	a := []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", o.Dir,
		"--appendonly", "yes", "--appendfsync", o.AppendFsync, "--save", "",
		"--daemonize", "no", "--logfile", s.LogPath(), "--protected-mode", "no",
	}
	if o.Password != "" {
		a = append(a, "--requirepass", o.Password)
	}
	return append(a, o.Args...)
}

// ping sends AUTH (when set) and PING on a fresh connection; a server
// still loading its AOF answers -LOADING, which is an error here.
func (s *Server) ping(_ context.Context, addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
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

// Addr is host:port. It stays the same across restarts.
func (s *Server) Addr() string { return s.proc.Addr() }

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
func (s *Server) Running() bool { return s.proc.Running() }

// Kill sends SIGKILL (kill -9) and returns once the process is reaped.
// Killing a stopped server does nothing.
func (s *Server) Kill() { s.proc.Kill() }

// Stop sends SIGTERM (the server writes its AOF and exits) and waits up to
// 10 s, then kills it.
func (s *Server) Stop() { s.proc.Stop() }

// Restart kills the process if it still runs and starts it again on the
// same port and folder; it returns once the AOF is loaded.
func (s *Server) Restart(ctx context.Context) error { return s.proc.Restart(ctx) }

// Close kills the process and removes the folder when Start made it. Safe
// to call twice.
func (s *Server) Close() error {
	s.proc.Close()
	s.removeTmp()
	return nil
}

func (s *Server) removeTmp() {
	if s.tmp {
		os.RemoveAll(s.opts.Dir)
	}
}

// LogTail returns at most the last n bytes of the server's log.
func (s *Server) LogTail(n int) string { return launch.Tail(s.LogPath(), n) }

// Pid is the running server's process id, 0 when none runs.
func (s *Server) Pid() int { return s.proc.Pid() }

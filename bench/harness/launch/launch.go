package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configure Start. Name, Binary, Args and Ready are required; every
// zero value else is a documented default.
type Options struct {
	// Name prefixes errors and the start lines in Output ("llamaserver").
	Name string
	// Binary is the program to run.
	Binary string
	// Args is the command line for a port; called before each start.
	Args func(port int) []string
	// Env is added to the child's environment.
	Env []string
	// Output receives the child's stdout and stderr, each start preceded by
	// a line "=== TIME NAME: BINARY ARGS". Nil: discarded (a server that
	// writes its own log file).
	Output io.Writer
	// LogPath is the file LogTail reads and errors quote: the file behind
	// Output, or the server's own log.
	LogPath string
	// Ready answers nil once the server at addr (127.0.0.1:PORT) serves.
	Ready func(ctx context.Context, addr string) error
	// ReadyName says what Ready checks, in errors ("healthy"). Empty:
	// "ready".
	ReadyName string
	// Poll is the pause between two Ready calls. Zero: 20 ms.
	Poll time.Duration
	// StartTimeout bounds each start until Ready answers nil. Zero: 60 s.
	StartTimeout time.Duration
	// BindError, when not empty, is a lower-case text whose presence in the
	// end of the log after a failed start means the port was taken: Start
	// then tries another port (three times at most).
	BindError string
}

func (o *Options) validate() error {
	switch {
	case o.Name == "" || o.Binary == "" || o.Args == nil || o.Ready == nil:
		return errors.New("proc: Name, Binary, Args and Ready are required")
	case o.Poll < 0 || o.StartTimeout < 0:
		return fmt.Errorf("%s: negative duration", o.Name)
	}
	if o.ReadyName == "" {
		o.ReadyName = "ready"
	}
	if o.Poll == 0 {
		o.Poll = 20 * time.Millisecond
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 60 * time.Second
	}
	return nil
}

// Process is a running (or killed, then restartable) server. Create one
// with Start and Close it. Safe for concurrent use.
type Process struct {
	opts Options

	// mu protects the fields below.
	mu     sync.Mutex
	port   int
	child  *child // the latest child; nil before the first start
	closed bool
}

// child is one process and the goroutine that reaps it.
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd was reaped
	err  error         // cmd.Wait's error, readable after done
}

// Start runs the server on a free loopback port and returns once Ready
// answers nil. On error nothing is left running.
func Start(ctx context.Context, opts Options) (*Process, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	p := &Process{opts: opts}
	for attempt := 0; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", opts.Name, err)
		}
		p.mu.Lock()
		p.port = port
		err = p.startLocked(ctx)
		p.mu.Unlock()
		if err == nil {
			return p, nil
		}
		if attempt < 3 && opts.BindError != "" && strings.Contains(strings.ToLower(p.LogTail(4096)), opts.BindError) {
			continue
		}
		return nil, err
	}
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startLocked starts the child and waits until it is ready. Called with
// p.mu held and no child running.
func (p *Process) startLocked(ctx context.Context) error {
	o := p.opts
	args := o.Args(p.port)
	cmd := exec.Command(o.Binary, args...)
	if o.Output != nil {
		fmt.Fprintf(o.Output, "=== %s %s: %s %s\n", time.Now().Format(time.RFC3339Nano), o.Name, o.Binary, strings.Join(args, " "))
		cmd.Stdout, cmd.Stderr = o.Output, o.Output
	}
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.SysProcAttr = SysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: start %s: %w", o.Name, o.Binary, err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	p.child = c
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()

	ctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()
	addr := p.addrLocked()
	tick := time.NewTicker(o.Poll)
	defer tick.Stop()
	for {
		if o.Ready(ctx, addr) == nil && listensOn(cmd.Process.Pid, p.port) {
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s: exited before it was %s (%v); log %s ends:\n%s", o.Name, o.ReadyName, c.err, o.LogPath, p.LogTail(2048))
		case <-ctx.Done():
			p.killLocked()
			return fmt.Errorf("%s: not %s after %v: %w; log %s ends:\n%s", o.Name, o.ReadyName, o.StartTimeout, ctx.Err(), o.LogPath, p.LogTail(2048))
		case <-tick.C:
		}
	}
}

// killLocked sends SIGKILL and waits until the child is reaped. Called
// with p.mu held; it releases mu while it waits.
func (p *Process) killLocked() {
	c := p.child
	if c == nil {
		return
	}
	_ = c.cmd.Process.Kill()
	p.mu.Unlock()
	<-c.done
	p.mu.Lock()
}

// Addr is 127.0.0.1:PORT. It stays the same across restarts.
func (p *Process) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrLocked()
}

func (p *Process) addrLocked() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// Pid is the process id of the latest child, 0 before the first start.
// Benchmarks read its /proc entries (RSS, open files).
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.child == nil {
		return 0
	}
	return p.child.cmd.Process.Pid
}

// Running reports whether the child is alive.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runningLocked()
}

func (p *Process) runningLocked() bool {
	if p.child == nil {
		return false
	}
	select {
	case <-p.child.done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL (kill -9) and returns once the child is reaped.
// Killing a stopped server does nothing.
func (p *Process) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
}

// Stop sends SIGTERM and waits up to 10 s for the child to exit, then
// kills it.
func (p *Process) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.runningLocked() {
		return
	}
	c := p.child
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	p.mu.Unlock()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
	}
	p.mu.Lock()
	if p.child == c { // not a child a Restart started meanwhile
		p.killLocked()
	}
}

// Restart kills the child if it still runs and starts the binary again on
// the same port, with what Options.Args answers now.
func (p *Process) Restart(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.closed {
			return fmt.Errorf("%s: restart after Close", p.opts.Name)
		}
		if !p.runningLocked() {
			return p.startLocked(ctx)
		}
		// killLocked lets go of mu while it waits: a Close or another
		// Restart may have come in between, so look again.
		p.killLocked()
	}
}

// Close kills the child; the Process cannot restart afterwards. Safe to
// call twice.
func (p *Process) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.killLocked()
}

// HTTPReady is an Options.Ready that asks for 200 from GET path (such as
// "/health"), each try bounded by a second.
func HTTPReady(path string) func(ctx context.Context, addr string) error {
	return func(ctx context.Context, addr string) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: HTTP %d", path, resp.StatusCode)
		}
		return nil
	}
}

// LogTail returns at most the last n bytes of the log at Options.LogPath.
func (p *Process) LogTail(n int) string { return Tail(p.opts.LogPath, n) }

// Tail returns at most the last n bytes of the file at path, "" when it
// cannot be read.
func Tail(path string, n int) string {
	f, err := os.Open(path)
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

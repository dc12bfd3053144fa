package bench

// What the benchmarks on real parts (sessions, fleet) share: how they run
// each llama-server and each sidecar, and the documents their sessions
// start from.

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/launch"
	"github.com/kvsidecar/kvsidecar/internal/llamaserver"
)

// realDefaults sets the defaults SessionsOptions and FleetOptions share:
// --n-predict 128 for the llama-servers (it bounds the sidecar's own
// background calls: a random-weight model never ends an answer), 2 minutes
// a turn, no progress lines.
func realDefaults(llamaArgs *[]string, turnTimeout *time.Duration, progress *io.Writer) {
	if *llamaArgs == nil {
		*llamaArgs = []string{"--n-predict", "128"}
	}
	if *turnTimeout == 0 {
		*turnTimeout = 2 * time.Minute
	}
	if *progress == nil {
		*progress = io.Discard
	}
}

// llamaSetup is how a benchmark runs each llama-server: the fields of
// SessionsOptions and FleetOptions of the same names.
type llamaSetup struct {
	Server, Model               string
	Slots, CacheRAMMiB, Threads int
	Args                        []string
}

// resolveModel sets Model, when empty, to the tiny model of
// ../shared/llama/tiny_gguf.py (and Server, when empty, to the llama-server
// found beside it).
func (e *llamaSetup) resolveModel(bench string) error {
	if e.Model != "" {
		return nil
	}
	p, err := llamaserver.Find()
	if err != nil {
		return fmt.Errorf("bench: %s: no --model given and none can be generated: %w", bench, err)
	}
	if e.Server == "" {
		e.Server = p.Server
	}
	e.Model, err = llamaserver.TinyModel(p, "")
	return err
}

// start runs a llama-server with its slot folder and log under dir.
func (e llamaSetup) start(ctx context.Context, dir string) (*llamaserver.Server, error) {
	return llamaserver.Start(ctx, llamaserver.Options{
		Binary: e.Server, Model: e.Model, Slots: e.Slots, CacheRAMMiB: e.CacheRAMMiB, Threads: e.Threads, Args: e.Args,
		SlotDir: filepath.Join(dir, "slots"), LogFile: filepath.Join(dir, "llama-server.log"),
	})
}

// cacheRAMText describes a --cache-ram setting in a report's heading.
func cacheRAMText(mib int) string {
	if mib < 0 {
		return "--cache-ram 0 (off)"
	}
	return fmt.Sprintf("--cache-ram %d MiB", mib)
}

// makeDocs returns n distinct documents of about tokens tokens each on
// srv's tokenizer.
func makeDocs(ctx context.Context, srv *llamaserver.Server, n, tokens int) ([]string, error) {
	// Calibrate words per token on a sample, then check each document.
	sample := sessionDoc(1_000_000, 400)
	st, err := srv.Tokenize(ctx, sample)
	if err != nil {
		return nil, err
	}
	perWord := float64(st) / 400
	docs := make([]string, n)
	for i := range docs {
		words := max(1, int(float64(tokens)/perWord))
		for try := 0; ; try++ {
			docs[i] = sessionDoc(uint64(i+1), words)
			got, err := srv.Tokenize(ctx, docs[i])
			if err != nil {
				return nil, err
			}
			if try == 3 || got == 0 || (got >= tokens*95/100 && got <= tokens*105/100) {
				break
			}
			words = max(1, int(float64(words)*float64(tokens)/float64(got)))
		}
	}
	return docs, nil
}

// sidecarSetup is how a benchmark runs the sidecar.
type sidecarSetup struct {
	// Command is the binary and the arguments before its flags, e.g.
	// {os.Executable(), "serve"}.
	Command []string
	// Args are added after the flags the benchmark sets (--listen,
	// --upstream, --data-dir, --engine llamacpp, --llamacpp-slot-dir,
	// --llamacpp-slots, --log-format json).
	Args []string
	// Env is added to the sidecar's environment.
	Env []string
}

// sidecarProc is the sidecar run as a child process in front of a
// llama-server, restartable with the same flags (port, data folder).
type sidecarProc struct {
	proc *launch.Process
	log  *os.File
}

// startSidecar runs the sidecar before up with its data and log under dir
// and returns once GET /healthz answers 200.
func startSidecar(ctx context.Context, s sidecarSetup, up *llamaserver.Server, dir string) (*sidecarProc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "sidecar.log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	args := func(port int) []string {
		a := append(append([]string(nil), s.Command[1:]...),
			"--listen", "127.0.0.1:"+strconv.Itoa(port), "--upstream", up.URL(), "--data-dir", filepath.Join(dir, "data"),
			"--engine", "llamacpp", "--llamacpp-slot-dir", up.SlotDir(), "--llamacpp-slots", strconv.Itoa(up.Slots()),
			"--log-format", "json")
		return append(a, s.Args...)
	}
	p, err := launch.Start(ctx, launch.Options{
		Name: "bench: sidecar", Binary: s.Command[0], Args: args, Env: s.Env, Output: f, LogPath: logPath,
		Ready: launch.HTTPReady("/healthz"), ReadyName: "answering /healthz", BindError: "address already in use",
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	return &sidecarProc{proc: p, log: f}, nil
}

func (p *sidecarProc) url() string { return "http://" + p.proc.Addr() }

// kill sends SIGKILL and waits until the sidecar is reaped.
func (p *sidecarProc) kill() { p.proc.Kill() }

// restart kills the sidecar and starts it again on the same port and data.
func (p *sidecarProc) restart(ctx context.Context) error { return p.proc.Restart(ctx) }

func (p *sidecarProc) close() {
	p.proc.Close()
	p.log.Close()
}

// drain waits (up to 30 s) until the sidecar's background engine queue is
// empty, as between users' turns, and says when the kill came.
func (p *sidecarProc) drain(ctx context.Context) string {
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := ScrapeMetrics(ctx, p.url()+"/metrics")
		if err != nil {
			time.Sleep(time.Second)
			return "1 s after the round (the sidecar's /metrics failed: " + err.Error() + ")"
		}
		d, ok := m.queueDepth()
		if !ok {
			time.Sleep(time.Second)
			return "1 s after the round (the sidecar exports no sidecar_engine_queue_depth)"
		}
		if d == 0 {
			return "after the sidecar's background queue drained, as between users' turns"
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("with %g jobs still in the sidecar's background queue after 30 s", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package workload

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

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/recordup"
)

// RealParts is what the benchmarks on real parts (sessions, fleet) share:
// the workload, how each llama-server and the sidecar run, and the output.
// Each benchmark's options embed it and name the defaults that differ
// (Sessions, Rounds, Threads).
type RealParts struct {
	// Sessions is the number of conversations, Rounds the turns of each.
	Sessions, Rounds int
	// Slots is each llama-server's -np. Zero: 2.
	Slots int
	// DocTokens is the length of each session's document (its system
	// message), in the model's tokens. Zero: 1,500.
	DocTokens int
	// CacheRAMMiB is each llama-server's --cache-ram: the RAM prompt cache
	// a client without the sidecar benefits from. Zero: 8 (about two
	// 1,500-token sessions of the tiny model: the ratio of the server's
	// default 8 GiB to 8K-token Llama-3-8B conversations); negative: off.
	CacheRAMMiB int
	// MaxTokens of each reply. Zero: 8.
	MaxTokens int
	// LlamaServer is the llama-server binary. Empty: the one
	// llamaserver.Find finds.
	LlamaServer string
	// Model is the GGUF every server runs. Empty: the tiny model of
	// ../shared/llama/tiny_gguf.py with its default dimensions.
	Model string
	// Threads is each llama-server's -t.
	Threads int
	// LlamaArgs are added to every llama-server's command line. Nil: none,
	// the server on its own defaults as users run it. Notably no
	// --n-predict cap: a random-weight model never ends an answer, so a
	// sidecar call without its own max_tokens generates until the slot's
	// context is full (the client's turns set max_tokens).
	LlamaArgs []string
	// PerUser names each session its own end user (the OpenAI "user"
	// field), as a multi-user app that identifies its users does. The
	// default is how most apps call: one API key for all their end users
	// and no user id, so the sidecar must keep each session's memory to
	// the session.
	PerUser bool
	// SharedUser names every session the same end user: one person with
	// several conversations, who recalls across them.
	SharedUser bool `json:"shared_user,omitempty"`
	// DrainBeforeKill waits, before each kill -9 of an engine (bench
	// sessions' EngineRestartAfter, bench fleet's KillAfter), until the
	// sidecar's background queue drained, as in a pause between users'
	// turns. The default kills right after the round's last answer,
	// whatever the sidecar still has queued or in flight: engines crash at
	// any time.
	DrainBeforeKill bool
	// SidecarCommand runs the sidecar: the binary and the arguments before
	// its flags, e.g. {os.Executable(), "serve"}. Required.
	SidecarCommand []string
	// SidecarArgs are added after the flags the benchmark sets (--listen,
	// --upstream, --data-dir, --engine llamacpp, --llamacpp-slot-dir,
	// --llamacpp-slots, --log-format json).
	SidecarArgs []string
	// Dir holds the servers' slot folders and logs and the sidecars' data.
	// Empty: a temporary folder, removed afterwards.
	Dir string
	// Progress receives one line per round and event. Nil: none.
	Progress io.Writer
	// TurnTimeout bounds one chat request. Zero: 2 minutes.
	TurnTimeout time.Duration
}

// setDefaults fills in the zero values, with the benchmark's own
// defaults for Sessions, Rounds and Threads.
func (p *RealParts) setDefaults(sessions, rounds, threads int) {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.Sessions, sessions)
	def(&p.Rounds, rounds)
	def(&p.Slots, 2)
	def(&p.DocTokens, 1500)
	def(&p.CacheRAMMiB, 8)
	def(&p.MaxTokens, 8)
	def(&p.Threads, threads)
	if p.LlamaArgs == nil {
		p.LlamaArgs = []string{}
	}
	if p.TurnTimeout == 0 {
		p.TurnTimeout = 2 * time.Minute
	}
	if p.Progress == nil {
		p.Progress = io.Discard
	}
}

// check refuses what no run can do; the benchmark needs at least
// minRounds rounds.
func (p *RealParts) check(bench string, minRounds int) error {
	switch {
	case p.Sessions < 1 || p.Sessions > 1000:
		return fmt.Errorf("bench: %s: %d sessions (1 to 1000)", bench, p.Sessions)
	case p.Rounds < minRounds || p.Rounds > 1000:
		return fmt.Errorf("bench: %s: %d rounds (%d to 1000)", bench, p.Rounds, minRounds)
	case p.Slots < 1 || p.Slots > 64:
		return fmt.Errorf("bench: %s: %d slots (1 to 64)", bench, p.Slots)
	case p.DocTokens < 16 || p.DocTokens > 1<<20:
		return fmt.Errorf("bench: %s: %d document tokens (16 to 2^20)", bench, p.DocTokens)
	case p.MaxTokens < 1 || p.Threads < 1 || p.TurnTimeout < 0:
		return fmt.Errorf("bench: %s: negative or zero option", bench)
	case len(p.SidecarCommand) == 0:
		return fmt.Errorf("bench: %s: no SidecarCommand", bench)
	}
	return nil
}

// resolveModel sets Model, when empty, to the tiny model of
// ../shared/llama/tiny_gguf.py (and LlamaServer, when empty, to the
// llama-server found beside it).
func (p *RealParts) resolveModel(bench string) error {
	if p.Model != "" {
		return nil
	}
	tools, err := llamaserver.Find()
	if err != nil {
		return fmt.Errorf("bench: %s: no --model given and none can be generated: %w", bench, err)
	}
	if p.LlamaServer == "" {
		p.LlamaServer = tools.Server
	}
	p.Model, err = llamaserver.TinyModel(tools, "")
	return err
}

// startLlama runs a llama-server with its slot folder and log under dir.
func (p *RealParts) startLlama(ctx context.Context, dir string) (*llamaserver.Server, error) {
	return llamaserver.Start(ctx, llamaserver.Options{
		Binary: p.LlamaServer, Model: p.Model, Slots: p.Slots, CacheRAMMiB: p.CacheRAMMiB, Threads: p.Threads, Args: p.LlamaArgs,
		SlotDir: filepath.Join(dir, "slots"), LogFile: filepath.Join(dir, "llama-server.log"),
	})
}

// user is the OpenAI "user" field a session's turns carry: the session
// itself with PerUser, else none.
func (p *RealParts) user(session string) string {
	switch {
	case p.SharedUser:
		return "bench-user"
	case p.PerUser:
		return session
	}
	return ""
}

// clientText describes the clients' identity in a report's heading.
func clientText(perUser, sharedUser bool) string {
	if sharedUser {
		return "one end user for every session (OpenAI user field)"
	}
	if perUser {
		return "each session its own end user (OpenAI user field)"
	}
	return "one API key, no user id"
}

// killNote says when an engine was killed: right after the round, or (with
// DrainBeforeKill) once the sidecar's queue drained, as sc.drain tells.
func (p *RealParts) killNote(ctx context.Context, sc *sidecarProc) string {
	if p.DrainBeforeKill {
		return sc.drain(ctx)
	}
	return "right after the round's last answer (whatever the sidecar still had queued or in flight)"
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

// engineIdleClose is how long the recording proxy in front of a
// llama-server keeps an idle keep-alive connection: llama-server's and
// uvicorn's own 5 s, so the proxy changes nothing a client sees of it.
const engineIdleClose = 5 * time.Second

// recordEngine starts a recording proxy in front of up (bench/harness/recordup):
// the benchmark reads what reached the engine, the sidecar's own calls
// included.
func recordEngine(up *llamaserver.Server) (*recordup.Proxy, error) {
	return recordup.Start(recordup.Options{Upstream: up.URL(), IdleTimeout: engineIdleClose})
}

// sidecarProc is the sidecar run as a child process in front of a
// llama-server, restartable with the same flags (port, data folder).
type sidecarProc struct {
	proc *launch.Process
	log  *os.File
}

// startSidecar runs the sidecar (command, then the flags that put it before
// up, reached at upURL, with its data under dir, then args; env added to
// its environment), its log under dir, and returns once GET /healthz
// answers 200.
func startSidecar(ctx context.Context, command, args, env []string, upURL string, up *llamaserver.Server, dir string) (*sidecarProc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "sidecar.log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	argv := func(port int) []string {
		a := append(append([]string(nil), command[1:]...),
			"--listen", "127.0.0.1:"+strconv.Itoa(port), "--upstream", upURL, "--data-dir", filepath.Join(dir, "data"),
			"--engine", "llamacpp", "--llamacpp-slot-dir", up.SlotDir(), "--llamacpp-slots", strconv.Itoa(up.Slots()),
			"--log-format", "json")
		return append(a, args...)
	}
	p, err := launch.Start(ctx, launch.Options{
		Name: "bench: sidecar", Binary: command[0], Args: argv, Env: env, Output: f, LogPath: logPath,
		Ready: launch.HTTPReady("/healthz"), ReadyName: "answering /healthz", BindError: "address already in use",
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	return &sidecarProc{proc: p, log: f}, nil
}

func (p *sidecarProc) url() string { return "http://" + p.proc.Addr() }

// adminURL is the sidecar's admin listener (its own /metrics).
func (p *sidecarProc) adminURL() string { return AdminURL(p.url()) }

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
		m, err := ScrapeMetrics(ctx, p.adminURL()+"/metrics")
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

package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvsidecar/kvsidecar/bench/workload"
	"github.com/kvsidecar/kvsidecar/internal/mockup"
)

// targetsFlag collects --target name=host:port[,metrics][,session][,pid=N…]
// values.
type targetsFlag []workload.ProxyTarget

func (t *targetsFlag) String() string { return fmt.Sprint(*t) }
func (t *targetsFlag) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	parts := strings.Split(rest, ",")
	if !ok || name == "" || parts[0] == "" {
		return fmt.Errorf("want name=host:port[,metrics][,session][,pid=N], got %q", v)
	}
	pt := workload.ProxyTarget{Name: name, Addr: parts[0]}
	for _, opt := range parts[1:] {
		switch {
		case opt == "metrics":
			pt.MetricsAddr = workload.AdminAddr(pt.Addr) // the sidecar's own /metrics, on its admin listener
		case opt == "session":
			pt.Session = true
		case strings.HasPrefix(opt, "pid="):
			pid, err := strconv.Atoi(strings.TrimPrefix(opt, "pid="))
			if err != nil || pid < 1 {
				return fmt.Errorf("bad %q in %q", opt, v)
			}
			pt.PIDs = append(pt.PIDs, pid)
		default:
			return fmt.Errorf("unknown %q in %q: want metrics, session or pid=N", opt, v)
		}
	}
	*t = append(*t, pt)
	return nil
}

func benchProxy(args []string) error {
	fs := flag.NewFlagSet("bench proxy", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object")
	var targets targetsFlag
	var conc, upPIDs intsFlag
	fs.Var(&targets, "target", "name=host:port to measure, repeated; 'direct' is the baseline, 'sidecar' and 'nginx' are compared; append ',metrics' to scrape its /metrics, ',session' to send an API key and session ids (the session path), ',pid=N' (repeatable) for the CPU of its processes")
	n := fs.Int("requests", 10000, "non-streaming requests per target and concurrency")
	ns := fs.Int("stream-requests", 2000, "streaming requests per target and concurrency")
	fs.Var(&conc, "concurrency", "connections (requests in flight), a comma-separated list measured one after the other (default 8,64)")
	fs.Var(&upPIDs, "upstream-pid", "the upstream's process ids, comma-separated: its CPU per request over every path")
	rounds := fs.Int("rounds", 5, "rounds the targets are interleaved in")
	warmup := fs.Int("warmup", 500, "warm-up requests per target and concurrency")
	sessionTurns := fs.Int("session-turns", 16, "requests per session on a session path")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := workload.RunProxy(workload.ProxyOptions{Targets: targets, Requests: *n, StreamRequests: *ns, Concurrency: conc,
		UpstreamPIDs: upPIDs, Rounds: *rounds, Warmup: *warmup, SessionTurns: *sessionTurns})
	if err != nil {
		return err
	}
	return emit(*asJSON, r, workload.WriteProxyTable)
}

func benchUpstream(args []string) error {
	fs := flag.NewFlagSet("bench upstream", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8000", "address to serve the scripted upstream on")
	events := fs.Int("events", 16, "chunks in a streamed answer")
	gap := fs.Duration("event-gap", 0, "pause between two chunks of a streamed answer, as an engine generating tokens (0: the whole stream at once)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	m := mockup.New(mockup.Options{StreamEvents: *events, EventGap: *gap})
	fmt.Fprintf(os.Stderr, "mock upstream listening on http://%s\n", ln.Addr())
	go func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		<-ch
		_ = m.Close()
	}()
	return m.Serve(ln)
}

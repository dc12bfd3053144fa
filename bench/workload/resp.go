package workload

// The RESP listener (issue 34) beside Debian's redis-server, in one run,
// with one client (resp_client.go: what LMCache's native connector does):
//
//   - grid: SET then GET of LMCache-sized chunks (1, 8, 32 MiB) from 1, 8
//     and 32 connections: GB/s and per-operation p50/p99. The sidecar's
//     GETs start once its persister has written the SETs to disk (the
//     wait is reported); both keep the cell in RAM.
//   - working set: 4× a RAM budget of 8 MiB values written, then read back
//     in a shuffled order: the sidecar with --kv-ram-bytes of that budget,
//     redis-server with the same maxmemory and allkeys-lru. Hit ratio,
//     GB/s, peak RSS.
//   - kill -9: 1 MiB values SET from four connections, the server killed
//     with SIGKILL mid-traffic and restarted on its files; how many of the
//     acknowledged values are served again, byte-exact, and that none is
//     served with other bytes. redis-server with AOF (appendfsync
//     everysec), the sidecar with --resp-fsync background (the default
//     --resp-unsynced-bytes, then 32 MiB) and always.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
)

// RESPOptions configure RunRESP. SidecarCommand is required; every zero
// value is a documented default.
type RESPOptions struct {
	// SidecarCommand starts a sidecar: the binary and "serve".
	SidecarCommand []string
	// SidecarArgs are added to every sidecar's flags.
	SidecarArgs []string
	// RedisServer is the redis-server binary. Empty: redisserver.Find.
	RedisServer string
	// Phases to run, of grid, ws and kill. Empty: all three.
	Phases []string
	// Sizes (bytes) and Conns of the grid. Empty: 1, 8, 32 MiB and 1, 8, 32.
	Sizes []int64
	Conns []int
	// CellBytes is what one grid cell writes (at least one value per
	// connection). Zero: 256 MiB. Rounds is how many times each cell runs,
	// the servers taking turns. Zero: 3.
	CellBytes int64
	Rounds    int
	// GridRAM is the sidecar's --kv-ram-bytes in the grid. Zero: 2 GiB.
	GridRAM int64
	// WSRAM is the RAM budget of the working-set phase, WSFactor the
	// working set over it, WSValue its values' size. Zero: 1 GiB, 4,
	// 8 MiB.
	WSRAM    int64
	WSFactor int
	WSValue  int64
	// KillAfter is how long the kill phase writes before the SIGKILL.
	// Zero: 3 s.
	KillAfter time.Duration
	// Extra names more RESP servers (name → host:port, already running,
	// password "bench") measured in the grid beside the two.
	Extra map[string]string
	// Dir holds the servers' files. Empty: a temporary folder.
	Dir string
	// Progress receives a line per cell. Nil: none.
	Progress io.Writer
}

func (o *RESPOptions) validate() error {
	if len(o.SidecarCommand) == 0 {
		return errors.New("bench: resp: SidecarCommand is required")
	}
	if len(o.Phases) == 0 {
		o.Phases = []string{"grid", "ws", "kill"}
	}
	for _, p := range o.Phases {
		if p != "grid" && p != "ws" && p != "kill" {
			return fmt.Errorf("bench: resp: phase %q: want grid, ws or kill", p)
		}
	}
	if len(o.Sizes) == 0 {
		o.Sizes = []int64{1 << 20, 8 << 20, 32 << 20}
	}
	if len(o.Conns) == 0 {
		o.Conns = []int{1, 8, 32}
	}
	if o.CellBytes == 0 {
		o.CellBytes = 256 << 20
	}
	if o.Rounds == 0 {
		o.Rounds = 3
	}
	if o.GridRAM == 0 {
		o.GridRAM = 2 << 30
	}
	if o.WSRAM == 0 {
		o.WSRAM = 1 << 30
	}
	if o.WSFactor == 0 {
		o.WSFactor = 4
	}
	if o.WSValue == 0 {
		o.WSValue = 8 << 20
	}
	if o.KillAfter == 0 {
		o.KillAfter = 3 * time.Second
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.CellBytes < 0 || o.Rounds < 0 || o.GridRAM < 0 || o.WSRAM < 0 || o.WSFactor < 0 || o.WSValue <= 0 || o.KillAfter < 0 {
		return errors.New("bench: resp: negative option")
	}
	return nil
}

// RESPReport is what RunRESP measured.
type RESPReport struct {
	Cores      int              `json:"cores"`
	Grid       []RESPCell       `json:"grid,omitempty"`
	WorkingSet []RESPWorkingSet `json:"working_set,omitempty"`
	Kill       []RESPKill       `json:"kill,omitempty"`
}

// RESPCell is one server, operation, value size and connection count.
type RESPCell struct {
	Server     string `json:"server"`
	Op         string `json:"op"`
	ValueBytes int64  `json:"value_bytes"`
	Conns      int    `json:"conns"`
	Ops        int    `json:"ops"`
	// Rounds is how many times the cell ran, the servers alternating;
	// GBps is the median of the rounds, the latencies are of every op.
	Rounds  int     `json:"rounds"`
	Seconds float64 `json:"seconds"`
	GBps    float64 `json:"gb_per_s"`
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
	Errors  int     `json:"errors"`
	// PersistWait is, for the sidecar's SETs, how long its persister took
	// after the last SET to have every value on disk.
	PersistWait float64 `json:"persist_wait_s,omitempty"`
}

// RESPWorkingSet is one server's run of the working-set phase.
type RESPWorkingSet struct {
	Server   string `json:"server"`
	RAMBytes int64  `json:"ram_bytes"`
	SetBytes int64  `json:"working_set_bytes"`
	Values   int    `json:"values"`
	Hits     int    `json:"hits"`
	Misses   int    `json:"misses"`
	Corrupt  int    `json:"corrupt"`
	// SetErrors counts SETs the server refused (redis-server: OOM while
	// the clients' query buffers hold it over maxmemory).
	SetErrors  int     `json:"set_errors"`
	HitRatio   float64 `json:"hit_ratio"`
	WriteGBps  float64 `json:"write_gb_per_s"`
	ReadGBps   float64 `json:"read_gb_per_s"`
	PeakRSS    int64   `json:"peak_rss_bytes"`
	DiskBytes  int64   `json:"disk_bytes"`
	WriteP99ms float64 `json:"write_p99_ms"`
	ReadP99ms  float64 `json:"read_p99_ms"`
}

// RESPKill is one server's kill -9 run.
type RESPKill struct {
	Server     string `json:"server"`
	Acked      int    `json:"acked"`
	AckedBytes int64  `json:"acked_bytes"`
	Served     int    `json:"served"`
	Missing    int    `json:"missing"`
	Corrupt    int    `json:"corrupt"`
	LostBytes  int64  `json:"lost_bytes"`
}

// respServer is a server under test.
type respServer struct {
	name    string
	addr    string
	pid     func() int
	kill    func()
	restart func(context.Context) error
	close   func()
	dir     string
	sidecar bool
}

const respPass = "bench"

// values is the payload pool: bf16 values of a normal distribution, like
// a KV cache's; value i of size n is pool[off(i) : off(i)+n].
type valuePool struct{ b []byte }

func newValuePool(maxSize int64) valuePool {
	n := 64<<20 + maxSize
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(34, 34))
	for i := 0; i+1 < len(b); i += 2 {
		f := float32(rng.NormFloat64() * 0.5)
		u := math.Float32bits(f) >> 16
		b[i], b[i+1] = byte(u), byte(u>>8)
	}
	return valuePool{b}
}

func (p valuePool) value(i int, size int64) []byte {
	span := int64(len(p.b)) - size
	off := (int64(i) * 4_099_997 * 2) % span
	return p.b[off : off+size]
}

// RunRESP runs the phases.
func RunRESP(ctx context.Context, o RESPOptions) (RESPReport, error) {
	if err := o.validate(); err != nil {
		return RESPReport{}, err
	}
	if o.RedisServer == "" {
		p, err := redisserver.Find()
		if err != nil {
			return RESPReport{}, err
		}
		o.RedisServer = p
	}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "bench-resp-")
		if err != nil {
			return RESPReport{}, err
		}
		defer os.RemoveAll(d)
		o.Dir = d
	}
	maxSize := max(o.WSValue, 1<<20)
	for _, s := range o.Sizes {
		maxSize = max(maxSize, s)
	}
	pool := newValuePool(maxSize)
	rep := RESPReport{Cores: runtime.NumCPU()}
	for _, ph := range o.Phases {
		var err error
		switch ph {
		case "grid":
			err = respGrid(ctx, &o, pool, &rep)
		case "ws":
			err = respWorkingSet(ctx, &o, pool, &rep)
		case "kill":
			err = respKill(ctx, &o, pool, &rep)
		}
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func (o *RESPOptions) startRedis(ctx context.Context, name string, fsync string, args ...string) (*respServer, error) {
	dir := filepath.Join(o.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rs, err := redisserver.Start(ctx, redisserver.Options{Binary: o.RedisServer, Dir: dir, AppendFsync: fsync, Password: respPass, Args: args})
	if err != nil {
		return nil, err
	}
	return &respServer{name: name, addr: rs.Addr(), pid: rs.Pid, kill: rs.Kill, restart: rs.Restart, close: func() { rs.Close() }, dir: dir}, nil
}

func (o *RESPOptions) startSidecar(ctx context.Context, name string, extra ...string) (*respServer, error) {
	dir := filepath.Join(o.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rport, err := launch.FreePort()
	if err != nil {
		return nil, err
	}
	raddr := "127.0.0.1:" + strconv.Itoa(rport)
	var env []string
	for _, kv := range os.Environ() {
		if n, _, _ := strings.Cut(kv, "="); strings.HasPrefix(n, "SIDECAR_") {
			env = append(env, n+"=")
		}
	}
	logPath := filepath.Join(dir, "sidecar.log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	p, err := launch.Start(ctx, launch.Options{
		Name: "bench: sidecar", Binary: o.SidecarCommand[0], Env: env, Output: lf, LogPath: logPath,
		Args: func(port int) []string {
			a := append(append([]string(nil), o.SidecarCommand[1:]...),
				"--listen", "127.0.0.1:"+strconv.Itoa(port), "--upstream", "http://127.0.0.1:1",
				"--data-dir", filepath.Join(dir, "data"), "--resp-listen", raddr, "--log-level", "warn")
			return append(append(a, o.SidecarArgs...), extra...)
		},
		Ready: launch.HTTPReady("/healthz"), ReadyName: "answering /healthz", BindError: "address already in use",
	})
	if err != nil {
		lf.Close()
		return nil, err
	}
	return &respServer{name: name, addr: raddr, pid: p.Pid, kill: p.Kill, restart: p.Restart,
		close: func() { p.Close(); lf.Close() }, dir: filepath.Join(dir, "data", "resp"), sidecar: true}, nil
}

// waitPersisted polls the sidecar's INFO until no answered SET waits for
// the disk.
func waitPersisted(s *respServer) (time.Duration, error) {
	if !s.sidecar {
		return 0, nil
	}
	c, err := dialRESP(s.addr, "", respPass)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	start := time.Now()
	for time.Since(start) < 10*time.Minute {
		info, err := c.do("INFO", "persistence")
		if err != nil {
			return 0, err
		}
		if strings.Contains(info, "kvsidecar_unsynced_bytes:0\r\n") {
			return time.Since(start), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, errors.New("bench: resp: the sidecar's persister did not drain in 10 minutes")
}

// opResult is one worker's part of a run.
type opResult struct {
	lat    []time.Duration
	bytes  int64
	errors int
	hits   int
	misses int
	bad    int
}

// runOps runs f(conn, worker, i) for i in each worker's share of n, on
// conns connections, and gathers latencies.
func runOps(addr string, conns, n int, f func(c *respConn, w, i int, buf *[]byte) (int64, error)) (opResult, time.Duration, error) {
	res := make([]opResult, conns)
	cs := make([]*respConn, conns)
	for w := range conns {
		c, err := dialRESP(addr, "", respPass)
		if err != nil {
			return opResult{}, 0, err
		}
		defer c.Close()
		cs[w] = c
	}
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conns {
		wg.Go(func() {
			var buf []byte
			for i := w; i < n; i += conns {
				t := time.Now()
				nb, err := f(cs[w], w, i, &buf)
				res[w].lat = append(res[w].lat, time.Since(t))
				switch {
				case errors.Is(err, errRESPMiss):
					res[w].misses++
				case errors.Is(err, errBadValue):
					res[w].bad++
				case err != nil:
					res[w].errors++
				default:
					res[w].hits++
					res[w].bytes += nb
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	var all opResult
	for _, r := range res {
		all.lat = append(all.lat, r.lat...)
		all.bytes += r.bytes
		all.errors += r.errors
		all.hits += r.hits
		all.misses += r.misses
		all.bad += r.bad
	}
	return all, el, nil
}

var errBadValue = errors.New("bench: resp: a value with other bytes")

func pct(lat []time.Duration, p float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return float64(s[max(i, 0)]) / float64(time.Millisecond)
}

func gbps(b int64, d time.Duration) float64 { return float64(b) / d.Seconds() / 1e9 }

func respGrid(ctx context.Context, o *RESPOptions, pool valuePool, rep *RESPReport) error {
	var servers []*respServer
	defer func() {
		for _, s := range servers {
			s.close()
		}
	}()
	rs, err := o.startRedis(ctx, "redis-server", "no", "--appendonly", "no", "--save", "")
	if err != nil {
		return err
	}
	servers = append(servers, rs)
	sc, err := o.startSidecar(ctx, "sidecar", "--kv-ram-bytes", strconv.FormatInt(o.GridRAM, 10))
	if err != nil {
		return err
	}
	servers = append(servers, sc)
	for _, name := range slices.Sorted(maps.Keys(o.Extra)) {
		servers = append(servers, &respServer{name: name, addr: o.Extra[name], pid: func() int { return 0 }, close: func() {}})
	}
	for _, size := range o.Sizes {
		for _, conns := range o.Conns {
			n := max(conns, int(o.CellBytes/size))
			type acc struct {
				set, get         opResult
				setRate, getRate []float64
				setS, getS, wait float64
			}
			accs := make([]acc, len(servers))
			// Rounds alternate the servers (each round starts with the next
			// one), so that a machine's drift falls on all of them alike.
			for round := range o.Rounds {
				for k := range servers {
					j := (k + round) % len(servers)
					s, a := servers[j], &accs[j]
					set, el, err := runOps(s.addr, conns, n, func(c *respConn, w, i int, _ *[]byte) (int64, error) {
						v := pool.value(i, size)
						return int64(len(v)), c.set(fmt.Sprintf("bench@%08x@0@%064x", w, i), v)
					})
					if err != nil {
						return err
					}
					wait, err := waitPersisted(s)
					if err != nil {
						return err
					}
					a.set.lat = append(a.set.lat, set.lat...)
					a.set.errors += set.errors
					a.setRate = append(a.setRate, gbps(set.bytes, el))
					a.setS += el.Seconds()
					a.wait += wait.Seconds()
					get, el, err := runOps(s.addr, conns, n, func(c *respConn, w, i int, buf *[]byte) (int64, error) {
						got, err := c.get(fmt.Sprintf("bench@%08x@0@%064x", w, i), *buf)
						if err != nil {
							return 0, err
						}
						*buf = got
						if i < conns && !bytes.Equal(got, pool.value(i, size)) { // one check a connection
							return 0, errBadValue
						}
						return int64(len(got)), nil
					})
					if err != nil {
						return err
					}
					a.get.lat = append(a.get.lat, get.lat...)
					a.get.errors += get.errors + get.misses + get.bad
					a.getRate = append(a.getRate, gbps(get.bytes, el))
					a.getS += el.Seconds()
					c, err := dialRESP(s.addr, "", respPass)
					if err == nil {
						_, err = c.do("FLUSHALL")
						c.Close()
					}
					if err != nil {
						return fmt.Errorf("%s: FLUSHALL: %w", s.name, err)
					}
				}
			}
			for j, s := range servers {
				a := accs[j]
				set := RESPCell{Server: s.name, Op: "SET", ValueBytes: size, Conns: conns, Ops: n * o.Rounds, Rounds: o.Rounds,
					Seconds: a.setS, GBps: median(a.setRate), P50ms: pct(a.set.lat, .5), P99ms: pct(a.set.lat, .99),
					Errors: a.set.errors, PersistWait: a.wait / float64(o.Rounds)}
				get := RESPCell{Server: s.name, Op: "GET", ValueBytes: size, Conns: conns, Ops: n * o.Rounds, Rounds: o.Rounds,
					Seconds: a.getS, GBps: median(a.getRate), P50ms: pct(a.get.lat, .5), P99ms: pct(a.get.lat, .99),
					Errors: a.get.errors}
				rep.Grid = append(rep.Grid, set, get)
				fmt.Fprintf(o.Progress, "%-14s %3d MiB x%2d  SET %6.2f GB/s p99 %7.1f ms  GET %6.2f GB/s p99 %7.1f ms  (medians of %d rounds: GET %s)\n",
					s.name, size>>20, conns, set.GBps, set.P99ms, get.GBps, get.P99ms, o.Rounds, rates(a.getRate))
			}
		}
	}
	return nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func rates(xs []float64) string {
	var b strings.Builder
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.2f", x)
	}
	return b.String()
}

func respWorkingSet(ctx context.Context, o *RESPOptions, pool valuePool, rep *RESPReport) error {
	n := int(int64(o.WSFactor) * o.WSRAM / o.WSValue)
	const conns = 8
	starts := []func() (*respServer, error){
		func() (*respServer, error) {
			return o.startRedis(ctx, "redis-server-lru", "no", "--appendonly", "no", "--save", "",
				"--maxmemory", strconv.FormatInt(o.WSRAM, 10), "--maxmemory-policy", "allkeys-lru")
		},
		func() (*respServer, error) {
			return o.startSidecar(ctx, "sidecar-ws", "--kv-ram-bytes", strconv.FormatInt(o.WSRAM, 10))
		},
	}
	for _, start := range starts {
		s, err := start()
		if err != nil {
			return err
		}
		key := func(i int) string { return fmt.Sprintf("ws@%08x@0@%064x", 0, i) }
		set, wel, err := runOps(s.addr, conns, n, func(c *respConn, _, i int, _ *[]byte) (int64, error) {
			v := pool.value(i, o.WSValue)
			return int64(len(v)), c.set(key(i), v)
		})
		if err != nil {
			s.close()
			return err
		}
		if _, err := waitPersisted(s); err != nil {
			s.close()
			return err
		}
		order := rand.New(rand.NewPCG(7, 7)).Perm(n)
		get, rel, err := runOps(s.addr, conns, n, func(c *respConn, _, j int, buf *[]byte) (int64, error) {
			i := order[j]
			got, err := c.get(key(i), *buf)
			if err != nil {
				return 0, err
			}
			*buf = got
			if !bytes.Equal(got, pool.value(i, o.WSValue)) {
				return 0, errBadValue
			}
			return int64(len(got)), nil
		})
		if err != nil {
			s.close()
			return err
		}
		ws := RESPWorkingSet{Server: s.name, RAMBytes: o.WSRAM, SetBytes: int64(n) * o.WSValue, Values: n,
			Hits: get.hits, Misses: get.misses, Corrupt: get.bad, SetErrors: set.errors, HitRatio: float64(get.hits) / float64(n),
			WriteGBps: gbps(set.bytes, wel), ReadGBps: gbps(get.bytes, rel), PeakRSS: procHWM(s.pid()),
			WriteP99ms: pct(set.lat, .99), ReadP99ms: pct(get.lat, .99)}
		if s.sidecar {
			ws.DiskBytes, _ = dirUsage(s.dir)
		}
		if get.errors > 0 {
			s.close()
			return fmt.Errorf("%s: %d GET errors", s.name, get.errors)
		}
		rep.WorkingSet = append(rep.WorkingSet, ws)
		fmt.Fprintf(o.Progress, "%-18s working set %d MiB over %d MiB of RAM: hit ratio %.3f, read %.2f GB/s, peak RSS %d MiB\n",
			s.name, ws.SetBytes>>20, o.WSRAM>>20, ws.HitRatio, ws.ReadGBps, ws.PeakRSS>>20)
		s.close()
	}
	return nil
}

func respKill(ctx context.Context, o *RESPOptions, pool valuePool, rep *RESPReport) error {
	const size = 1 << 20
	starts := []func() (*respServer, error){
		func() (*respServer, error) {
			return o.startRedis(ctx, "redis-server-aof-everysec", "everysec")
		},
		func() (*respServer, error) {
			return o.startSidecar(ctx, "sidecar-fsync-background", "--resp-fsync", "background")
		},
		func() (*respServer, error) {
			return o.startSidecar(ctx, "sidecar-unsynced-32MiB", "--resp-fsync", "background", "--resp-unsynced-bytes", "32MiB")
		},
		func() (*respServer, error) {
			return o.startSidecar(ctx, "sidecar-fsync-always", "--resp-fsync", "always")
		},
	}
	for _, start := range starts {
		s, err := start()
		if err != nil {
			return err
		}
		var (
			mu    sync.Mutex
			acked []int
			wg    sync.WaitGroup
		)
		stop := make(chan struct{})
		for w := range 4 {
			c, err := dialRESP(s.addr, "", respPass)
			if err != nil {
				s.close()
				return err
			}
			wg.Go(func() {
				defer c.Close()
				for i := w; ; i += 4 {
					select {
					case <-stop:
						return
					default:
					}
					if c.set(fmt.Sprintf("kill@%08x", i), pool.value(i, size)) != nil {
						return
					}
					mu.Lock()
					acked = append(acked, i)
					mu.Unlock()
				}
			})
		}
		time.Sleep(o.KillAfter)
		s.kill()
		close(stop)
		wg.Wait()
		if err := s.restart(ctx); err != nil {
			s.close()
			return err
		}
		k := RESPKill{Server: s.name, Acked: len(acked), AckedBytes: int64(len(acked)) * size}
		c, err := dialRESP(s.addr, "", respPass)
		if err != nil {
			s.close()
			return err
		}
		var buf []byte
		for _, i := range acked {
			got, err := c.get(fmt.Sprintf("kill@%08x", i), buf)
			switch {
			case errors.Is(err, errRESPMiss):
				k.Missing++
				k.LostBytes += size
			case err != nil:
				c.Close()
				s.close()
				return err
			case !bytes.Equal(got, pool.value(i, size)):
				k.Corrupt++
			default:
				k.Served++
				buf = got
			}
		}
		c.Close()
		rep.Kill = append(rep.Kill, k)
		fmt.Fprintf(o.Progress, "%-26s kill -9: %d of %d acknowledged served again, %d missing, %d corrupt\n", s.name, k.Served, k.Acked, k.Missing, k.Corrupt)
		s.close()
	}
	return nil
}

// procHWM is process pid's peak resident set (VmHWM) in bytes, 0 when
// unknown.
func procHWM(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// WriteRESPTables prints the report for people.
func WriteRESPTables(w io.Writer, r RESPReport) error {
	if len(r.Grid) > 0 {
		fmt.Fprintf(w, "SET and GET, one client per connection (%d cores); GB/s: the median of the rounds, the servers taking turns\n", r.Cores)
		fmt.Fprintf(w, "%-14s %-4s %7s %5s %6s %9s %9s %9s %8s\n", "server", "op", "value", "conns", "ops", "GB/s", "p50 ms", "p99 ms", "errors")
		for _, c := range r.Grid {
			extra := ""
			if c.PersistWait > 0 {
				extra = fmt.Sprintf("  (+%.1f s until on disk)", c.PersistWait)
			}
			fmt.Fprintf(w, "%-14s %-4s %4d MiB %5d %6d %9.2f %9.1f %9.1f %8d%s\n", c.Server, c.Op, c.ValueBytes>>20, c.Conns, c.Ops, c.GBps, c.P50ms, c.P99ms, c.Errors, extra)
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "GET GB/s, sidecar / redis-server")
		for _, c := range r.Grid {
			if c.Server != "sidecar" || c.Op != "GET" {
				continue
			}
			for _, d := range r.Grid {
				if d.Server == "redis-server" && d.Op == "GET" && d.ValueBytes == c.ValueBytes && d.Conns == c.Conns && d.GBps > 0 {
					fmt.Fprintf(w, "  %3d MiB x%2d: %.2f\n", c.ValueBytes>>20, c.Conns, c.GBps/d.GBps)
				}
			}
		}
		fmt.Fprintln(w)
	}
	if len(r.WorkingSet) > 0 {
		fmt.Fprintln(w, "working set over the RAM budget (8 MiB values, 8 connections, read back shuffled)")
		fmt.Fprintf(w, "%-18s %8s %8s %7s %9s %8s %8s %10s %9s %10s %9s\n", "server", "RAM MiB", "set MiB", "hits", "hit ratio", "corrupt", "refused", "write GB/s", "read GB/s", "peak RSS", "disk MiB")
		for _, s := range r.WorkingSet {
			fmt.Fprintf(w, "%-18s %8d %8d %7d %9.3f %8d %8d %10.2f %9.2f %6d MiB %9d\n", s.Server, s.RAMBytes>>20, s.SetBytes>>20, s.Hits, s.HitRatio, s.Corrupt, s.SetErrors, s.WriteGBps, s.ReadGBps, s.PeakRSS>>20, s.DiskBytes>>20)
		}
		fmt.Fprintln(w)
	}
	if len(r.Kill) > 0 {
		fmt.Fprintln(w, "kill -9 mid-traffic, restart on the same files (1 MiB values, 4 connections)")
		fmt.Fprintf(w, "%-26s %7s %7s %8s %8s %10s\n", "server", "acked", "served", "missing", "corrupt", "lost MiB")
		for _, k := range r.Kill {
			fmt.Fprintf(w, "%-26s %7d %7d %8d %8d %10d\n", k.Server, k.Acked, k.Served, k.Missing, k.Corrupt, k.LostBytes>>20)
		}
	}
	return nil
}

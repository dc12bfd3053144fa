package workload

// Sessions at scale (issue 22): one sidecar, run as a child process on its
// defaults with --fsync always, in front of the scripted upstream of internal/mockup;
// drop-in clients (a system message and the newest user message, with
// X-Session-ID) create new sessions in batches, 3 turns each, 8 clients at
// once, each session its own end user (X-User-ID) unless NoUser. After
// each batch the oldest sessions come back for one turn (returning
// sessions: the sidecar may have unloaded them), and the sidecar's RSS,
// open files and disk (and, with Remote, Redis's memory) are read. The
// question it answers: does a turn cost the same with 100,000 sessions
// held as with 100, and does an idle session leave RAM?

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/mockup"
	"github.com/redis/go-redis/v9"

	"github.com/kvsidecar/kvsidecar/bench/harness/launch"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
)

// ScaleOptions configure RunScale. Every zero value is a documented
// default.
type ScaleOptions struct {
	// Batches are the sizes of the successive batches of new sessions.
	// Empty: 1,000 then 3 × 3,000 (10,000 sessions held).
	Batches []int
	// Turns is the number of turns of each new session. Zero: 3.
	Turns int
	// Clients is the number of clients sending at once. Zero: 8.
	Clients int
	// Returning is how many of the oldest sessions take one more turn after
	// each batch. Zero: 200; negative: none.
	Returning int
	// NoUser sends no X-User-ID: every session is private to itself (one
	// API key, no user id, as most apps call). The default names each
	// session its own end user.
	NoUser bool
	// Remote runs a redis-server (bench/harness/redisserver) and gives the
	// sidecar --remote: Redis's used_memory per session is reported.
	Remote bool
	// RedisServer is the redis-server binary for Remote. Empty: found on
	// PATH (redisserver.Find).
	RedisServer string
	// SidecarCommand runs the sidecar: the binary and the arguments before
	// its flags, e.g. {os.Executable(), "serve"}. Required.
	SidecarCommand []string
	// SidecarEnv is added to the sidecar's environment.
	SidecarEnv []string
	// SidecarArgs are added after the flags the benchmark sets (--listen,
	// --upstream, --data-dir, --fsync always, --log-format json,
	// --log-level warn, and --pprof and --remote when asked).
	SidecarArgs []string
	// ProfileDir, when set, receives a CPU profile of each batch's new
	// sessions (the first ProfileSeconds of it) and a heap profile after
	// each batch, from the sidecar's --pprof.
	ProfileDir string
	// ProfileSeconds bounds each CPU profile. Zero: 10.
	ProfileSeconds int
	// Dir holds the sidecar's data and log. Empty: a temporary folder,
	// removed afterwards.
	Dir string
	// Progress receives one line per batch. Nil: none.
	Progress io.Writer
	// TurnTimeout bounds one request. Zero: 1 minute.
	TurnTimeout time.Duration
}

func (o *ScaleOptions) setDefaults() {
	if len(o.Batches) == 0 {
		o.Batches = []int{1000, 3000, 3000, 3000}
	}
	if o.Turns == 0 {
		o.Turns = 3
	}
	if o.Clients == 0 {
		o.Clients = 8
	}
	if o.Returning == 0 {
		o.Returning = 200
	}
	if o.ProfileSeconds == 0 {
		o.ProfileSeconds = 10
	}
	if o.TurnTimeout == 0 {
		o.TurnTimeout = time.Minute
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

func (o *ScaleOptions) check() error {
	for _, b := range o.Batches {
		if b < 1 || b > 10_000_000 {
			return fmt.Errorf("bench: scale: batch of %d sessions (1 to 10,000,000)", b)
		}
	}
	switch {
	case o.Turns < 1 || o.Turns > 100:
		return fmt.Errorf("bench: scale: %d turns per session (1 to 100)", o.Turns)
	case o.Clients < 1 || o.Clients > 1024:
		return fmt.Errorf("bench: scale: %d clients (1 to 1024)", o.Clients)
	case o.ProfileSeconds < 1 || o.TurnTimeout < 0:
		return fmt.Errorf("bench: scale: negative or zero option")
	case len(o.SidecarCommand) == 0:
		return fmt.Errorf("bench: scale: no SidecarCommand")
	}
	return nil
}

// ScaleReport is the outcome of RunScale.
type ScaleReport struct {
	Clients   int    `json:"clients"`
	Turns     int    `json:"turns_per_session"`
	Returning int    `json:"returning_sessions"`
	Users     string `json:"users"` // "own X-User-ID per session" or "none"
	Remote    bool   `json:"remote"`
	// SidecarArgs are the sidecar's flags beyond the benchmark's own.
	SidecarArgs []string `json:"sidecar_args"`
	// BaseRSSMB is the sidecar's RSS after its start and one warm-up turn.
	BaseRSSMB float64      `json:"base_rss_mb"`
	Batches   []ScaleBatch `json:"batches"`
	// NewP50Ratio is the new-session turn p50 of the last batch over the
	// first's (the goal: at most 1.5); ReturningP50Ratio the same for
	// returning sessions, over the second batch's (the first batch's
	// returning sessions were just used).
	NewP50Ratio       float64 `json:"new_p50_last_over_first"`
	ReturningP50Ratio float64 `json:"returning_p50_last_over_first"`
	// RSSPerSessionKB is the RSS growth from the end of the first batch to
	// the end of the last, per session added meanwhile (the goal: ≤ 20).
	RSSPerSessionKB float64 `json:"rss_growth_per_session_kb"`
	Seconds         float64 `json:"seconds"`
}

// ScaleBatch is one batch of new sessions and what the sidecar held after
// it.
type ScaleBatch struct {
	Sessions int `json:"sessions"` // new sessions of the batch
	Held     int `json:"held"`     // sessions created so far
	// New-session turns (each session's first), the session's later
	// turns (hot: it was just used), and all requests of the batch per
	// second of wall time.
	NewP50Ms       float64 `json:"new_p50_ms"`
	NewP99Ms       float64 `json:"new_p99_ms"`
	HotP50Ms       float64 `json:"hot_p50_ms"`
	HotP99Ms       float64 `json:"hot_p99_ms"`
	RequestsPerSec float64 `json:"requests_per_sec"`
	// Returning sessions: the oldest ones, one turn each after the batch.
	ReturningSessions int     `json:"returning_sessions"`
	ReturningP50Ms    float64 `json:"returning_p50_ms"`
	ReturningP99Ms    float64 `json:"returning_p99_ms"`
	// The sidecar process after the batch: RSS, its growth per session
	// held since the start, and per session of this batch.
	RSSMB              float64 `json:"rss_mb"`
	RSSPerSessionKB    float64 `json:"rss_per_session_held_kb"`
	RSSPerNewSessionKB float64 `json:"rss_growth_per_new_session_kb"`
	OpenFiles          int     `json:"open_files"`
	// LoadedSessions, LoadedUsers and ResidentMB are the sidecar's
	// sidecar_memory_sessions_loaded, _users_loaded and _resident_bytes
	// (its estimate of what they hold, against --memory-budget).
	LoadedSessions int     `json:"loaded_sessions"`
	LoadedUsers    int     `json:"loaded_users"`
	ResidentMB     float64 `json:"resident_mb"`
	// The data folder: bytes and files, and per session held.
	DiskBytes           int64   `json:"disk_bytes"`
	DiskFiles           int     `json:"disk_files"`
	DiskBytesPerSession float64 `json:"disk_bytes_per_session"`
	FilesPerSession     float64 `json:"files_per_session"`
	// Redis's used_memory (Remote), and per session held.
	RedisBytes           int64   `json:"redis_bytes,omitempty"`
	RedisBytesPerSession float64 `json:"redis_bytes_per_session,omitempty"`
	Errors               int     `json:"errors"`
	Seconds              float64 `json:"seconds"`
}

// scaleRun is one run's state.
type scaleRun struct {
	o      ScaleOptions
	client *http.Client
	base   string
	pid    int
	pprof  string
	errs   atomic.Int64
	// firstErr keeps the first failure, for the report's error.
	errMu    sync.Mutex
	firstErr error
}

// RunScale runs the benchmark.
func RunScale(ctx context.Context, o ScaleOptions) (*ScaleReport, error) {
	o.setDefaults()
	if err := o.check(); err != nil {
		return nil, err
	}
	t0 := time.Now()
	dir := o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "bench-scale-*")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	up := mockup.New(mockup.Options{})
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go up.Serve(upLn)
	defer up.Close()

	var rdb *redis.Client
	args := []string{"--fsync", "always", "--log-format", "json", "--log-level", "warn"}
	if o.Remote {
		srv, err := redisserver.Start(ctx, redisserver.Options{Binary: o.RedisServer, Dir: filepath.Join(dir, "redis")})
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		args = append(args, "--remote", srv.URL())
		rdb = redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rdb.Close()
	}
	r := &scaleRun{o: o}
	if o.ProfileDir != "" {
		port, err := launch.FreePort()
		if err != nil {
			return nil, err
		}
		r.pprof = "127.0.0.1:" + strconv.Itoa(port)
		args = append(args, "--pprof", r.pprof)
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			return nil, err
		}
	}
	args = append(args, o.SidecarArgs...)
	logPath := filepath.Join(dir, "sidecar.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	dataDir := filepath.Join(dir, "data")
	proc, err := launch.Start(ctx, launch.Options{
		Name: "bench: sidecar", Binary: o.SidecarCommand[0],
		Args: func(port int) []string {
			a := append(append([]string(nil), o.SidecarCommand[1:]...),
				"--listen", "127.0.0.1:"+strconv.Itoa(port), "--upstream", "http://"+upLn.Addr().String(), "--data-dir", dataDir)
			return append(a, args...)
		},
		Env: o.SidecarEnv, Output: logf, LogPath: logPath,
		Ready: launch.HTTPReady("/healthz"), ReadyName: "answering /healthz", BindError: "address already in use",
	})
	if err != nil {
		return nil, err
	}
	defer proc.Close()
	r.base, r.pid = "http://"+proc.Addr(), proc.Pid()
	r.client = &http.Client{Transport: &http.Transport{MaxIdleConns: 2 * o.Clients, MaxIdleConnsPerHost: 2 * o.Clients, IdleConnTimeout: time.Minute}}
	defer r.client.CloseIdleConnections()

	rep := &ScaleReport{Clients: o.Clients, Turns: o.Turns, Returning: max(0, o.Returning), Users: "own X-User-ID per session",
		Remote: o.Remote, SidecarArgs: o.SidecarArgs}
	if o.NoUser {
		rep.Users = "none (one API key, no user id)"
	}
	// One warm-up turn in a session of its own, then the base RSS.
	if _, err := r.turn(ctx, "warmup", "", 0); err != nil {
		return nil, fmt.Errorf("bench: scale: warm-up turn: %w; sidecar log ends:\n%s", err, proc.LogTail(2048))
	}
	baseRSS := procRSS(r.pid)
	rep.BaseRSSMB = float64(baseRSS) / (1 << 20)

	held := 0
	var firstEndRSS, prevRSS, rss int64
	firstEndHeld := 0
	for bi, n := range o.Batches {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b, err := r.batch(ctx, bi, held, n)
		if err != nil {
			return nil, err
		}
		held += n
		b.Held = held
		prevRSS = baseRSS
		if bi > 0 {
			prevRSS = rss
		}
		rss = procRSS(r.pid)
		b.RSSMB = float64(rss) / (1 << 20)
		b.RSSPerSessionKB = float64(rss-baseRSS) / 1024 / float64(held)
		b.RSSPerNewSessionKB = float64(rss-prevRSS) / 1024 / float64(n)
		b.OpenFiles = procFDs(r.pid)
		b.DiskBytes, b.DiskFiles = dirUsage(dataDir)
		b.DiskBytesPerSession = float64(b.DiskBytes) / float64(held)
		b.FilesPerSession = float64(b.DiskFiles) / float64(held)
		if m, err := ScrapeMetrics(ctx, AdminURL(r.base)+"/metrics"); err == nil {
			v, _ := m.Get("sidecar_memory_sessions_loaded")
			b.LoadedSessions = int(v)
			v, _ = m.Get("sidecar_memory_users_loaded")
			b.LoadedUsers = int(v)
			v, _ = m.Get("sidecar_memory_resident_bytes")
			b.ResidentMB = v / (1 << 20)
		}
		if rdb != nil {
			b.RedisBytes = redisUsedMemory(ctx, rdb)
			b.RedisBytesPerSession = float64(b.RedisBytes) / float64(held)
		}
		if r.pprof != "" {
			_ = r.fetchProfile(ctx, "/debug/pprof/heap?gc=1", filepath.Join(o.ProfileDir, fmt.Sprintf("batch%d-%d.heap.pprof", bi+1, held)))
		}
		b.Errors = int(r.errs.Swap(0))
		if bi == 0 {
			firstEndRSS, firstEndHeld = rss, held
		}
		rep.Batches = append(rep.Batches, b)
		fmt.Fprintf(o.Progress, "batch %d: %d new sessions (%d held): new p50 %.1f ms p99 %.1f ms, returning p50 %.1f ms, %.0f req/s, RSS %.0f MB, %d fds, %d errors\n",
			bi+1, n, held, b.NewP50Ms, b.NewP99Ms, b.ReturningP50Ms, b.RequestsPerSec, b.RSSMB, b.OpenFiles, b.Errors)
		if b.Errors > 0 && b.Errors >= n {
			r.errMu.Lock()
			err := r.firstErr
			r.errMu.Unlock()
			return nil, fmt.Errorf("bench: scale: every turn of batch %d failed (%v); sidecar log ends:\n%s", bi+1, err, proc.LogTail(2048))
		}
	}
	first, last := rep.Batches[0], rep.Batches[len(rep.Batches)-1]
	rep.NewP50Ratio = ratio(last.NewP50Ms, first.NewP50Ms)
	for _, b := range rep.Batches[1:] {
		if b.ReturningSessions > 0 {
			rep.ReturningP50Ratio = ratio(last.ReturningP50Ms, b.ReturningP50Ms)
			break
		}
	}
	if n := held - firstEndHeld; n > 0 {
		rep.RSSPerSessionKB = float64(rss-firstEndRSS) / 1024 / float64(n)
	}
	rep.Seconds = time.Since(t0).Seconds()
	return rep, nil
}

// batch creates n new sessions (numbered from start), Turns turns each,
// Clients at once, then brings the oldest Returning sessions back for one
// turn each.
func (r *scaleRun) batch(ctx context.Context, bi, start, n int) (ScaleBatch, error) {
	o := r.o
	b := ScaleBatch{Sessions: n}
	t0 := time.Now()
	var prof chan struct{}
	if r.pprof != "" {
		prof = make(chan struct{})
		go func() {
			defer close(prof)
			path := filepath.Join(o.ProfileDir, fmt.Sprintf("batch%d-%d.cpu.pprof", bi+1, start+n))
			_ = r.fetchProfile(ctx, "/debug/pprof/profile?seconds="+strconv.Itoa(o.ProfileSeconds), path)
		}()
	}
	var newLat, hotLat []time.Duration
	var mu sync.Mutex
	requests := r.parallel(ctx, n, func(i int) int {
		id := start + i
		sent := 0
		for t := 0; t < o.Turns; t++ {
			d, err := r.turn(ctx, sessionName(id), r.user(id), t)
			sent++
			if err != nil {
				continue
			}
			mu.Lock()
			if t == 0 {
				newLat = append(newLat, d)
			} else {
				hotLat = append(hotLat, d)
			}
			mu.Unlock()
		}
		return sent
	})
	wall := time.Since(t0)
	if prof != nil {
		<-prof
	}
	b.NewP50Ms, b.NewP99Ms = percentileMs(newLat, 0.50), percentileMs(newLat, 0.99)
	b.HotP50Ms, b.HotP99Ms = percentileMs(hotLat, 0.50), percentileMs(hotLat, 0.99)
	b.RequestsPerSec = float64(requests) / wall.Seconds()
	if k := min(o.Returning, start+n); k > 0 {
		var retLat []time.Duration
		r.parallel(ctx, k, func(i int) int {
			d, err := r.turn(ctx, sessionName(i), r.user(i), o.Turns+bi)
			if err == nil {
				mu.Lock()
				retLat = append(retLat, d)
				mu.Unlock()
			}
			return 1
		})
		b.ReturningSessions = k
		b.ReturningP50Ms, b.ReturningP99Ms = percentileMs(retLat, 0.50), percentileMs(retLat, 0.99)
	}
	b.Seconds = time.Since(t0).Seconds()
	return b, ctx.Err()
}

// parallel runs fn(0..n-1) on Clients goroutines and returns the sum of
// what fn returned.
func (r *scaleRun) parallel(ctx context.Context, n int, fn func(i int) int) int {
	var next, total atomic.Int64
	var wg sync.WaitGroup
	for range min(r.o.Clients, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				total.Add(int64(fn(i)))
			}
		}()
	}
	wg.Wait()
	return int(total.Load())
}

func sessionName(i int) string { return "scale-" + strconv.Itoa(i) }

// user is the X-User-ID of session i: its own, unless NoUser.
func (r *scaleRun) user(i int) string {
	if r.o.NoUser {
		return ""
	}
	return "user-" + strconv.Itoa(i)
}

// scaleSystem is every session's system message, as an app's.
const scaleSystem = "You are the support assistant of an online shop. Answer briefly and politely."

// turn sends one drop-in request (the system message and the newest user
// message) of session, turn t, and returns its latency.
func (r *scaleRun) turn(ctx context.Context, session, user string, t int) (time.Duration, error) {
	w := sessionsWords
	q := fmt.Sprintf("Session %s, question %d: where is my %s %s order number %d, and can the %s be sent to %s?",
		session, t+1, w[(len(session)*7+t*3)%len(w)], w[(len(session)+t*11)%len(w)], 1000+t*37+len(session),
		w[(t*17+3)%len(w)], w[(t*5+len(session)*3)%len(w)])
	body := fmt.Sprintf(`{"model":"bench-scale","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, scaleSystem, q)
	ctx, cancel := context.WithTimeout(ctx, r.o.TurnTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer bench-scale")
	req.Header.Set("X-Session-ID", session)
	if user != "" {
		req.Header.Set("X-User-ID", user)
	}
	t0 := time.Now()
	resp, err := r.client.Do(req)
	if err == nil {
		var got []byte
		got, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(got))
		}
	}
	d := time.Since(t0)
	if err != nil {
		r.errs.Add(1)
		r.errMu.Lock()
		if r.firstErr == nil {
			r.firstErr = err
		}
		r.errMu.Unlock()
		return d, err
	}
	return d, nil
}

// fetchProfile saves the sidecar's pprof answer at path.
func (r *scaleRun) fetchProfile(ctx context.Context, path, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.pprof+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", path, resp.StatusCode)
	}
	return os.WriteFile(file, data, 0o644)
}

// procRSS is the resident set of process pid in bytes (VmRSS), 0 when
// unknown.
func procRSS(pid int) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fs := strings.Fields(rest)
			if len(fs) > 0 {
				kb, _ := strconv.ParseInt(fs[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// procFDs counts process pid's open file descriptors, -1 when unknown.
func procFDs(pid int) int {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// dirUsage sums the sizes of the regular files under dir and counts them.
func dirUsage(dir string) (bytes int64, files int) {
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() {
			bytes += fi.Size()
			files++
		}
		return nil
	})
	return bytes, files
}

// redisUsedMemory is INFO memory's used_memory, 0 when unknown.
func redisUsedMemory(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// WriteScaleTable prints the report for humans.
func WriteScaleTable(w io.Writer, r *ScaleReport) error {
	fmt.Fprintf(w, "Sessions at scale: %d clients at once, %d turns per new session (drop-in: system + newest message), end users: %s, --fsync always",
		r.Clients, r.Turns, r.Users)
	if r.Remote {
		fmt.Fprint(w, ", --remote (redis-server)")
	}
	if len(r.SidecarArgs) > 0 {
		fmt.Fprintf(w, ", sidecar flags: %s", strings.Join(r.SidecarArgs, " "))
	}
	fmt.Fprintf(w, "\nSidecar RSS after start: %.0f MB. Returning: the %d oldest sessions, one turn each after the batch.\n\n", r.BaseRSSMB, r.Returning)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "batch\tnew\theld\tnew p50/p99 ms\thot p50/p99 ms\treturning p50/p99 ms\treq/s\tRSS MB\tKB/session held\tKB/new session\tloaded\tusers\tresident MB\tfds\tdisk B/session\tfiles/session"
	if r.Remote {
		head += "\tRedis B/session"
	}
	fmt.Fprintln(tw, head+"\terrors\t")
	for i, b := range r.Batches {
		line := fmt.Sprintf("%d\t%d\t%d\t%.1f / %.1f\t%.1f / %.1f\t%.1f / %.1f\t%.0f\t%.0f\t%.1f\t%.1f\t%d\t%d\t%.1f\t%d\t%.0f\t%.2f",
			i+1, b.Sessions, b.Held, b.NewP50Ms, b.NewP99Ms, b.HotP50Ms, b.HotP99Ms, b.ReturningP50Ms, b.ReturningP99Ms,
			b.RequestsPerSec, b.RSSMB, b.RSSPerSessionKB, b.RSSPerNewSessionKB, b.LoadedSessions, b.LoadedUsers, b.ResidentMB, b.OpenFiles, b.DiskBytesPerSession, b.FilesPerSession)
		if r.Remote {
			line += fmt.Sprintf("\t%.0f", b.RedisBytesPerSession)
		}
		fmt.Fprintln(tw, line+fmt.Sprintf("\t%d\t", b.Errors))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nNew-session p50, last batch / first: %.2f (goal ≤ 1.5). Returning p50, last / first: %.2f. RSS growth per session after the first batch: %.1f KB (goal ≤ 20). %.0f s.\n",
		r.NewP50Ratio, r.ReturningP50Ratio, r.RSSPerSessionKB, r.Seconds)
	return err
}

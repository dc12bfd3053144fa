package workload

// Sessions against a real llama.cpp server (issue 10): N sessions with long
// per-session documents, R rounds round-robin over few slots, the same
// full-history streaming client talking to one llama-server directly and to
// an identical one through the sidecar, side by side in one run, with
// optional kill -9 restarts of the engines or of the sidecar between rounds.
// The measure is llama.cpp's own: tokens reprocessed (timings.prompt_n).
// Each llama-server sits behind a recording proxy (bench/harness/recordup), which
// shows what the sidecar asked of its engine on its own.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/recordup"
)

// SessionsOptions configure RunSessions. SidecarCommand is required; every
// zero value is a documented default.
type SessionsOptions struct {
	// RealParts: Sessions 8, Rounds 4 (taken round-robin), Threads half the
	// CPUs (at least one), so the two servers side by side do not
	// oversubscribe them. Slots is also the sidecar's --llamacpp-slots.
	// The client is one API key without user ids unless PerUser.
	RealParts
	// EngineRestartAfter, when positive, kills both llama-servers with
	// SIGKILL after that round (right after its last answer, unless
	// DrainBeforeKill) and starts them again (same port, slot folder,
	// model).
	EngineRestartAfter int
	// SidecarRestartAfter, when positive, kills the sidecar with SIGKILL
	// after that round, once its background queue drained, and starts it
	// again on the same data folder.
	SidecarRestartAfter int
	// SidecarEnv is added to the sidecar's environment.
	SidecarEnv []string
	// FollowUp makes every session's turn followed at once, on each side,
	// by a second question: that turn finds the session's KV resident in
	// its slot, the baseline of the returning sessions' time to first
	// token (SessionsTTFT.ReturningRatio).
	FollowUp bool
	// Order is the order of the sessions within a round: "round-robin"
	// (the default: the same every round, so each session's arrival
	// history predicts the next) or "shuffled" (a fresh permutation each
	// round, seeded by the round: no history predicts it, the case of a
	// wrong prediction for --llamacpp-preload).
	Order string
	// Pause is how long the client waits before each turn of a session
	// (the direct side's and the sidecar's alike), as a person reads and
	// types: the idle time predictive preload works in. Zero: none, turns
	// back to back at the machine's speed.
	Pause time.Duration
}

// Session orders of SessionsOptions.Order.
const (
	OrderRoundRobin = "round-robin"
	OrderShuffled   = "shuffled"
)

func (o *SessionsOptions) validate() error {
	o.setDefaults(8, 4, max(1, runtime.NumCPU()/2))
	if err := o.check("sessions", 1); err != nil {
		return err
	}
	if o.EngineRestartAfter < 0 || o.SidecarRestartAfter < 0 || o.Pause < 0 {
		return errors.New("bench: sessions: negative restart round")
	}
	switch o.Order {
	case "":
		o.Order = OrderRoundRobin
	case OrderRoundRobin, OrderShuffled:
	default:
		return fmt.Errorf("bench: sessions: order %q (want %s or %s)", o.Order, OrderRoundRobin, OrderShuffled)
	}
	return nil
}

// roundOrder is the order of n sessions in a round.
func roundOrder(order string, n, round int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	if order == OrderShuffled {
		rand.New(rand.NewPCG(uint64(round), 24)).Shuffle(n, func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	}
	return idx
}

// SessionsReport is the result of RunSessions.
type SessionsReport struct {
	Sessions            int      `json:"sessions"`
	Rounds              int      `json:"rounds"`
	Slots               int      `json:"slots"`
	DocTokens           int      `json:"doc_tokens"`
	CacheRAMMiB         int      `json:"cache_ram_mib"`
	MaxTokens           int      `json:"max_tokens"`
	PerUser             bool     `json:"per_user,omitempty"`
	FollowUp            bool     `json:"follow_up,omitempty"`
	PauseMs             int64    `json:"pause_ms,omitempty"`
	Order               string   `json:"order"`
	SharedUser          bool     `json:"shared_user,omitempty"`
	DrainBeforeKill     bool     `json:"drain_before_kill,omitempty"`
	Threads             int      `json:"threads"`
	EngineRestartAfter  int      `json:"engine_restart_after,omitempty"`
	SidecarRestartAfter int      `json:"sidecar_restart_after,omitempty"`
	Model               string   `json:"model"`
	LlamaArgs           []string `json:"llama_args"`
	SidecarArgs         []string `json:"sidecar_args"`

	RoundStats []SessionsRound `json:"rounds_detail"`
	// TTFT of the sidecar's turns (after round 1) that restored a saved
	// state, against the direct client's turns (after round 1) that
	// reprocessed at least half their prompt; and of returning sessions
	// against resident ones.
	TTFT    SessionsTTFT   `json:"ttft"`
	Goals   []SessionsGoal `json:"goals"`
	Notes   []string       `json:"notes,omitempty"`
	Seconds float64        `json:"duration_seconds"`
}

// SessionsRound is one round of every session, per side.
type SessionsRound struct {
	Round int `json:"round"`
	// Event is what happened just before the round ("engine restart",
	// "sidecar restart"), if anything.
	Event   string       `json:"event,omitempty"`
	Direct  SessionsSide `json:"direct"`
	Sidecar SessionsSide `json:"sidecar"`
	// Ratio is the sidecar's tokens reprocessed over the direct client's.
	Ratio float64 `json:"reprocessed_ratio"`
	// Floor is the lowest Ratio any cache could reach: the sidecar side's
	// new tokens over the direct client's tokens reprocessed.
	Floor float64 `json:"floor_ratio"`
}

// SessionsSide is one round on one side.
type SessionsSide struct {
	Turns  int `json:"turns"`
	Errors int `json:"errors"`
	// FirstError is the first failed turn's error, if any.
	FirstError string `json:"first_error,omitempty"`
	// PromptTokens is the sum of the turns' prompt sizes (prompt_n + cache_n).
	PromptTokens int64 `json:"prompt_tokens"`
	// Reprocessed is the sum of timings.prompt_n.
	Reprocessed int64 `json:"reprocessed_tokens"`
	// Cached is the sum of timings.cache_n.
	Cached int64 `json:"cached_tokens"`
	// NewTokens is what the turns added to their sessions' previous
	// prompts (the previous reply, the new question, their template
	// tokens): what even a perfect cache reprocesses. Round 1: everything.
	NewTokens int64 `json:"new_tokens"`
	// EngineReprocessed is the llama-server's own count of prompt tokens
	// processed in the round (llamacpp:prompt_tokens_total): the client's
	// turns plus, behind the sidecar, its background calls.
	EngineReprocessed int64 `json:"engine_reprocessed_tokens"`
	// EngineGenerated is the llama-server's own count of tokens generated
	// in the round (llamacpp:tokens_predicted_total): the client's replies
	// plus, behind the sidecar, what its own calls generated.
	EngineGenerated int64 `json:"engine_generated_tokens"`
	// OwnGenerations counts the generations the sidecar asked of its
	// engine on its own in the round (recorded in front of the engine;
	// zero on the direct side); OwnUnbounded those without a max_tokens.
	OwnGenerations int     `json:"own_generations"`
	OwnUnbounded   int     `json:"own_unbounded_generations"`
	TTFTP50Ms      float64 `json:"ttft_p50_ms"`
	TTFTP99Ms      float64 `json:"ttft_p99_ms"`
	// The sidecar's engine figures for the round, from its /metrics
	// (zero on the direct side; -1 when the sidecar does not export them).
	Restores float64 `json:"restores"`
	Saves    float64 `json:"saves"`
	// Preloads, PreloadsUsed and PreloadsWasted are the sidecar's
	// predictive preloads in the round (off the request path; Restores are
	// on it) and how many their session used or another's placement
	// dropped.
	Preloads       float64 `json:"preloads"`
	PreloadsUsed   float64 `json:"preloads_used"`
	PreloadsWasted float64 `json:"preloads_wasted"`
	RestoreMeanMs  float64 `json:"restore_mean_ms"`
	SaveMeanMs     float64 `json:"save_mean_ms"`
}

// SessionsTTFT compares time to first token of restored and recomputed turns.
type SessionsTTFT struct {
	RestoredTurns   int     `json:"restored_turns"`
	RestoredP50Ms   float64 `json:"restored_p50_ms"`
	RecomputedTurns int     `json:"recomputed_turns"`
	RecomputedP50Ms float64 `json:"recomputed_p50_ms"`
	// Ratio is RestoredP50Ms / RecomputedP50Ms (0 when either is missing).
	Ratio float64 `json:"ratio"`

	// Returning turns are the sidecar's first turns of a session in each
	// round after the first (with more sessions than slots, other sessions
	// used the slots since its last turn); resident turns are the
	// follow-ups (SessionsOptions.FollowUp) that found the session's KV in
	// its slot (no restore, no preload). ReturningRatio is ReturningP50Ms / ResidentP50Ms (0 when
	// either is missing). Preloaded, RestoredOnPath and Prefilled split
	// the returning turns by how the sidecar served them: from a preloaded
	// slot, with a restore on the request path, or neither.
	ReturningTurns int     `json:"returning_turns"`
	ReturningP50Ms float64 `json:"returning_p50_ms"`
	ResidentTurns  int     `json:"resident_turns"`
	ResidentP50Ms  float64 `json:"resident_p50_ms"`
	ReturningRatio float64 `json:"returning_ratio"`
	Preloaded      int     `json:"returning_preloaded"`
	RestoredOnPath int     `json:"returning_restored_on_path"`
	Prefilled      int     `json:"returning_prefilled"`
}

// SessionsGoal is one of issue 10's goals, checked.
type SessionsGoal struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Met   bool    `json:"met"`
}

// sessionsGoalRatio: after the first round the sidecar reprocesses at most
// this share of the tokens the direct client does (issue 10).
const sessionsGoalRatio = 0.10

// sessionsGoalReturning: a returning session's time to first token is at
// most this multiple of a resident one's (issue 24, predictive preload).
const sessionsGoalReturning = 1.2

// side is one llama-server with its recording proxy and, for the sidecar
// side, the sidecar in front.
type side struct {
	name    string
	llama   *llamaserver.Server
	rec     *recordup.Proxy
	sidecar *sidecarProc // nil on the direct side
	hist    [][]chatMsg  // per session
	last    []int64      // per session: the previous turn's prompt tokens
}

func (s *side) base() string {
	if s.sidecar != nil {
		return s.sidecar.url()
	}
	return s.rec.URL()
}

// RunSessions runs the benchmark; see SessionsOptions.
func RunSessions(ctx context.Context, o SessionsOptions) (SessionsReport, error) {
	t0 := time.Now()
	if err := o.validate(); err != nil {
		return SessionsReport{}, err
	}
	dir, cleanup, err := scratchDir(o.Dir, "kvsidecar-bench-sessions-*")
	if err != nil {
		return SessionsReport{}, err
	}
	defer cleanup()
	if err := o.resolveModel("sessions"); err != nil {
		return SessionsReport{}, err
	}
	r := SessionsReport{Sessions: o.Sessions, Rounds: o.Rounds, Slots: o.Slots, DocTokens: o.DocTokens, CacheRAMMiB: o.CacheRAMMiB,
		MaxTokens: o.MaxTokens, PerUser: o.PerUser, FollowUp: o.FollowUp, Order: o.Order, PauseMs: o.Pause.Milliseconds(), SharedUser: o.SharedUser, DrainBeforeKill: o.DrainBeforeKill, Threads: o.Threads, EngineRestartAfter: o.EngineRestartAfter, SidecarRestartAfter: o.SidecarRestartAfter,
		Model: o.Model, LlamaArgs: o.LlamaArgs, SidecarArgs: append([]string{}, o.SidecarArgs...)}

	direct := &side{name: "direct"}
	via := &side{name: "sidecar"}
	for _, s := range []*side{direct, via} {
		if s.llama, err = o.startLlama(ctx, filepath.Join(dir, s.name)); err != nil {
			return r, err
		}
		defer s.llama.Close()
		if s.rec, err = recordEngine(s.llama); err != nil {
			return r, err
		}
		defer s.rec.Close()
	}
	sc, err := startSidecar(ctx, o.SidecarCommand, o.SidecarArgs, o.SidecarEnv, via.rec.URL(), via.llama, filepath.Join(dir, "sidecar"))
	if err != nil {
		return r, err
	}
	defer sc.close()
	via.sidecar = sc
	fmt.Fprintf(o.Progress, "llama-servers %s (direct) and %s (behind the sidecar at %s), logs in %s\n",
		direct.llama.URL(), via.llama.URL(), sc.url(), dir)

	docs, err := makeDocs(ctx, direct.llama, o.Sessions, o.DocTokens)
	if err != nil {
		return r, err
	}
	for _, s := range []*side{direct, via} {
		s.hist = make([][]chatMsg, o.Sessions)
		s.last = make([]int64, o.Sessions)
		for i := range s.hist {
			s.hist[i] = []chatMsg{{Role: "system", Content: docs[i]}}
		}
	}

	client := &http.Client{Timeout: o.TurnTimeout}
	var restoredTTFT, recomputedTTFT, returningTTFT, residentTTFT []time.Duration
	for round := 1; round <= o.Rounds; round++ {
		rs := SessionsRound{Round: round}
		if round-1 == o.EngineRestartAfter && round > 1 {
			note := o.killNote(ctx, sc)
			for _, s := range []*side{direct, via} {
				s.llama.Kill()
				s.rec.DropConns() // its connections die with it
				if err := s.llama.Restart(ctx); err != nil {
					return r, fmt.Errorf("bench: sessions: restart %s llama-server: %w", s.name, err)
				}
			}
			rs.Event = "engine restart"
			r.Notes = appendOnce(r.Notes, fmt.Sprintf("both llama-servers were killed with SIGKILL after round %d, %s, and restarted", round-1, note))
			fmt.Fprintf(o.Progress, "killed both llama-servers (kill -9) %s and restarted them\n", note)
		}
		if round-1 == o.SidecarRestartAfter && round > 1 {
			note := sc.drain(ctx)
			if err := sc.restart(ctx); err != nil {
				return r, err
			}
			rs.Event = strings.TrimPrefix(rs.Event+", sidecar restart", ", ")
			r.Notes = appendOnce(r.Notes, fmt.Sprintf("the sidecar was killed with SIGKILL after round %d, %s, and restarted on the same data dir", round-1, note))
			fmt.Fprintf(o.Progress, "killed the sidecar (kill -9) %s and restarted it\n", note)
		}
		m0 := map[*side]Metrics{}
		for _, s := range []*side{direct, via} {
			m0[s], _ = ScrapeMetrics(ctx, s.llama.URL()+"/metrics")
		}
		scBefore, _ := ScrapeMetrics(ctx, sc.adminURL()+"/metrics")
		recBefore := via.rec.Len()
		var ttft = map[*side][]time.Duration{}
		questions := 1
		if o.FollowUp {
			questions = 2
		}
		for _, i := range roundOrder(o.Order, o.Sessions, round) {
			for qn := range questions {
				q := sessionQuestion(i, round)
				if qn == 1 {
					q = sessionFollowUp(i, round)
				}
				if o.Pause > 0 {
					select {
					case <-time.After(o.Pause):
					case <-ctx.Done():
						return r, ctx.Err()
					}
				}
				for _, s := range []*side{direct, via} {
					st := &rs.Direct
					if s == via {
						st = &rs.Sidecar
					}
					var before Metrics
					if s == via {
						before, _ = ScrapeMetrics(ctx, sc.adminURL()+"/metrics")
					}
					msgs := append(s.hist[i], chatMsg{Role: "user", Content: q})
					session := fmt.Sprintf("bench-%03d", i)
					tr, err := streamTurn(ctx, client, s.base(), session, o.user(session), msgs, o.MaxTokens)
					st.Turns++
					if err != nil {
						st.Errors++
						if st.FirstError == "" {
							st.FirstError = fmt.Sprintf("session %d: %v", i, err)
						}
						// The client keeps the question without an answer, as a
						// user who retries would.
						s.hist[i] = append(msgs, chatMsg{Role: "assistant", Content: ""})
						continue
					}
					s.hist[i] = append(msgs, chatMsg{Role: "assistant", Content: tr.Reply})
					st.PromptTokens += tr.PromptN + tr.CacheN
					st.NewTokens += max(0, tr.PromptN+tr.CacheN-s.last[i])
					s.last[i] = tr.PromptN + tr.CacheN
					st.Reprocessed += tr.PromptN
					st.Cached += tr.CacheN
					ttft[s] = append(ttft[s], tr.TTFT)
					if round == 1 {
						continue
					}
					recomputed := 2*tr.PromptN >= tr.PromptN+tr.CacheN
					switch {
					case s == direct && recomputed:
						recomputedTTFT = append(recomputedTTFT, tr.TTFT)
					case s == via:
						after, _ := ScrapeMetrics(ctx, sc.adminURL()+"/metrics")
						restored := counterDelta(before, after, "sidecar_engine_restores_total") > 0
						if restored && !recomputed {
							restoredTTFT = append(restoredTTFT, tr.TTFT)
						}
						preloaded := counterDelta(before, after, "sidecar_engine_preloads_used_total") > 0
						if qn == 1 {
							// A follow-up whose KV left its slot meanwhile (to a
							// background call) is no resident turn.
							if !restored && !preloaded {
								residentTTFT = append(residentTTFT, tr.TTFT)
							}
							break
						}
						returningTTFT = append(returningTTFT, tr.TTFT)
						switch {
						case preloaded:
							r.TTFT.Preloaded++
						case restored:
							r.TTFT.RestoredOnPath++
						default:
							r.TTFT.Prefilled++
						}
					}
				}
			}
		}
		for _, s := range []*side{direct, via} {
			st := &rs.Direct
			if s == via {
				st = &rs.Sidecar
			}
			st.TTFTP50Ms, st.TTFTP99Ms = percentileMs(ttft[s], 0.5), percentileMs(ttft[s], 0.99)
			if m1, err := ScrapeMetrics(ctx, s.llama.URL()+"/metrics"); err == nil {
				b, _ := m0[s].Get("llamacpp:prompt_tokens_total")
				a, _ := m1.Get("llamacpp:prompt_tokens_total")
				st.EngineReprocessed = int64(delta(b, a))
				b, _ = m0[s].Get("llamacpp:tokens_predicted_total")
				a, _ = m1.Get("llamacpp:tokens_predicted_total")
				st.EngineGenerated = int64(delta(b, a))
			}
		}
		rs.Sidecar.OwnGenerations, rs.Sidecar.OwnUnbounded = OwnGenerations(via.rec.Requests()[recBefore:],
			func(r recordup.Request) bool { return strings.HasPrefix(r.Header.Get("X-Session-ID"), "bench-") })
		scAfter, err := ScrapeMetrics(ctx, sc.adminURL()+"/metrics")
		if err == nil {
			fillEngineFigures(&rs.Sidecar, scBefore, scAfter)
		}
		rs.Ratio = ratio(float64(rs.Sidecar.Reprocessed), float64(rs.Direct.Reprocessed))
		rs.Floor = ratio(float64(rs.Sidecar.NewTokens), float64(rs.Direct.Reprocessed))
		r.RoundStats = append(r.RoundStats, rs)
		fmt.Fprintf(o.Progress, "round %d: reprocessed direct %d, sidecar %d (ratio %.3f, floor %.3f); errors %d/%d; generated direct %d, sidecar %d (its own calls %d, %d without max_tokens)\n",
			round, rs.Direct.Reprocessed, rs.Sidecar.Reprocessed, rs.Ratio, rs.Floor, rs.Direct.Errors, rs.Sidecar.Errors,
			rs.Direct.EngineGenerated, rs.Sidecar.EngineGenerated, rs.Sidecar.OwnGenerations, rs.Sidecar.OwnUnbounded)
	}

	r.TTFT.RestoredTurns, r.TTFT.RestoredP50Ms = len(restoredTTFT), percentileMs(restoredTTFT, 0.5)
	r.TTFT.RecomputedTurns, r.TTFT.RecomputedP50Ms = len(recomputedTTFT), percentileMs(recomputedTTFT, 0.5)
	if r.TTFT.RestoredTurns > 0 && r.TTFT.RecomputedTurns > 0 {
		r.TTFT.Ratio = r.TTFT.RestoredP50Ms / r.TTFT.RecomputedP50Ms
	}
	r.TTFT.ReturningTurns, r.TTFT.ReturningP50Ms = len(returningTTFT), percentileMs(returningTTFT, 0.5)
	r.TTFT.ResidentTurns, r.TTFT.ResidentP50Ms = len(residentTTFT), percentileMs(residentTTFT, 0.5)
	if r.TTFT.ReturningTurns > 0 && r.TTFT.ResidentTurns > 0 {
		r.TTFT.ReturningRatio = r.TTFT.ReturningP50Ms / r.TTFT.ResidentP50Ms
	}
	for _, rs := range r.RoundStats[1:] {
		ok := rs.Direct.Errors == 0 && rs.Sidecar.Errors == 0 && rs.Ratio <= sessionsGoalRatio
		name := fmt.Sprintf("round %d: sidecar/direct tokens reprocessed", rs.Round)
		if rs.Event != "" {
			name += " (after the " + rs.Event + ")"
		}
		r.Goals = append(r.Goals, SessionsGoal{Name: name, Value: rs.Ratio, Limit: sessionsGoalRatio, Met: ok})
	}
	unbounded := 0
	for _, rs := range r.RoundStats {
		unbounded += rs.Sidecar.OwnUnbounded
	}
	r.Goals = append(r.Goals, SessionsGoal{Name: "the sidecar's own generations without a max_tokens", Value: float64(unbounded), Met: unbounded == 0})
	if r.TTFT.ReturningRatio > 0 && o.Sessions > o.Slots {
		r.Goals = append(r.Goals, SessionsGoal{Name: "TTFT p50 of returning sessions / resident ones (follow-ups)", Value: r.TTFT.ReturningRatio,
			Limit: sessionsGoalReturning, Met: r.TTFT.ReturningRatio <= sessionsGoalReturning})
	}
	r.Seconds = time.Since(t0).Seconds()
	return r, nil
}

// counterDelta is how much a counter of the sidecar's rose between two
// scrapes (0 when absent; from zero when it went back, after a restart).
func counterDelta(before, after Metrics, name string) float64 {
	a, _ := after.Get(name)
	b, _ := before.Get(name)
	return delta(b, a)
}

func appendOnce(notes []string, n string) []string {
	for _, x := range notes {
		if x == n {
			return notes
		}
	}
	return append(notes, n)
}

// fillEngineFigures sets the sidecar's restores and saves of a round and
// their mean times from two scrapes of its /metrics (-1 where it exports
// none).
func fillEngineFigures(st *SessionsSide, before, after Metrics) {
	st.Restores, st.Saves, st.RestoreMeanMs, st.SaveMeanMs = -1, -1, -1, -1
	st.Preloads, st.PreloadsUsed, st.PreloadsWasted = -1, -1, -1
	for _, c := range []struct {
		v    *float64
		name string
	}{{&st.Preloads, "sidecar_engine_preloads_total"}, {&st.PreloadsUsed, "sidecar_engine_preloads_used_total"}, {&st.PreloadsWasted, "sidecar_engine_preloads_wasted_total"}} {
		if _, ok := after.Get(c.name); ok {
			*c.v = counterDelta(before, after, c.name)
		}
	}
	if a, ok := after.engineCounter("restore"); ok {
		b, _ := before.engineCounter("restore")
		st.Restores = delta(b, a)
	}
	if a, ok := after.engineCounter("save"); ok {
		b, _ := before.engineCounter("save")
		st.Saves = delta(b, a)
	}
	mean := func(op string) float64 {
		ta, na, ok := after.engineSeconds(op)
		if !ok {
			return -1
		}
		tb, nb, _ := before.engineSeconds(op)
		if na < nb { // restarted: the figures start again
			tb, nb = 0, 0
		}
		if na-nb <= 0 {
			return 0
		}
		return 1000 * (ta - tb) / (na - nb)
	}
	st.RestoreMeanMs, st.SaveMeanMs = mean("restore"), mean("save")
}

package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/llamaserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
)

// The run of RunFleet: the fleets, their turns, the kill of a replica and of
// Redis, the joiner and the history check.

// fleet is N replicas, with or without a shared store.
type fleet struct {
	name   string
	llamas []*llamaserver.Server
	scs    []*sidecarProc
	alive  []bool
	hist   [][]chatMsg
	last   []int64 // per session: previous prompt tokens
	at     []int   // per session: replica of the previous turn (-1: none)
	acked  [][]bool
	// prompts has each (session, round)'s prompt_n and prompt size.
	prompts map[[2]int][2]int64
}

func (f *fleet) close() {
	for _, s := range f.scs {
		if s != nil {
			s.close()
		}
	}
	for _, l := range f.llamas {
		if l != nil {
			l.Close()
		}
	}
}

// route is the replica serving session i in round r: (i+r) mod N among
// the live ones.
func (f *fleet) route(i, r int) int {
	var live []int
	for k, ok := range f.alive {
		if ok {
			live = append(live, k)
		}
	}
	return live[(i+r)%len(live)]
}

// RunFleet runs the benchmark; see FleetOptions.
func RunFleet(ctx context.Context, o FleetOptions) (FleetReport, error) {
	t0 := time.Now()
	if err := o.validate(); err != nil {
		return FleetReport{}, err
	}
	dir, cleanup, err := scratchDir(o.Dir, "kvsidecar-bench-fleet-*")
	if err != nil {
		return FleetReport{}, err
	}
	defer cleanup()
	if err := o.resolveModel("fleet"); err != nil {
		return FleetReport{}, err
	}
	r := FleetReport{Replicas: o.Replicas, Sessions: o.Sessions, Rounds: o.Rounds, Slots: o.Slots, DocTokens: o.DocTokens,
		CacheRAMMiB: o.CacheRAMMiB, MaxTokens: o.MaxTokens, Threads: o.Threads, KillAfter: o.KillAfter,
		RedisRestartAfter: o.RedisRestartAfter, AppendFsync: o.AppendFsync, PerUser: o.PerUser, SharedUser: o.SharedUser, DrainBeforeKill: o.DrainBeforeKill,
		Model: o.Model, LlamaArgs: o.LlamaArgs, SidecarArgs: append([]string{}, o.SidecarArgs...)}

	redis, err := redisserver.Start(ctx, redisserver.Options{Binary: o.RedisServer, Dir: filepath.Join(dir, "redis"), AppendFsync: o.AppendFsync})
	if err != nil {
		return r, err
	}
	defer redis.Close()

	// sticky is one replica without a store: every session stays where it
	// is, the cost of a turn that does not move.
	shared, local, sticky := &fleet{name: "shared"}, &fleet{name: "local"}, &fleet{name: "sticky"}
	defer shared.close()
	defer local.close()
	defer sticky.close()
	fleets := []*fleet{shared, local, sticky}
	for _, f := range fleets {
		n := o.Replicas
		if f == sticky {
			n = 1
		}
		for k := range n {
			name := fmt.Sprintf("%s-%d", f.name, k)
			redisURL := ""
			if f == shared {
				redisURL = redis.URL()
			}
			if _, err := f.addReplica(ctx, o, redisURL, filepath.Join(dir, name)); err != nil {
				return r, err
			}
		}
	}
	fmt.Fprintf(o.Progress, "redis %s; %d replicas per fleet; logs in %s\n", redis.Addr(), o.Replicas, dir)

	docs, err := makeDocs(ctx, shared.llamas[0], o.Sessions, o.DocTokens)
	if err != nil {
		return r, err
	}
	for _, f := range fleets {
		f.hist = make([][]chatMsg, o.Sessions)
		f.prompts = map[[2]int][2]int64{}
		f.last = make([]int64, o.Sessions)
		f.at = make([]int, o.Sessions)
		f.acked = make([][]bool, o.Sessions)
		for i := range f.hist {
			f.hist[i] = []chatMsg{{Role: "system", Content: docs[i]}}
			f.at[i] = -1
		}
	}
	client := &http.Client{Timeout: o.TurnTimeout}
	killed := -1
	var movedTurns [][2]int // (session, round) of the shared fleet's moved turns
	var killTurns, localKillTurns FleetKill
	var killTTFT, localKillTTFT []time.Duration
	for round := 1; round <= o.Rounds; round++ {
		rs := FleetRound{Round: round}
		if round-1 == o.KillAfter && round > 1 {
			killed = 1
			var note string
			for _, f := range []*fleet{shared, local} {
				// With DrainBeforeKill, as between users' turns: the last
				// turn's KV is saved. Without, a kill right after an answer
				// may lose that turn's KV, never its history.
				if o.DrainBeforeKill {
					f.scs[killed].drain(ctx)
					time.Sleep(200 * time.Millisecond)
				}
				note = o.killNote(ctx, f.scs[killed])
				f.scs[killed].kill()
				f.llamas[killed].Kill()
				f.alive[killed] = false
			}
			rs.Event = fmt.Sprintf("replica %d killed", killed)
			r.Notes = append(r.Notes, fmt.Sprintf("replica %d (sidecar and llama-server) was killed with SIGKILL after round %d in both fleets, %s; its sessions went on on the others", killed, round-1, note))
			fmt.Fprintf(o.Progress, "killed replica %d (kill -9 of its sidecar and llama-server) in both fleets\n", killed)
		}
		if round-1 == o.RedisRestartAfter && round > 1 {
			redis.Kill()
			if err := redis.Restart(ctx); err != nil {
				return r, fmt.Errorf("bench: fleet: restart redis: %w", err)
			}
			rs.Event = joinEvent(rs.Event, "redis restart")
			r.Notes = append(r.Notes, fmt.Sprintf("redis-server was killed with SIGKILL after round %d and restarted on its AOF (appendfsync %s)", round-1, o.AppendFsync))
			fmt.Fprintf(o.Progress, "killed redis-server (kill -9) and restarted it\n")
		}
		for i := 0; i < o.Sessions; i++ {
			q := sessionQuestion(i, round)
			for _, f := range fleets {
				st := &rs.Shared
				switch f {
				case local:
					st = &rs.Local
				case sticky:
					st = &FleetSide{}
				}
				k := f.route(i, round)
				moved := f.at[i] >= 0 && f.at[i] != k
				fromKilled := f.at[i] == killed && killed >= 0
				msgs := append(f.hist[i], chatMsg{Role: "user", Content: q})
				// One API key, no user id (as most apps call), or each
				// session an end user of its own (PerUser).
				id := fmt.Sprintf("fleet-%03d", i)
				tr, err := streamTurn(ctx, client, f.scs[k].url(), id, o.user(id), msgs, o.MaxTokens)
				st.Turns++
				f.at[i] = k
				if err != nil {
					st.Errors++
					if st.FirstError == "" {
						st.FirstError = fmt.Sprintf("session %d on replica %d: %v", i, k, err)
					}
					f.hist[i] = append(msgs, chatMsg{Role: "assistant", Content: ""})
					f.acked[i] = append(f.acked[i], false)
					continue
				}
				f.hist[i] = append(msgs, chatMsg{Role: "assistant", Content: tr.Reply})
				f.acked[i] = append(f.acked[i], true)
				prompt := tr.PromptN + tr.CacheN
				newTok := max(0, prompt-f.last[i])
				f.last[i] = prompt
				f.prompts[[2]int{i, round}] = [2]int64{tr.PromptN, prompt}
				if o.Verbose {
					fmt.Fprintf(o.Progress, "  %s session %d round %d on replica %d (moved %t): prompt %d, prompt_n %d, cache_n %d, new %d, TTFT %v\n",
						f.name, i, round, k, moved, prompt, tr.PromptN, tr.CacheN, newTok, tr.TTFT.Round(time.Millisecond))
				}
				st.AllReprocess += tr.PromptN
				if !moved {
					continue
				}
				if f == shared {
					movedTurns = append(movedTurns, [2]int{i, round})
				}
				st.Moved++
				st.Prompt += prompt
				st.Reprocessed += tr.PromptN
				st.NewTokens += newTok
				st.ttft = append(st.ttft, tr.TTFT)
				if fromKilled {
					kt, kttft := &killTurns, &killTTFT
					if f == local {
						kt, kttft = &localKillTurns, &localKillTTFT
					}
					kt.Turns++
					kt.Prompt += prompt
					kt.Reprocessed += tr.PromptN
					kt.NewTokens += newTok
					*kttft = append(*kttft, tr.TTFT)
				}
			}
		}
		rs.Shared.TTFTP50Ms, rs.Shared.TTFTP99Ms = percentileMs(rs.Shared.ttft, 0.5), percentileMs(rs.Shared.ttft, 0.99)
		rs.Local.TTFTP50Ms, rs.Local.TTFTP99Ms = percentileMs(rs.Local.ttft, 0.5), percentileMs(rs.Local.ttft, 0.99)
		rs.Ratio = ratio(float64(rs.Shared.Reprocessed), float64(rs.Local.Reprocessed))
		if round > 1 {
			r.Shared.add(rs.Shared)
			r.Local.add(rs.Local)
		}
		r.RoundStats = append(r.RoundStats, rs)
		fmt.Fprintf(o.Progress, "round %d: moved turns %d; reprocessed on them: shared %d, local %d (ratio %.3f); TTFT p50 %.0f / %.0f ms; errors %d/%d\n",
			round, rs.Shared.Moved, rs.Shared.Reprocessed, rs.Local.Reprocessed, rs.Ratio, rs.Shared.TTFTP50Ms, rs.Local.TTFTP50Ms, rs.Shared.Errors, rs.Local.Errors)
	}
	r.Ratio = ratio(float64(r.Shared.Reprocessed), float64(r.Local.Reprocessed))
	for _, t := range movedTurns {
		if t[1] < 2 {
			continue
		}
		p := sticky.prompts[t]
		r.Sticky.Moved++
		r.Sticky.Reprocessed += p[0]
		r.Sticky.Prompt += p[1]
	}
	killTurns.Ratio = ratio(float64(killTurns.Reprocessed), float64(killTurns.Prompt))
	killTurns.LocalRatio = ratio(float64(localKillTurns.Reprocessed), float64(localKillTurns.Prompt))
	killTurns.TTFTP50Ms, killTurns.LocalTTFT = percentileMs(killTTFT, 0.5), percentileMs(localKillTTFT, 0.5)
	r.AfterKill = killTurns

	// A replica that joins the shared fleet now, with empty disks (after
	// the Redis restart, if any), serves one more turn of every session:
	// history and KV come from the store alone. Then every acknowledged
	// turn must be in its view of the sessions.
	joiner, err := shared.addReplica(ctx, o, redis.URL(), filepath.Join(dir, "shared-joiner"))
	if err != nil {
		return r, err
	}
	for i := 0; i < o.Sessions; i++ {
		q := sessionQuestion(i, o.Rounds+1)
		msgs := append(shared.hist[i], chatMsg{Role: "user", Content: q})
		id := fmt.Sprintf("fleet-%03d", i)
		tr, err := streamTurn(ctx, client, joiner.url(), id, o.user(id), msgs, o.MaxTokens)
		r.Joiner.Turns++
		if err != nil {
			r.Joiner.Errors++
			shared.hist[i] = append(msgs, chatMsg{Role: "assistant", Content: ""})
			shared.acked[i] = append(shared.acked[i], false)
			continue
		}
		shared.hist[i] = append(msgs, chatMsg{Role: "assistant", Content: tr.Reply})
		shared.acked[i] = append(shared.acked[i], true)
		prompt := tr.PromptN + tr.CacheN
		r.Joiner.Prompt += prompt
		r.Joiner.Reprocessed += tr.PromptN
		r.Joiner.NewTokens += max(0, prompt-shared.last[i])
		r.Joiner.ttft = append(r.Joiner.ttft, tr.TTFT)
	}
	r.Joiner.Moved = r.Joiner.Turns - r.Joiner.Errors
	r.Joiner.TTFTP50Ms, r.Joiner.TTFTP99Ms = percentileMs(r.Joiner.ttft, 0.5), percentileMs(r.Joiner.ttft, 0.99)
	fmt.Fprintf(o.Progress, "a new replica (empty disks) served one more turn of every session: reprocessed %d of %d prompt tokens (%d new)\n",
		r.Joiner.Reprocessed, r.Joiner.Prompt, r.Joiner.NewTokens)
	r.History = checkFleetHistory(ctx, client, shared, joiner.url())

	errs := r.Shared.Errors
	r.Goals = append(r.Goals, SessionsGoal{Name: "moved turns: shared/local tokens reprocessed", Value: r.Ratio, Limit: sessionsGoalRatio,
		Met: errs == 0 && r.Shared.Moved > 0 && r.Ratio <= sessionsGoalRatio})
	// Moving a session costs nothing beyond 10% of the prompt: the moved
	// turns reprocess at most what the same turns did where sessions
	// never move, plus that.
	excess := ratio(float64(r.Shared.Reprocessed-r.Sticky.Reprocessed), float64(r.Shared.Prompt))
	r.Goals = append(r.Goals, SessionsGoal{Name: "moved turns: (reprocessed − the same turns unmoved) / prompt", Value: excess, Limit: sessionsGoalRatio,
		Met: errs == 0 && r.Shared.Moved > 0 && excess <= sessionsGoalRatio})
	jr := ratio(float64(r.Joiner.Reprocessed), float64(r.Joiner.Prompt))
	r.Goals = append(r.Goals, SessionsGoal{Name: "a replica joining with empty disks: tokens reprocessed / cold start", Value: jr, Limit: sessionsGoalRatio,
		Met: r.Joiner.Errors == 0 && r.Joiner.Turns > 0 && jr <= sessionsGoalRatio})
	if o.KillAfter > 0 {
		r.Goals = append(r.Goals, SessionsGoal{Name: "after the kill -9 of a replica: tokens reprocessed / cold start", Value: killTurns.Ratio,
			Limit: sessionsGoalRatio, Met: killTurns.Turns > 0 && killTurns.Ratio <= sessionsGoalRatio})
	}
	lost := float64(r.History.Turns - r.History.Kept)
	r.Goals = append(r.Goals, SessionsGoal{Name: "acknowledged turns missing from the shared fleet's memory", Value: lost, Limit: 0, Met: lost == 0 && r.History.Turns > 0})
	r.Seconds = time.Since(t0).Seconds()
	return r, nil
}

func joinEvent(a, b string) string {
	if a == "" {
		return b
	}
	return a + ", " + b
}

// addReplica starts one more replica of f (its own llama-server, a sidecar
// with its data under dir; sharing the store at redisURL when not empty)
// and adds it to f.
func (f *fleet) addReplica(ctx context.Context, o FleetOptions, redisURL, dir string) (*sidecarProc, error) {
	l, err := o.startLlama(ctx, dir)
	if err != nil {
		return nil, err
	}
	f.llamas = append(f.llamas, l)
	args := append([]string{}, o.SidecarArgs...)
	if redisURL != "" {
		args = append(args, "--remote", redisURL, "--remote-lease-ttl", "3s")
	}
	sc, err := startSidecar(ctx, o.SidecarCommand, args, nil, l.URL(), l, dir)
	if err != nil {
		return nil, err
	}
	f.scs = append(f.scs, sc)
	f.alive = append(f.alive, true)
	return sc, nil
}

// checkFleetHistory reads each session of f from the sidecar at base
// (GET /v1/sessions/{id}) and counts the acknowledged turns whose question
// and reply it holds in order.
func checkFleetHistory(ctx context.Context, client *http.Client, f *fleet, base string) FleetHistory {
	var h FleetHistory
	for i := range f.hist {
		h.Sessions++
		for _, ok := range f.acked[i] {
			if ok {
				h.Turns++
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/sessions/fleet-"+fmt.Sprintf("%03d", i), nil)
		req.Header.Set("Authorization", "Bearer bench-sessions")
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		var v struct {
			Messages []struct{ Role, Content string }
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			continue
		}
		// Walk the client's history: each acknowledged turn's question and
		// reply must appear, in order.
		pos := 0
		find := func(role, content string) bool {
			for ; pos < len(v.Messages); pos++ {
				if v.Messages[pos].Role == role && v.Messages[pos].Content == content {
					pos++
					return true
				}
			}
			return false
		}
		t := 0
		for j := 1; j+1 < len(f.hist[i]); j += 2 {
			if t >= len(f.acked[i]) {
				break
			}
			ok := f.acked[i][t]
			t++
			if !ok {
				continue
			}
			save := pos
			if find("user", f.hist[i][j].Content) && find("assistant", f.hist[i][j+1].Content) {
				h.Kept++
			} else {
				pos = save
			}
		}
	}
	return h
}

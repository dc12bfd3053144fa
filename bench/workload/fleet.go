package workload

// A fleet of sidecars (issue 13): N replicas, each a sidecar in front of
// its own real llama-server, sessions whose turns move between replicas
// (round r of session i goes to replica (i+r) mod N), run twice side by
// side with the same client: once with the replicas sharing a Redis store
// (--remote) and once without. Optionally one replica (sidecar and engine)
// is killed with SIGKILL after a round and its sessions continue on the
// others, and the Redis server is killed with SIGKILL and restarted. The
// measure is llama.cpp's own: tokens reprocessed (timings.prompt_n) on the
// turns that moved, and the time to first token.

import (
	"errors"
	"fmt"
	"time"
)

// FleetOptions configure RunFleet. SidecarCommand is required; every zero
// value is a documented default.
type FleetOptions struct {
	// Replicas per fleet. Zero: 2.
	Replicas int
	// RealParts: Sessions 4, Rounds 6, Threads 1 (2·Replicas servers share
	// the machine). SidecarArgs are added to every replica's flags. The
	// client is one API key without user ids unless PerUser.
	RealParts
	// KillAfter, when positive, kills replica 1 (its sidecar and its
	// llama-server, SIGKILL) in both fleets after that round (right after
	// its last answer, unless DrainBeforeKill); its sessions go on on the
	// others.
	KillAfter int
	// RedisRestartAfter, when positive, kills the Redis server (SIGKILL)
	// after that round and starts it again on its AOF.
	RedisRestartAfter int
	// AppendFsync is the Redis AOF policy. Empty: "always".
	AppendFsync string
	// RedisServer is the redis-server binary. Empty: redisserver.Find.
	RedisServer string
	// Verbose adds a progress line per turn.
	Verbose bool
}

func (o *FleetOptions) validate() error {
	if o.Replicas == 0 {
		o.Replicas = 2
	}
	o.setDefaults(4, 6, 1)
	if o.AppendFsync == "" {
		o.AppendFsync = "always"
	}
	switch err := o.check("fleet", 2); {
	case err != nil:
		return err
	case o.Replicas < 2 || o.Replicas > 8:
		return fmt.Errorf("bench: fleet: %d replicas (2 to 8)", o.Replicas)
	case o.KillAfter < 0 || o.RedisRestartAfter < 0:
		return errors.New("bench: fleet: negative kill round")
	case o.KillAfter >= o.Rounds:
		return fmt.Errorf("bench: fleet: kill after round %d of %d", o.KillAfter, o.Rounds)
	}
	return nil
}

// FleetReport is the result of RunFleet.
type FleetReport struct {
	Replicas          int      `json:"replicas"`
	Sessions          int      `json:"sessions"`
	Rounds            int      `json:"rounds"`
	Slots             int      `json:"slots"`
	DocTokens         int      `json:"doc_tokens"`
	CacheRAMMiB       int      `json:"cache_ram_mib"`
	MaxTokens         int      `json:"max_tokens"`
	Threads           int      `json:"threads"`
	KillAfter         int      `json:"kill_after,omitempty"`
	RedisRestartAfter int      `json:"redis_restart_after,omitempty"`
	AppendFsync       string   `json:"appendfsync"`
	PerUser           bool     `json:"per_user,omitempty"`
	SharedUser        bool     `json:"shared_user,omitempty"`
	DrainBeforeKill   bool     `json:"drain_before_kill,omitempty"`
	Model             string   `json:"model"`
	LlamaArgs         []string `json:"llama_args"`
	SidecarArgs       []string `json:"sidecar_args"`

	RoundStats []FleetRound `json:"rounds_detail"`
	// Moved sums every moved turn after round 1, per fleet; Ratio is the
	// shared fleet's tokens reprocessed on them over the local one's.
	Shared FleetSide `json:"shared_moved"`
	Local  FleetSide `json:"local_moved"`
	Ratio  float64   `json:"moved_reprocessed_ratio"`
	// Sticky is the same turns (session, round) on one replica where no
	// session ever moves: what they cost when they stay.
	Sticky FleetSide `json:"sticky_same_turns"`
	// AfterKill is the shared fleet's first turn of each session that had
	// been on the killed replica: tokens reprocessed over the prompt (a
	// cold start reprocesses all of it).
	AfterKill FleetKill `json:"after_kill"`
	// Joiner is one more turn of every session on a replica that joined
	// the shared fleet at the end, with empty disks: what it reprocessed
	// came from nothing but the store.
	Joiner FleetSide `json:"joiner"`
	// History checks, after the run, that every acknowledged turn of every
	// session is in the shared fleet's memory, read from the joiner.
	History FleetHistory   `json:"history"`
	Goals   []SessionsGoal `json:"goals"`
	Notes   []string       `json:"notes,omitempty"`
	Seconds float64        `json:"duration_seconds"`
}

// FleetRound is one round of every session, per fleet.
type FleetRound struct {
	Round  int       `json:"round"`
	Event  string    `json:"event,omitempty"`
	Shared FleetSide `json:"shared"`
	Local  FleetSide `json:"local"`
	// Ratio is the shared fleet's tokens reprocessed on moved turns over
	// the local fleet's (0 when none moved).
	Ratio float64 `json:"moved_reprocessed_ratio"`
}

// FleetSide is what one fleet's turns showed the client.
type FleetSide struct {
	Turns      int    `json:"turns"`
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// Moved counts turns served by another replica than the session's
	// previous turn; the figures below are over those.
	Moved        int     `json:"moved"`
	Prompt       int64   `json:"prompt_tokens"`
	Reprocessed  int64   `json:"reprocessed_tokens"`
	NewTokens    int64   `json:"new_tokens"`
	TTFTP50Ms    float64 `json:"ttft_p50_ms"`
	TTFTP99Ms    float64 `json:"ttft_p99_ms"`
	ttft         []time.Duration
	AllReprocess int64 `json:"all_turns_reprocessed_tokens"`
}

func (s *FleetSide) add(o FleetSide) {
	s.Turns += o.Turns
	s.Errors += o.Errors
	if s.FirstError == "" {
		s.FirstError = o.FirstError
	}
	s.Moved += o.Moved
	s.Prompt += o.Prompt
	s.Reprocessed += o.Reprocessed
	s.NewTokens += o.NewTokens
	s.AllReprocess += o.AllReprocess
	s.ttft = append(s.ttft, o.ttft...)
	s.TTFTP50Ms, s.TTFTP99Ms = percentileMs(s.ttft, 0.5), percentileMs(s.ttft, 0.99)
}

// FleetKill is the turns that followed the kill of a replica.
type FleetKill struct {
	Turns       int     `json:"turns"`
	Prompt      int64   `json:"prompt_tokens"`
	Reprocessed int64   `json:"reprocessed_tokens"`
	NewTokens   int64   `json:"new_tokens"`
	Ratio       float64 `json:"reprocessed_over_cold_start"`
	LocalRatio  float64 `json:"local_reprocessed_over_cold_start"`
	TTFTP50Ms   float64 `json:"ttft_p50_ms"`
	LocalTTFT   float64 `json:"local_ttft_p50_ms"`
}

// FleetHistory is the check of the shared fleet's memory after the run.
type FleetHistory struct {
	Sessions int `json:"sessions"`
	// Turns is the acknowledged turns; Kept those whose user message and
	// reply the memory holds, in order.
	Turns int `json:"acknowledged_turns"`
	Kept  int `json:"kept_turns"`
}

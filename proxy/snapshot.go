package proxy

// Context snapshots (.hctx): GET /v1/sessions/{id}/snapshot answers the
// caller's session captured whole (its memory and its engine KV states)
// as one file; PUT /v1/sessions/{id}/snapshot with that file, on another
// sidecar (its own data folder, its own llama-server, the same model),
// creates the session there so the conversation continues where it was.
//
//	GET  ─▶ tenant (API key), end user (X-User-ID, must be the session's)
//	     ─▶ memory.ExportSession ─▶ engine.ExportStates (within --max-snapshot-bytes)
//	     ─▶ hctx: manifest | memory | engine ─▶ application/octet-stream
//	PUT  ─▶ body ≤ --max-snapshot-bytes ─▶ hctx.Parse (damaged: 400, nothing written)
//	     ─▶ memory.CheckSnapshot (user ≠ caller's: 403) ─▶ engine.CheckStates (other model: 409)
//	     ─▶ an existing session of the caller is replaced (another end user's: 409)
//	     ─▶ memory.ImportSession ─▶ engine.ImportStates ─▶ 201 {memory, engine}

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/engine"
	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/internal/hctx"
	"github.com/kvsidecar/kvsidecar/internal/obs"
	"github.com/kvsidecar/kvsidecar/memory"
)

// SnapshotMemory is what snapshots need of session memory (package
// memory's Store). A Memory that is not one answers snapshot routes 404.
type SnapshotMemory interface {
	ExportSession(ctx context.Context, tenant, sessionID, user string) ([]byte, memory.SnapshotInfo, error)
	CheckSnapshot(section []byte, user string) (memory.SnapshotInfo, error)
	ImportSession(ctx context.Context, tenant, sessionID, user string, section []byte) (memory.SnapshotInfo, error)
}

// SnapshotEngine is what snapshots need of an engine connector that keeps
// KV states (engine.Snapshotter: engine/llamacpp). Without one a snapshot carries no engine
// section, and an imported one's states are not taken (the engine
// recomputes the prompt).
type SnapshotEngine interface {
	ExportStates(ctx context.Context, tenant, sessionID string, maxBytes int64) ([]byte, engine.StatesInfo, error)
	CheckStates(ctx context.Context, tenant string, section []byte) (engine.StatesInfo, error)
	ImportStates(ctx context.Context, tenant, sessionID string, section []byte) (engine.StatesInfo, error)
}

var (
	_ SnapshotMemory = (*memory.Store)(nil)
	_ SnapshotEngine = engine.Snapshotter(nil)
)

// snapshotFormat names the file in its manifest.
const snapshotFormat = "kvsidecar.hctx"

// SnapshotContentType is the media type of a .hctx file.
const SnapshotContentType = "application/vnd.kvsidecar.hctx"

// snapshotManifest is the manifest section: what the file holds.
type snapshotManifest struct {
	Format    string              `json:"format"`
	Version   int                 `json:"version"`
	CreatedAt time.Time           `json:"created_at"`
	Session   string              `json:"session"`
	User      string              `json:"user,omitempty"`
	Model     string              `json:"model,omitempty"`
	Memory    memory.SnapshotInfo `json:"memory"`
	Engine    *engine.StatesInfo  `json:"engine,omitempty"`
}

// snapshotResult answers a PUT.
type snapshotResult struct {
	Object   string              `json:"object"`
	ID       string              `json:"id"`
	Replaced bool                `json:"replaced"`
	Memory   memory.SnapshotInfo `json:"memory"`
	Engine   *engine.StatesInfo  `json:"engine,omitempty"`
	// Note says what did not come along, when something did not.
	Note string `json:"note,omitempty"`
}

// snapMetrics count snapshot exports and imports.
type snapMetrics struct {
	exports, imports, refused, failed atomic.Uint64
	bytesOut, bytesIn                 atomic.Uint64
	exportNs, importNs                atomic.Uint64
}

// export mirrors m into reg at each scrape.
func (m *snapMetrics) export(reg *obs.Registry) {
	reg.OnScrape(func() {
		for _, c := range []struct {
			outcome string
			v       uint64
		}{{"exported", m.exports.Load()}, {"imported", m.imports.Load()}, {"refused", m.refused.Load()}, {"failed", m.failed.Load()}} {
			reg.SetCounter(fmt.Sprintf("sidecar_snapshots_total{outcome=%q}", c.outcome),
				"Context snapshots (.hctx) by outcome: exported, imported, refused (damaged, another model, another end user, too large), failed (an error of this sidecar).", int64(c.v))
		}
		const bytesHelp = "Bytes of context snapshots exported (out) and imported (in)."
		reg.SetCounter(`sidecar_snapshot_bytes_total{direction="out"}`, bytesHelp, int64(m.bytesOut.Load()))
		reg.SetCounter(`sidecar_snapshot_bytes_total{direction="in"}`, bytesHelp, int64(m.bytesIn.Load()))
		const secondsHelp = "Time spent exporting and importing context snapshots."
		reg.SetFloatCounter(`sidecar_snapshot_seconds_total{op="export"}`, secondsHelp, float64(m.exportNs.Load())/1e9)
		reg.SetFloatCounter(`sidecar_snapshot_seconds_total{op="import"}`, secondsHelp, float64(m.importNs.Load())/1e9)
	})
}

// snapshotUser returns the caller's end user (X-User-ID, "" for none);
// ok false after a 400 for a malformed one.
func snapshotUser(ctx *fasthttp.RequestCtx) (string, bool) {
	user := string(ctx.Request.Header.Peek("X-User-ID"))
	if user != "" {
		if err := validSessionID(user); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_user_id", fmt.Sprintf("X-User-ID: %v", err))
			return "", false
		}
	}
	return user, true
}

// handleSnapshot serves GET and PUT /v1/sessions/{id}/snapshot for the
// caller's tenant (the routing and the id were checked by handleSessions).
func (s *Server) handleSnapshot(ctx *fasthttp.RequestCtx, tenant, id string) {
	sm, ok := s.opts.Memory.(SnapshotMemory)
	if !ok {
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "snapshots_unsupported", "this sidecar's session memory does not take snapshots")
		return
	}
	user, ok := snapshotUser(ctx)
	if !ok {
		return
	}
	if !ctx.IsGet() && !ctx.IsPut() {
		ctx.Response.Header.Set("Allow", "GET, PUT")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "use GET to export a snapshot, PUT to import one")
		return
	}
	if s.opts.Fleet != nil {
		// One turn or snapshot of a session at a time, across the fleet.
		release, err := s.opts.Fleet.Acquire(s.stopping, tenant, id)
		if err != nil {
			s.metrics.fleetBusy.Add(1)
			writeError(ctx, fasthttp.StatusServiceUnavailable, typeServer, "session_busy", "another replica is serving this session; retry")
			ctx.Response.Header.Set("Retry-After", "1")
			return
		}
		defer release()
	}
	start := time.Now()
	if ctx.IsGet() {
		s.exportSnapshot(ctx, sm, tenant, id, user)
		s.snap.exportNs.Add(uint64(time.Since(start)))
		return
	}
	s.importSnapshot(ctx, sm, tenant, id, user)
	s.snap.importNs.Add(uint64(time.Since(start)))
}

func (s *Server) exportSnapshot(ctx *fasthttp.RequestCtx, sm SnapshotMemory, tenant, id, user string) {
	mem, info, err := sm.ExportSession(s.stopping, tenant, id, user)
	switch {
	case errors.Is(err, memory.ErrNotFound) || errors.Is(err, memory.ErrUserMismatch):
		// Another end user's session is not the caller's to see.
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, "session_not_found", fmt.Sprintf("no session %q for this API key and user", id))
		return
	case err != nil:
		s.snap.failed.Add(1)
		s.log.Error("snapshot export failed", "session", id, "err", err)
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "session store failed; see the sidecar's log")
		return
	}
	man := snapshotManifest{Format: snapshotFormat, Version: hctx.Version, CreatedAt: time.Now().UTC(), Session: id,
		User: user, Model: info.Model, Memory: info}
	sections := []hctx.Section{{Kind: hctx.KindMemory, Data: mem}}
	if se, ok := s.opts.Engine.(SnapshotEngine); ok {
		// The KV states take what the bound leaves after the memory (and
		// a manifest's worth of room).
		room := max(1, int64(s.opts.MaxSnapshotBytes)-int64(hctx.Size(sections...))-64<<10)
		states, ei, err := se.ExportStates(s.stopping, tenant, id, room)
		if err != nil {
			s.snap.failed.Add(1)
			s.log.Error("snapshot export of the engine states failed", "session", id, "err", err)
			writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "exporting the session's KV states failed; see the sidecar's log")
			return
		}
		sections = append(sections, hctx.Section{Kind: hctx.KindEngine, Data: states})
		man.Engine = &ei
	}
	mb, err := json.Marshal(&man)
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "could not encode the manifest")
		return
	}
	file := hctx.Append(nil, append([]hctx.Section{{Kind: hctx.KindManifest, Data: mb}}, sections...)...)
	s.snap.exports.Add(1)
	s.snap.bytesOut.Add(uint64(len(file)))
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType(SnapshotContentType)
	ctx.Response.Header.Set("Content-Disposition", `attachment; filename="session.hctx"`)
	ctx.SetBody(file)
}

// refuse answers a snapshot the caller must fix and counts it.
func (s *Server) refuseSnapshot(ctx *fasthttp.RequestCtx, status int, code, msg string) {
	s.snap.refused.Add(1)
	writeError(ctx, status, typeInvalidRequest, code, msg)
}

func (s *Server) importSnapshot(ctx *fasthttp.RequestCtx, sm SnapshotMemory, tenant, id, user string) {
	body := ctx.Request.Body()
	sections, err := hctx.Parse(body)
	switch {
	case errors.Is(err, hctx.ErrVersion):
		s.refuseSnapshot(ctx, fasthttp.StatusBadRequest, "snapshot_version", err.Error())
		return
	case err != nil:
		s.refuseSnapshot(ctx, fasthttp.StatusBadRequest, "snapshot_corrupt", "the snapshot is damaged or truncated and was refused whole: "+err.Error())
		return
	}
	memSec, ok := hctx.Find(sections, hctx.KindMemory)
	if !ok {
		s.refuseSnapshot(ctx, fasthttp.StatusBadRequest, "snapshot_corrupt", "the snapshot holds no session memory")
		return
	}
	if _, err := sm.CheckSnapshot(memSec, user); err != nil {
		switch {
		case errors.Is(err, memory.ErrUserMismatch):
			s.refuseSnapshot(ctx, fasthttp.StatusForbidden, "user_mismatch", "the snapshot is of another end user's session: send it with that user's X-User-ID")
		case errors.Is(err, durable.ErrCorrupt) || errors.Is(err, memory.ErrInvalid):
			s.refuseSnapshot(ctx, fasthttp.StatusBadRequest, "snapshot_corrupt", "the snapshot's session memory is damaged or of a newer version: "+err.Error())
		default:
			s.snap.failed.Add(1)
			s.log.Error("snapshot check failed", "session", id, "err", err)
			writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "session store failed; see the sidecar's log")
		}
		return
	}
	res := snapshotResult{Object: "session.snapshot", ID: id}
	engSec, hasEngine := hctx.Find(sections, hctx.KindEngine)
	se, _ := s.opts.Engine.(SnapshotEngine)
	switch {
	case hasEngine && se != nil:
		if _, err := se.CheckStates(s.stopping, tenant, engSec); err != nil {
			s.engineRefusal(ctx, err)
			return
		}
	case hasEngine:
		res.Note = "this sidecar's engine connector keeps no KV states (--engine llamacpp does): the next turn recomputes the prompt"
	}
	// An existing session of the caller is replaced; another end user's
	// is not the caller's to overwrite.
	if sv, err := s.opts.Memory.Session(tenant, id); err == nil {
		if sv.User != user {
			s.refuseSnapshot(ctx, fasthttp.StatusConflict, "session_exists", fmt.Sprintf("session %q exists for another end user of this API key", id))
			return
		}
		if err := s.DeleteSession(s.stopping, tenant, id); err != nil && !errors.Is(err, memory.ErrNotFound) {
			s.snap.failed.Add(1)
			s.log.Error("snapshot import: replacing the session failed", "session", id, "err", err)
			writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "session store failed; see the sidecar's log")
			return
		}
		res.Replaced = true
	}
	mi, err := sm.ImportSession(s.stopping, tenant, id, user, memSec)
	switch {
	case errors.Is(err, memory.ErrExists):
		s.refuseSnapshot(ctx, fasthttp.StatusConflict, "session_exists", fmt.Sprintf("session %q was created meanwhile; retry to replace it", id))
		return
	case err != nil:
		s.snap.failed.Add(1)
		s.log.Error("snapshot import failed", "session", id, "err", err)
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "session store failed; see the sidecar's log")
		return
	}
	res.Memory = mi
	if hasEngine && se != nil {
		ei, err := se.ImportStates(s.stopping, tenant, id, engSec)
		if err != nil {
			// All or nothing: the session goes again.
			if derr := s.DeleteSession(context.WithoutCancel(s.stopping), tenant, id); derr != nil {
				s.log.Error("snapshot import: undoing the memory import failed", "session", id, "err", derr)
			}
			s.engineRefusal(ctx, err)
			return
		}
		res.Engine = &ei
		if ei.Skipped > 0 && res.Note == "" {
			res.Note = fmt.Sprintf("%d KV states were saved under another API key and cannot serve this one's prompts: the next turn recomputes the prompt", ei.Skipped)
		}
	}
	s.forgetWindow(tenant, id)
	s.snap.imports.Add(1)
	s.snap.bytesIn.Add(uint64(len(body)))
	writeJSON(ctx, fasthttp.StatusCreated, res)
}

// engineRefusal answers an error of the engine's check or import.
func (s *Server) engineRefusal(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case errors.Is(err, engine.ErrOtherModel):
		s.refuseSnapshot(ctx, fasthttp.StatusConflict, "snapshot_other_model",
			"the snapshot's KV states were saved by another model than the one this sidecar's engine runs: "+err.Error())
	case errors.Is(err, durable.ErrCorrupt):
		s.refuseSnapshot(ctx, fasthttp.StatusBadRequest, "snapshot_corrupt", "the snapshot's KV states are damaged: "+err.Error())
	case errors.Is(err, engine.ErrUnavailable):
		s.snap.failed.Add(1)
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUpstream, "engine_unavailable",
			"the engine could not be asked which model it runs, so the snapshot's KV states cannot be checked; retry once it is up")
		ctx.Response.Header.Set("Retry-After", "5")
	default:
		s.snap.failed.Add(1)
		s.log.Error("snapshot import of the engine states failed", "err", err)
		writeError(ctx, fasthttp.StatusInternalServerError, typeServer, "internal", "importing the KV states failed; see the sidecar's log")
	}
}

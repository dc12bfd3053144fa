package admin

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvsidecar/kvsidecar/memory"
)

// The console's memory routes (GET|POST /admin/v1/memories, PATCH|DELETE
// /admin/v1/memories/{id}, boost, batch-delete) and statistics by category
// with their CSV and JSON exports; routing and auth are in api.go.

// memoryRow is one memory as the console's table shows it.
type memoryRow struct {
	memory.Unit
	Session string     `json:"session"`
	Decay   *decayInfo `json:"decay,omitempty"`
}

// decayInfo says how a memory decays: its importance is multiplied by
// Factor every Period untouched; the next time is NextAt; an episode is
// deleted at ExpiresAt unless touched before.
type decayInfo struct {
	Factor      float64    `json:"factor"`
	PeriodHours float64    `json:"period_hours"`
	NextAt      time.Time  `json:"next_at"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
}

func decayOf(u *memory.Unit) *decayInfo {
	switch u.Category {
	case memory.CategoryFact:
		return &decayInfo{Factor: memory.FactDecay, PeriodHours: memory.FactDecayPeriod.Hours(), NextAt: u.DecayedAt.Add(memory.FactDecayPeriod)}
	case memory.CategoryEpisode:
		exp := u.TouchedAt.Add(memory.EpisodeTTL)
		return &decayInfo{Factor: memory.EpisodeDecay, PeriodHours: memory.EpisodeDecayPeriod.Hours(), NextAt: u.DecayedAt.Add(memory.EpisodeDecayPeriod), ExpiresAt: &exp}
	}
	return nil
}

// scopeMemories returns the categorized memories of ?session= or of every
// session of ?user= (at most adminMaxSessions, newest first).
func (a *adminReq) scopeMemories() ([]memoryRow, bool) {
	st := a.s.opts.Memory
	var ids []string
	if id := string(a.q.Peek("session")); id != "" {
		if a.sessionParam(); a.done {
			return nil, false
		}
		ids = []string{id}
	} else {
		user, ok := a.user()
		if !ok {
			return nil, false
		}
		if user == nil {
			a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "missing_scope", "name a session (?session=) or a user (?user=, empty for the tenant's default user)")
			return nil, false
		}
		ss, err := st.Sessions(a.tenantV, user, adminMaxSessions)
		if err != nil {
			a.storeErr(err)
			return nil, false
		}
		for _, x := range ss {
			ids = append(ids, x.ID)
		}
	}
	rows := []memoryRow{}
	for _, id := range ids {
		mv, err := st.Memory(a.tenantV, id)
		if errors.Is(err, memory.ErrNotFound) && len(ids) > 1 {
			continue // deleted meanwhile
		}
		if err != nil {
			a.storeErr(err)
			return nil, false
		}
		for i := range mv.Units {
			u := &mv.Units[i]
			if u.Category == "" {
				continue // the conversation record, not a memory
			}
			rows = append(rows, memoryRow{Unit: *u, Session: id, Decay: decayOf(u)})
		}
	}
	return rows, true
}

func (a *adminReq) memories() {
	if a.done {
		return
	}
	if a.ctx.IsPost() {
		a.addMemory()
		return
	}
	rows, ok := a.scopeMemories()
	if !ok {
		return
	}
	switch f := string(a.q.Peek("format")); f {
	case "":
		a.ok(fasthttp.StatusOK, list(rows))
	case "json":
		a.download("memories.json", "application/json", mustJSON(rows))
	case "csv":
		recs := [][]string{{"session", "id", "category", "importance", "tokens", "review", "created_at", "updated_at", "touched_at", "access_count", "content"}}
		for _, r := range rows {
			recs = append(recs, []string{r.Session, r.ID, string(r.Category), fmtFloat(r.Importance), strconv.Itoa(r.Tokens), r.Review,
				fmtTime(r.CreatedAt), fmtTime(r.UpdatedAt), fmtTime(r.TouchedAt), strconv.Itoa(r.AccessCount), r.Content})
		}
		a.download("memories.csv", "text/csv; charset=utf-8", csvBytes(recs))
	default:
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_format", "format: want csv or json")
	}
}

type memoryWrite struct {
	Category   *string  `json:"category"`
	Text       *string  `json:"text"`
	Importance *float64 `json:"importance"`
}

func (a *adminReq) addMemory() {
	if a.sessionParam(); a.done {
		return
	}
	var w memoryWrite
	if !a.decode(&w) {
		return
	}
	if w.Category == nil || w.Text == nil {
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_memory", `body must be {"category": "system|core|fact|episode", "text": "…", "importance": n}`)
		return
	}
	c, err := memory.ParseCategory(*w.Category)
	if err != nil {
		a.storeErr(err)
		return
	}
	imp := 0.0
	if w.Importance != nil {
		imp = *w.Importance
		if imp < 0 || imp > 100 {
			a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_memory", "importance must be within 0..100 (0: the default, 1)")
			return
		}
	}
	u, err := a.s.opts.Memory.AddMemory(a.tenantV, a.session, c, *w.Text, imp)
	if err != nil {
		a.storeErr(err)
		return
	}
	a.s.log.Info("admin: memory added", "tenant", a.tenantV, "session", a.session, "id", u.ID, "category", string(c))
	a.ok(fasthttp.StatusCreated, memoryRow{Unit: u, Session: a.session, Decay: decayOf(&u)})
}

func (a *adminReq) memoryUnit(id string) {
	if a.done {
		return
	}
	st := a.s.opts.Memory
	if a.ctx.IsDelete() {
		if err := st.DeleteMemory(a.tenantV, a.session, id); err != nil {
			a.storeErr(err)
			return
		}
		a.s.log.Info("admin: memory deleted", "tenant", a.tenantV, "session", a.session, "id", id)
		a.ok(fasthttp.StatusOK, map[string]any{"id": id, "object": "memory.deleted", "deleted": true})
		return
	}
	var w memoryWrite
	if !a.decode(&w) {
		return
	}
	var e memory.MemoryEdit
	e.Text, e.Importance = w.Text, w.Importance
	if w.Category != nil {
		c, err := memory.ParseCategory(*w.Category)
		if err != nil {
			a.storeErr(err)
			return
		}
		e.Category = &c
	}
	if e.Text == nil && e.Category == nil && e.Importance == nil {
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_memory", `body must change at least one of "text", "category", "importance"`)
		return
	}
	u, err := st.UpdateMemory(a.tenantV, a.session, id, e)
	if err != nil {
		a.storeErr(err)
		return
	}
	a.s.log.Info("admin: memory edited", "tenant", a.tenantV, "session", a.session, "id", id)
	a.ok(fasthttp.StatusOK, memoryRow{Unit: u, Session: a.session, Decay: decayOf(&u)})
}

func (a *adminReq) boost(id string) {
	if a.done {
		return
	}
	imp, err := a.s.opts.Memory.Boost(a.tenantV, a.session, id)
	if err != nil {
		a.storeErr(err)
		return
	}
	a.ok(fasthttp.StatusOK, map[string]any{"id": id, "importance": imp})
}

// skippedID is an id a batch delete left alone, and why.
type skippedID struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

// batchDelete deletes the memories named in {"ids":[…]} from one session,
// skipping pinned ones (core and system: always injected, so deleting them
// takes a deliberate single delete) and naming the ids it does not know.
func (a *adminReq) batchDelete() {
	if a.done {
		return
	}
	var body struct {
		IDs []string `json:"ids"`
	}
	if !a.decode(&body) {
		return
	}
	if len(body.IDs) == 0 || len(body.IDs) > adminMaxBatch {
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_ids", fmt.Sprintf(`body must be {"ids": [1..%d memory ids]}`, adminMaxBatch))
		return
	}
	st := a.s.opts.Memory
	mv, err := st.Memory(a.tenantV, a.session)
	if err != nil {
		a.storeErr(err)
		return
	}
	units := make(map[string]*memory.Unit, len(mv.Units))
	for i := range mv.Units {
		units[mv.Units[i].ID] = &mv.Units[i]
	}
	deleted, skipped, missing := []string{}, []skippedID{}, []string{}
	seen := map[string]bool{}
	for _, id := range body.IDs {
		id = strings.TrimSpace(id)
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		u := units[id]
		switch {
		case u == nil:
			missing = append(missing, id)
			continue
		case u.Category == memory.CategoryCore || u.Category == memory.CategorySystem:
			skipped = append(skipped, skippedID{id, string(u.Category)})
			continue
		case u.Category == "":
			skipped = append(skipped, skippedID{id, "conversation"})
			continue
		}
		switch err := st.DeleteMemory(a.tenantV, a.session, id); {
		case err == nil:
			deleted = append(deleted, id)
		case errors.Is(err, memory.ErrNotFound):
			missing = append(missing, id)
		default:
			a.storeErr(err)
			return
		}
	}
	a.s.log.Info("admin: memories batch-deleted", "tenant", a.tenantV, "session", a.session, "deleted", len(deleted), "skipped", len(skipped), "not_found", len(missing))
	a.ok(fasthttp.StatusOK, map[string]any{"object": "memory.batch_deleted", "deleted": deleted, "skipped": skipped, "not_found": missing})
}

// categoryStats are the statistics of one category in a scope.
type categoryStats struct {
	Category       string  `json:"category"`
	Count          int     `json:"count"`
	Tokens         int     `json:"tokens"`
	MeanImportance float64 `json:"mean_importance"`
	MinImportance  float64 `json:"min_importance"`
	MaxImportance  float64 `json:"max_importance"`
	Promote        int     `json:"review_promote"`
	Decay          int     `json:"review_decay"`
	Expire         int     `json:"review_expire"`
	Accesses       int     `json:"accesses"`
}

var categoryOrder = []memory.Category{memory.CategorySystem, memory.CategoryCore, memory.CategoryFact, memory.CategoryEpisode}

func statsByCategory(rows []memoryRow) []categoryStats {
	out := make([]categoryStats, len(categoryOrder))
	for i, c := range categoryOrder {
		out[i].Category = string(c)
	}
	for _, r := range rows {
		i := slices.Index(categoryOrder, r.Category)
		if i < 0 {
			continue
		}
		cs := &out[i]
		if cs.Count == 0 || r.Importance < cs.MinImportance {
			cs.MinImportance = r.Importance
		}
		cs.MaxImportance = max(cs.MaxImportance, r.Importance)
		cs.Count++
		cs.Tokens += r.Tokens
		cs.MeanImportance += r.Importance
		cs.Accesses += r.AccessCount
		switch r.Review {
		case "promote":
			cs.Promote++
		case "decay":
			cs.Decay++
		case "expire":
			cs.Expire++
		}
	}
	for i := range out {
		if out[i].Count > 0 {
			out[i].MeanImportance = math.Round(out[i].MeanImportance/float64(out[i].Count)*1e4) / 1e4
		}
	}
	return out
}

func (a *adminReq) stats() {
	if a.done {
		return
	}
	rows, ok := a.scopeMemories()
	if !ok {
		return
	}
	cs := statsByCategory(rows)
	switch f := string(a.q.Peek("format")); f {
	case "":
		a.ok(fasthttp.StatusOK, list(cs))
	case "json":
		a.download("memory-stats.json", "application/json", mustJSON(cs))
	case "csv":
		recs := [][]string{{"category", "count", "tokens", "mean_importance", "min_importance", "max_importance", "review_promote", "review_decay", "review_expire", "accesses"}}
		for _, c := range cs {
			recs = append(recs, []string{c.Category, strconv.Itoa(c.Count), strconv.Itoa(c.Tokens), fmtFloat(c.MeanImportance),
				fmtFloat(c.MinImportance), fmtFloat(c.MaxImportance), strconv.Itoa(c.Promote), strconv.Itoa(c.Decay), strconv.Itoa(c.Expire), strconv.Itoa(c.Accesses)})
		}
		a.download("memory-stats.csv", "text/csv; charset=utf-8", csvBytes(recs))
	default:
		a.fail(fasthttp.StatusBadRequest, typeInvalidRequest, "invalid_format", "format: want csv or json")
	}
}

// download answers an attachment.
func (a *adminReq) download(name, ct string, b []byte) {
	if a.done {
		return
	}
	a.ctx.SetStatusCode(fasthttp.StatusOK)
	a.ctx.SetContentType(ct)
	a.ctx.Response.Header.Set("Content-Disposition", `attachment; filename="`+name+`"`)
	a.ctx.SetBody(b)
	a.done = true
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil { // unreachable: plain values
		return []byte("null")
	}
	return append(b, '\n')
}

// csvBytes writes records as CSV. A cell a spreadsheet would run as a
// formula (starting with = + - @ or a tab or CR) gets a leading quote.
func csvBytes(recs [][]string) []byte {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	for _, r := range recs {
		for i, c := range r {
			if c != "" && strings.ContainsRune("=+-@\t\r", rune(c[0])) {
				if _, err := strconv.ParseFloat(c, 64); err != nil {
					r[i] = "'" + c
				}
			}
		}
		_ = w.Write(r) // a bytes.Buffer does not fail
	}
	w.Flush()
	return buf.Bytes()
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

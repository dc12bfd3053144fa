package memory

import (
	"context"
	"encoding/json"
	"time"
)

// SessionView is a session's history for GET /v1/sessions/{id}. It is a
// copy; the caller owns it.
type SessionView struct {
	ID string `json:"id"`
	// User is the end user the session belongs to ("" when none was
	// named).
	User      string        `json:"user,omitempty"`
	CreatedAt time.Time     `json:"created_at"`
	UpdatedAt time.Time     `json:"updated_at"`
	Model     string        `json:"model,omitempty"`
	Encoding  string        `json:"encoding"`
	Messages  []MessageView `json:"messages"`
	// Tokens is the cost of every stored message (system included);
	// FocusTokens of those still in the window.
	Tokens      int `json:"tokens"`
	FocusTokens int `json:"focus_tokens"`
	Units       int `json:"units"`
	Summaries   int `json:"summaries"`
}

// MessageView is one stored message.
type MessageView struct {
	Seq     uint64 `json:"seq"`
	Role    string `json:"role"`
	Content string `json:"content"`
	Tokens  int    `json:"tokens"`
	// Tier is focus while the message is in the window, else its unit's
	// tier (working or archive).
	Tier      Place           `json:"tier"`
	System    bool            `json:"system,omitempty"`
	Partial   bool            `json:"partial,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	Message   json.RawMessage `json:"message"`
}

// MemoryView is a session's memory units for GET /v1/sessions/{id}/memory,
// sorted by id. A copy; the caller owns it.
type MemoryView struct {
	ID      string `json:"id"`
	Units   []Unit `json:"units"`
	Focus   int    `json:"focus"` // messages in the window
	Working int    `json:"working"`
	Archive int    `json:"archive"`
}

// Session returns the tenant's session. Unknown sessions and sessions of
// other tenants are ErrNotFound.
func (s *Store) Session(tenant, sessionID string) (SessionView, error) {
	if err := s.syncView(tenant, sessionID); err != nil {
		return SessionView{}, err
	}
	sess, err := s.reg.session(tenant, sessionID, false)
	if err != nil {
		return SessionView{}, err
	}
	defer s.reg.unpin(sess)
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if !sess.exists {
		return SessionView{}, ErrNotFound
	}
	enc := sess.lastEnc
	v := SessionView{ID: sess.id, User: sess.user, CreatedAt: sess.created, UpdatedAt: sess.updated, Model: sess.lastModel,
		Encoding: enc.String(), Units: len(sess.units)}
	for _, u := range sess.units {
		if u.Type == UnitSummary {
			v.Summaries++
		}
	}
	add := func(e *entry, system bool) {
		c := e.cost(s.tok, enc)
		tier := PlaceFocus
		if e.dropped {
			tier = PlaceWorking
			if u := sess.units[msgUnitID(e.seq)]; u != nil {
				tier = u.Tier
			}
		} else {
			v.FocusTokens += c
		}
		v.Tokens += c
		v.Messages = append(v.Messages, MessageView{Seq: e.seq, Role: e.msg.Role, Content: e.msg.Content, Tokens: c,
			Tier: tier, System: system, Partial: e.partial, CreatedAt: e.at, Message: e.msg.Raw})
	}
	for _, e := range sess.sys {
		add(e, true)
	}
	for _, e := range sess.hist {
		add(e, false)
	}
	return v, nil
}

// Memory returns the tenant's session memory units. Unknown sessions and
// sessions of other tenants are ErrNotFound.
func (s *Store) Memory(tenant, sessionID string) (MemoryView, error) {
	if err := s.syncView(tenant, sessionID); err != nil {
		return MemoryView{}, err
	}
	sess, err := s.reg.session(tenant, sessionID, false)
	if err != nil {
		return MemoryView{}, err
	}
	defer s.reg.unpin(sess)
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if !sess.exists {
		return MemoryView{}, ErrNotFound
	}
	v := MemoryView{ID: sess.id, Units: []Unit{}}
	for _, u := range sess.sortedUnits() {
		v.Units = append(v.Units, u.clone())
		switch u.Tier {
		case PlaceWorking:
			v.Working++
		case PlaceArchive:
			v.Archive++
		}
	}
	v.Focus = len(sess.sys)
	for _, e := range sess.hist {
		if !e.dropped {
			v.Focus++
		}
	}
	return v, nil
}

// syncView brings a session up to date from a fleet's shared log (when
// there is one) before it is shown, so any replica shows the same session.
func (s *Store) syncView(tenant, sessionID string) error {
	if s.opts.SharedLog == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.SharedLogTimeout)
	defer cancel()
	return s.Sync(ctx, tenant, sessionID)
}

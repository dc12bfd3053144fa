package memory

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// MaxRecallQueryBytes bounds the query of Store.Recall.
const MaxRecallQueryBytes = 4096

// RecalledMemory is one memory Store.Recall found. A copy; the caller owns
// it.
type RecalledMemory struct {
	// ID names the memory: a unit id of the session ("m12", "f3", …), or
	// "<session hash>|<role>|<unit id>" for a memory of another session of
	// the same end user.
	ID string `json:"id"`
	// Role is who said it ("user", "assistant") or what it is ("fact",
	// "episode", "summary", …); may be empty for an unlabelled document.
	Role string `json:"role"`
	// Text is the memory's current text.
	Text string `json:"text"`
	// At is when it was said or learned; zero when unknown.
	At time.Time `json:"date,omitzero"`
	// OtherSession is set for a memory of another session of the user.
	OtherSession bool `json:"other_session,omitempty"`
}

// RecallResult is what Store.Recall answers.
type RecallResult struct {
	// Mode is "full" (the working memory ran a full retrieval: first
	// recall, a topic switch, or an expired active set), "reuse" (the
	// light probe found the active topic and the previous set was shown
	// again, rebuilt from current memory, with the probe's hits) or
	// "none" (nothing matched).
	Mode string `json:"mode"`
	// Memories are best first; those that do not pass the recall gate
	// are left out, as they are from the recall block.
	Memories []RecalledMemory `json:"memories"`
}

// Recall runs the session's working-memory gated recall for query without
// building a window: the same choice Prepare makes for the recall block
// (recallLocked), over the session's own memory and, for a session of a
// named end user, the user's other sessions. Pinned memories (core,
// system), which every window shows anyway, are not recalled.
//
// The session must exist under tenant and belong to user: a session of
// another tenant, or of another end user ("" included: a session without
// an end user is private to the callers that name none), is ErrNotFound,
// indistinguishable from a missing one. An empty or blank query, or one
// longer than MaxRecallQueryBytes, is ErrInvalid.
//
// Recall writes nothing: it changes only the session's working memory
// (the active set and its links, in memory), exactly as a turn's recall
// does, so a recall on the active topic is answered by a reuse and counts
// in Stats.FullRecalls or Stats.ProbeReuses like one. Access counts are
// not touched.
func (s *Store) Recall(ctx context.Context, tenant, sessionID, user, query string) (RecallResult, error) {
	if sessionID == "" {
		return RecallResult{}, fmt.Errorf("%w: empty session id", ErrInvalid)
	}
	if strings.TrimSpace(query) == "" {
		return RecallResult{}, fmt.Errorf("%w: empty query", ErrInvalid)
	}
	if len(query) > MaxRecallQueryBytes {
		return RecallResult{}, fmt.Errorf("%w: query is %d bytes; at most %d allowed", ErrInvalid, len(query), MaxRecallQueryBytes)
	}
	ctx, stop := s.withStore(ctx)
	defer stop()
	if err := s.syncView(tenant, sessionID); err != nil {
		return RecallResult{}, err
	}
	for attempt := 0; ; attempt++ {
		sess, err := s.reg.session(tenant, sessionID, false)
		if err != nil {
			return RecallResult{}, err
		}
		defer s.reg.unpin(sess) // at most one per attempt
		sess.mu.Lock()
		owner, exists := sess.user, sess.exists
		sess.mu.Unlock()
		if !exists || owner != user {
			return RecallResult{}, fmt.Errorf("%w: %q", ErrNotFound, sessionID)
		}
		// The user's index loads before the session is locked (userFor).
		um := s.users.userFor(sess, user)
		sess.mu.Lock()
		if sess.gone.Load() {
			sess.mu.Unlock()
			if attempt < 3 {
				continue
			}
			return RecallResult{}, fmt.Errorf("memory: session %q keeps vanishing: %w", sessionID, ErrNotFound)
		}
		items, mode := s.recall.recallLocked(ctx, sess, um, recallQuery{text: query, focus: query, window: true}, s.opts.Clock.Now(), nil)
		res := RecallResult{Mode: mode, Memories: make([]RecalledMemory, 0, len(items))}
		for _, it := range items {
			res.Memories = append(res.Memories, RecalledMemory{ID: it.id, Role: it.role, Text: it.text, At: it.at, OtherSession: it.cross})
		}
		sess.mu.Unlock()
		if res.Mode == "" {
			res.Mode = "none"
		}
		return res, nil
	}
}

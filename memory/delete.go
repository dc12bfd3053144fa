package memory

import (
	"context"
	"errors"
	"fmt"
)

// Delete removes a session: its log (messages and units) and its state.
// Unknown sessions and sessions of other tenants are ErrNotFound. The
// caller removes the session's KV blocks.
func (s *Store) Delete(tenant, sessionID string) error {
	var sharedErr error
	if s.opts.SharedLog != nil {
		// The shared copy first: a session deleted here must not come back
		// from another replica. One that exists only there is deleted too.
		ctx, cancel := context.WithTimeout(s.ctx, s.opts.SharedLogTimeout)
		recs, err := s.opts.SharedLog.Records(ctx, tenant, sessionID, 0)
		live := len(recs) > 0 && !isGone(recs[len(recs)-1])
		if err == nil && live {
			// A tombstone, not an empty list: replicas holding a copy
			// delete theirs instead of uploading it back.
			err = s.opts.SharedLog.Replace(ctx, tenant, sessionID, [][]byte{goneRecord})
		}
		cancel()
		if err != nil {
			return fmt.Errorf("memory: delete from the shared log: %w", err)
		}
		if !live {
			sharedErr = fmt.Errorf("%w: %q", ErrNotFound, sessionID)
		}
	}
	sess, err := s.reg.session(tenant, sessionID, false)
	if errors.Is(err, ErrNotFound) && s.opts.SharedLog != nil && sharedErr == nil {
		return nil // it lived only in the shared log
	}
	if err != nil {
		return err
	}
	defer s.reg.unpin(sess)
	um := s.users.userFor(sess, "")
	defer s.recall.dropUserDocs(um, userDocPrefix(sess))
	sess.mu.Lock()
	if !sess.exists {
		sess.mu.Unlock()
		if s.opts.SharedLog != nil && sharedErr == nil {
			return nil // already removed here by the tombstone (userFor synced it)
		}
		return fmt.Errorf("%w: %q", ErrNotFound, sessionID)
	}
	err = s.jrn.removeLocked(sess, s.opts.Fsync != FsyncNever)
	sess.mu.Unlock()
	s.reg.mu.Lock()
	s.reg.dropSessionLocked(sess)
	s.reg.mu.Unlock()
	return err
}

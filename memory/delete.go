package memory

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kvsidecar/kvsidecar/internal/durable"
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
	sess, err := s.session(tenant, sessionID, false)
	if errors.Is(err, ErrNotFound) && s.opts.SharedLog != nil && sharedErr == nil {
		return nil // it lived only in the shared log
	}
	if err != nil {
		return err
	}
	defer s.unpin(sess)
	um := s.userFor(sess, "")
	defer s.recall.dropUserDocs(um, userDocPrefix(sess))
	sess.mu.Lock()
	if !sess.exists {
		sess.mu.Unlock()
		if s.opts.SharedLog != nil && sharedErr == nil {
			return nil // already removed here by the tombstone (userFor synced it)
		}
		return fmt.Errorf("%w: %q", ErrNotFound, sessionID)
	}
	err = s.removeLocked(sess, s.opts.Fsync != FsyncNever)
	sess.mu.Unlock()
	s.mu.Lock()
	s.dropSessionLocked(sess)
	s.mu.Unlock()
	return err
}

// removeLocked deletes a loaded session's files and state (fsyncing its
// folder when sync) and marks it gone. Called with sess.mu held; the caller
// drops it from s.sessions.
func (s *Store) removeLocked(sess *session, sync bool) error {
	sess.gone.Store(true)
	sess.exists = false
	var errs []error
	if sess.log != nil {
		errs = append(errs, sess.log.Close())
		sess.log = nil
	}
	if err := os.Remove(indexPath(sess)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("memory: remove index: %w", err))
	}
	if err := os.Remove(sess.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("memory: remove log: %w", err))
	} else if sync {
		errs = append(errs, durable.SyncDir(filepath.Dir(sess.path)))
	}
	if sess.pending != nil {
		close(sess.pending)
		sess.pending = nil
	}
	sess.reset()
	return errors.Join(errs...)
}

package memory

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/retention"
)

// Retention: package memory/internal/retention sweeps Options.Dir in its
// own goroutine (its doc says what it deletes and when); the Store deletes
// the sessions it names (removeSessionFile).

// idleSweepEvery is the sweep's period without SessionTTL and
// MaxDiskBytes: the sweep then only deletes leftovers and measures the
// disk, and its walk of Dir is linear in the sessions stored.
const idleSweepEvery = time.Hour

// sweepPeriod is the retention sweep's period for o.
func sweepPeriod(o *StorageOptions) time.Duration {
	if o.SessionTTL == 0 && o.MaxDiskBytes == 0 {
		return max(o.SweepEvery, idleSweepEvery)
	}
	return o.SweepEvery
}

func newSweeper(s *Store) *retention.Sweeper {
	o := &s.opts.Storage
	return retention.Start(retention.Options{Dir: s.opts.Dir, Quarantine: filepath.Base(s.j.Quarantine()),
		SessionTTL: o.SessionTTL, MaxDiskBytes: o.MaxDiskBytes, QuarantineTTL: o.QuarantineTTL, Shared: o.Shared,
		Every: sweepPeriod(o), IndexGrace: o.SweepEvery, Now: s.opts.Clock.Now, Remove: s.removeSessionFile})
}

// removeSessionFile deletes the session whose log is at path: directly
// when it is not loaded (holding s.mu, so nobody loads it meanwhile),
// through its lock when it is. It reports whether the session is gone.
func (s *Store) removeSessionFile(path string) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	if s.byPath == nil || s.byPathGen != s.sessGen {
		s.byPath = make(map[string]*session, len(s.sessions))
		for _, sess := range s.sessions {
			s.byPath[sess.path] = sess
		}
		s.byPathGen = s.sessGen
	}
	sess := s.byPath[path]
	if sess == nil || s.sessions[sess.key] != sess {
		idx := strings.TrimSuffix(path, ".log") + ".idx"
		err := os.Remove(path)
		s.mu.Unlock()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false
		}
		os.Remove(idx)
		s.forgetSessionDocs(path)
		return true
	}
	s.mu.Unlock()
	if !sess.mu.TryLock() {
		return false
	}
	busy := sess.pending != nil || sess.summarizing || sess.extracting
	if busy {
		sess.mu.Unlock()
		return false
	}
	if err := s.jrn.removeLocked(sess, false); err != nil {
		s.opts.Logger.Warn("memory: retention: delete session", "err", err)
	}
	sess.mu.Unlock()
	s.mu.Lock()
	s.dropSessionLocked(sess)
	s.mu.Unlock()
	s.forgetSessionDocs(path)
	return true
}

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
		Every: sweepPeriod(o), IndexGrace: o.SweepEvery, Now: s.opts.Clock.Now, Remove: s.reg.removeSessionFile})
}

// removeSessionFile deletes the session whose log is at path: directly
// when it is not loaded (holding rg.mu, so nobody loads it meanwhile),
// through its lock when it is. It reports whether the session is gone.
func (rg *registry) removeSessionFile(path string) bool {
	rg.mu.Lock()
	if rg.closed {
		rg.mu.Unlock()
		return false
	}
	if rg.byPath == nil || rg.byPathGen != rg.sessGen {
		rg.byPath = make(map[string]*session, len(rg.sessions))
		for _, sess := range rg.sessions {
			rg.byPath[sess.path] = sess
		}
		rg.byPathGen = rg.sessGen
	}
	sess := rg.byPath[path]
	if sess == nil || rg.sessions[sess.key] != sess {
		idx := strings.TrimSuffix(path, ".log") + ".idx"
		err := os.Remove(path)
		rg.mu.Unlock()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false
		}
		os.Remove(idx)
		rg.forgetSessionDocs(path)
		return true
	}
	rg.mu.Unlock()
	if !sess.mu.TryLock() {
		return false
	}
	busy := sess.pending != nil || sess.summarizing || sess.extracting
	if busy {
		sess.mu.Unlock()
		return false
	}
	if err := rg.jrn.removeLocked(sess, false); err != nil {
		rg.opts.Logger.Warn("memory: retention: delete session", "err", err)
	}
	sess.mu.Unlock()
	rg.mu.Lock()
	rg.dropSessionLocked(sess)
	rg.mu.Unlock()
	rg.forgetSessionDocs(path)
	return true
}

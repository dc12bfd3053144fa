package memory

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// Retention. Nothing on disk is kept forever unless asked: the Store's
// retention goroutine sweeps Options.Dir every Storage.SweepEvery and
//
//   - deletes sessions (log and index) not written for Storage.SessionTTL;
//   - keeps the bytes under Dir plus Storage.Shared's (the KV archive)
//     under Storage.MaxDiskBytes: first the shared store is trimmed (it is a
//     cache that can be recomputed), then quarantined files are deleted
//     oldest first, then the least recently written sessions;
//   - deletes quarantined files older than Storage.QuarantineTTL,
//     temporary files of writes that never finished (an hour old), and
//     index files whose log is gone.
//
// Eviction is plain deletion, not quarantine, and need not be durable: a
// session that comes back after a crash is a valid session. A session with
// a turn in flight, or busy in another goroutine, is skipped until the next
// sweep. Pool logs are counted but never deleted. Usage between sweeps can
// exceed the budget by what is written in one period.

// sessionFile is one session log found by the sweep.
type sessionFile struct {
	log   string
	bytes int64 // log and index
	mtime time.Time
}

// agedFile is a file the sweep may delete by age.
type agedFile struct {
	path  string
	bytes int64
	mtime time.Time
}

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

// retention is the Store's retention goroutine, sweeping every period.
func (s *Store) retention(every time.Duration) {
	defer s.retentionWG.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep(s.opts.Clock.Now())
		}
	}
}

// sweep runs one retention pass at now.
func (s *Store) sweep(now time.Time) {
	o := &s.opts.Storage
	sessions, other, quarantined := s.scanDir(now)
	used := other
	for _, f := range sessions {
		used += f.bytes
	}
	for _, f := range quarantined {
		used += f.bytes
	}
	if o.SessionTTL > 0 {
		kept := sessions[:0]
		for _, f := range sessions {
			if now.Sub(f.mtime) > o.SessionTTL && s.removeSessionFile(f.log) {
				s.stats.sessionsExpired.Add(1)
				used -= f.bytes
				continue
			}
			kept = append(kept, f)
		}
		sessions = kept
	}
	// Quarantined files past their age.
	kept := quarantined[:0]
	for _, f := range quarantined {
		if now.Sub(f.mtime) > o.QuarantineTTL && os.Remove(f.path) == nil {
			s.stats.quarantineRemoved.Add(1)
			used -= f.bytes
			continue
		}
		kept = append(kept, f)
	}
	quarantined = kept
	var shared int64
	if o.Shared != nil {
		shared = o.Shared.DiskBytes()
	}
	if budget := o.MaxDiskBytes; budget > 0 && used+shared > budget {
		if shared > 0 {
			o.Shared.TrimDisk(max(0, budget-used))
			shared = o.Shared.DiskBytes()
			s.stats.sharedTrims.Add(1)
		}
		slices.SortFunc(quarantined, func(a, b agedFile) int { return a.mtime.Compare(b.mtime) })
		for _, f := range quarantined {
			if used+shared <= budget {
				break
			}
			if os.Remove(f.path) == nil {
				s.stats.quarantineRemoved.Add(1)
				used -= f.bytes
			}
		}
		slices.SortFunc(sessions, func(a, b sessionFile) int {
			if c := a.mtime.Compare(b.mtime); c != 0 {
				return c
			}
			return strings.Compare(a.log, b.log)
		})
		for _, f := range sessions {
			if used+shared <= budget {
				break
			}
			if s.removeSessionFile(f.log) {
				s.stats.sessionsEvicted.Add(1)
				used -= f.bytes
			}
		}
	}
	s.stats.diskBytes.Store(used)
	s.stats.sharedBytes.Store(shared)
}

// scanDir walks Options.Dir: session logs (with their index's bytes),
// other bytes (pool logs, files it does not know), quarantined files. On
// the way it deletes temporary files an hour old and index files whose
// log is gone for a sweep period.
func (s *Store) scanDir(now time.Time) (sessions []sessionFile, other int64, quarantined []agedFile) {
	root := s.opts.Dir
	stale := func(fi fs.FileInfo, age time.Duration) bool { return now.Sub(fi.ModTime()) > age }
	tenants, _ := os.ReadDir(root)
	for _, td := range tenants {
		if s.ctx.Err() != nil {
			break // closing: the next start sweeps again
		}
		dir := filepath.Join(root, td.Name())
		if td.Name() == filepath.Base(s.j.Quarantine()) {
			files, _ := os.ReadDir(dir)
			for _, f := range files {
				if fi, err := f.Info(); err == nil && fi.Mode().IsRegular() {
					quarantined = append(quarantined, agedFile{filepath.Join(dir, f.Name()), fi.Size(), fi.ModTime()})
				}
			}
			continue
		}
		if !td.IsDir() {
			if fi, err := td.Info(); err == nil {
				other += fi.Size()
			}
			continue
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			if !e.IsDir() {
				fi, err := e.Info()
				if err != nil {
					continue
				}
				if durable.IsTemp(e.Name()) && stale(fi, time.Hour) && os.Remove(p) == nil {
					continue
				}
				other += fi.Size()
				continue
			}
			files, _ := os.ReadDir(p)
			logs := map[string]int{} // base name → index in sessions
			var idx []fs.DirEntry
			for _, f := range files {
				fi, err := f.Info()
				if err != nil || !fi.Mode().IsRegular() {
					continue
				}
				name := f.Name()
				switch {
				case durable.IsTemp(name):
					if stale(fi, time.Hour) && os.Remove(filepath.Join(p, name)) == nil {
						continue
					}
					other += fi.Size()
				case strings.HasSuffix(name, ".log"):
					logs[strings.TrimSuffix(name, ".log")] = len(sessions)
					sessions = append(sessions, sessionFile{log: filepath.Join(p, name), bytes: fi.Size(), mtime: fi.ModTime()})
				case strings.HasSuffix(name, ".idx"):
					idx = append(idx, f)
				default:
					other += fi.Size()
				}
			}
			for _, f := range idx {
				fi, err := f.Info()
				if err != nil {
					continue
				}
				if i, ok := logs[strings.TrimSuffix(f.Name(), ".idx")]; ok {
					sessions[i].bytes += fi.Size()
					continue
				}
				if stale(fi, s.opts.Storage.SweepEvery) && os.Remove(filepath.Join(p, f.Name())) == nil {
					continue // an index whose log is gone
				}
				other += fi.Size()
			}
		}
	}
	return sessions, other, quarantined
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
	if err := s.removeLocked(sess, false); err != nil {
		s.opts.Logger.Warn("memory: retention: delete session", "err", err)
	}
	sess.mu.Unlock()
	s.mu.Lock()
	s.dropSessionLocked(sess)
	s.mu.Unlock()
	s.forgetSessionDocs(path)
	return true
}

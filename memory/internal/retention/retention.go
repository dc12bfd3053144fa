package retention

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// DiskUser is a store sharing the disk budget.
type DiskUser interface {
	// DiskBytes is what it holds on disk now.
	DiskBytes() int64
	// TrimDisk deletes what it holds (least valuable first) until it holds
	// at most max bytes, or nothing.
	TrimDisk(max int64)
}

// Options configure a Sweeper. Package memory fills them from its
// StorageOptions.
type Options struct {
	// Dir is memory's folder; Quarantine the name of its quarantine folder
	// in it.
	Dir, Quarantine string
	// SessionTTL (0: never), MaxDiskBytes (0: no bound), QuarantineTTL and
	// Shared as memory's StorageOptions say.
	SessionTTL    time.Duration
	MaxDiskBytes  int64
	QuarantineTTL time.Duration
	Shared        DiskUser
	// Every is the sweep's period; an index whose log is gone is deleted
	// once it is IndexGrace old.
	Every, IndexGrace time.Duration
	// Now is the clock.
	Now func() time.Time
	// Remove deletes the session whose log is at path and reports whether
	// it is gone (false: busy, try at the next sweep).
	Remove func(path string) bool
}

// Sweeper runs the retention sweep in a goroutine it owns.
type Sweeper struct {
	o    Options
	stop chan struct{}
	once sync.Once
	done chan struct{}

	sessionsExpired, sessionsEvicted atomic.Int64
	quarantineRemoved, sharedTrims   atomic.Int64
	diskBytes, sharedBytes           atomic.Int64
}

// Stats are the sweep's counters.
type Stats struct {
	SessionsExpired   int64 // sessions deleted by SessionTTL
	SessionsEvicted   int64 // sessions deleted to stay under MaxDiskBytes
	QuarantineRemoved int64 // quarantined files deleted (age or budget)
	SharedTrims       int64 // times the shared store was trimmed for the budget
	// DiskBytes and SharedDiskBytes are as of the last sweep.
	DiskBytes, SharedDiskBytes int64
}

// Stats returns the counters.
func (sw *Sweeper) Stats() Stats {
	return Stats{SessionsExpired: sw.sessionsExpired.Load(), SessionsEvicted: sw.sessionsEvicted.Load(),
		QuarantineRemoved: sw.quarantineRemoved.Load(), SharedTrims: sw.sharedTrims.Load(),
		DiskBytes: sw.diskBytes.Load(), SharedDiskBytes: sw.sharedBytes.Load()}
}

// Start starts the sweep's goroutine: a first sweep one period from now.
func Start(o Options) *Sweeper {
	sw := &Sweeper{o: o, stop: make(chan struct{}), done: make(chan struct{})}
	go sw.run()
	return sw
}

func (sw *Sweeper) run() {
	defer close(sw.done)
	t := time.NewTicker(sw.o.Every)
	defer t.Stop()
	for {
		select {
		case <-sw.stop:
			return
		case <-t.C:
			sw.Sweep(sw.o.Now())
		}
	}
}

// Stop ends the goroutine (a sweep in progress stops at its next tenant
// folder) and waits for it until ctx ends; it reports whether the goroutine
// ended. Safe to call more than once.
func (sw *Sweeper) Stop(ctx context.Context) bool {
	sw.once.Do(func() { close(sw.stop) })
	select {
	case <-sw.done:
		return true
	case <-ctx.Done():
		return false
	}
}

func (sw *Sweeper) stopping() bool {
	select {
	case <-sw.stop:
		return true
	default:
		return false
	}
}

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

// Sweep runs one retention pass at now.
func (sw *Sweeper) Sweep(now time.Time) {
	o := &sw.o
	sessions, other, quarantined := sw.scan(now)
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
			if now.Sub(f.mtime) > o.SessionTTL && o.Remove(f.log) {
				sw.sessionsExpired.Add(1)
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
			sw.quarantineRemoved.Add(1)
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
			sw.sharedTrims.Add(1)
		}
		slices.SortFunc(quarantined, func(a, b agedFile) int { return a.mtime.Compare(b.mtime) })
		for _, f := range quarantined {
			if used+shared <= budget {
				break
			}
			if os.Remove(f.path) == nil {
				sw.quarantineRemoved.Add(1)
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
			if o.Remove(f.log) {
				sw.sessionsEvicted.Add(1)
				used -= f.bytes
			}
		}
	}
	sw.diskBytes.Store(used)
	sw.sharedBytes.Store(shared)
}

// scan walks Options.Dir: session logs (with their index's bytes), other
// bytes (pool logs, files it does not know), quarantined files. On the way
// it deletes temporary files an hour old and index files whose log is gone
// for a sweep period.
func (sw *Sweeper) scan(now time.Time) (sessions []sessionFile, other int64, quarantined []agedFile) {
	root := sw.o.Dir
	stale := func(fi fs.FileInfo, age time.Duration) bool { return now.Sub(fi.ModTime()) > age }
	tenants, _ := os.ReadDir(root)
	for _, td := range tenants {
		if sw.stopping() {
			break // closing: the next start sweeps again
		}
		dir := filepath.Join(root, td.Name())
		if td.Name() == sw.o.Quarantine {
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
				if stale(fi, sw.o.IndexGrace) && os.Remove(filepath.Join(p, f.Name())) == nil {
					continue // an index whose log is gone
				}
				other += fi.Size()
			}
		}
	}
	return sessions, other, quarantined
}

package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
	"github.com/kvsidecar/kvsidecar/memory/internal/memerr"
)

// logID names a tenant's pool in the shared log: a session id no client
// can send (session ids are printable).
const logID = "\x00pool"

var errCorrupt = durable.NewCorrupt("memory: corrupt pool record")

// syncShared brings the pool up to date with a fleet's shared log, when
// there is one. Called with p.mu held.
func (ps *Pools) syncShared(p *pool) error {
	if ps.o.Shared == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ps.o.Context, ps.o.SharedTimeout)
	defer cancel()
	return ps.syncLocked(ctx, p)
}

// syncLocked brings the pool up to date with the shared log (as package
// memory does for a session). Called with p.mu held.
func (ps *Pools) syncLocked(ctx context.Context, p *pool) error {
	sh := ps.o.Shared
	n, err := sh.Len(ctx, p.tenant, logID)
	if err != nil {
		return fmt.Errorf("memory: shared pool log: %w", err)
	}
	switch {
	case p.sharedN == n:
		return nil
	case p.sharedN >= 0 && p.sharedN < n && p.log != nil:
		tail, err := sh.Records(ctx, p.tenant, logID, p.sharedN)
		if err != nil {
			return fmt.Errorf("memory: shared pool log: %w", err)
		}
		var framed []byte
		for _, b := range tail {
			var r record
			if json.Unmarshal(b, &r) != nil || r.K == "meta" {
				continue
			}
			p.apply(&r)
			ps.publishRecordLocked(p, &r) // another replica's write
			framed = durable.AppendRecord(framed, b)
		}
		if len(framed) > 0 {
			if err := p.log.Append(framed); err != nil {
				return err
			}
		}
		p.sharedN += int64(len(tail))
		ps.st.pulled.Add(int64(len(tail)))
		return nil
	case n == 0 || p.sharedN > n:
		var payloads [][]byte
		if p.log != nil {
			var err error
			if payloads, err = ps.o.Journal.Records(p.path); err != nil {
				return err
			}
		}
		if len(payloads) == 0 {
			p.sharedN = 0
			return nil
		}
		got, err := sh.Append(ctx, p.tenant, logID, 0, payloads)
		if err != nil {
			return fmt.Errorf("memory: upload the pool to the shared log: %w", err)
		}
		p.sharedN = got
		ps.st.uploads.Add(1)
		return nil
	default:
		all, err := sh.Records(ctx, p.tenant, logID, 0)
		if err != nil {
			return fmt.Errorf("memory: shared pool log: %w", err)
		}
		clear(p.entries)
		p.rev, p.records = 0, 0
		clear(p.views)
		p.resetSubsLocked() // what changed is not known event by event
		image := journal.Image()
		for _, b := range all {
			var r record
			if json.Unmarshal(b, &r) != nil {
				continue
			}
			if r.K == "meta" && r.Tenant != p.tenant {
				return fmt.Errorf("memory: shared pool log of another tenant: %w", errCorrupt)
			}
			p.apply(&r)
			image = durable.AppendRecord(image, b)
		}
		if p.log != nil {
			p.log.Close()
			p.log = nil
		}
		if err := durable.MkdirAll(filepath.Dir(p.path), 0o755); err != nil {
			return err
		}
		if err := durable.WriteFile(p.path, image); err != nil {
			return fmt.Errorf("memory: rebuild the pool from the shared log: %w", err)
		}
		lf, _, err := ps.o.Journal.Open(p.path, func([]byte) {})
		if err != nil {
			return err
		}
		p.log, p.sharedN = lf, int64(len(all))
		ps.st.rebuilds.Add(1)
		return nil
	}
}

// shareLocked writes framed pool records (with the meta record when the
// pool has no log yet) to the shared log at the pool's position. A
// conflict (another replica wrote the pool meanwhile) is returned wrapping
// memerr.ErrSharedConflict: the caller syncs and decides again.
func (ps *Pools) shareLocked(ctx context.Context, p *pool, meta, framed []byte) error {
	var payloads [][]byte
	if p.log == nil {
		payloads = append(payloads, meta)
	}
	durable.ScanRecords(framed, ps.o.Journal.MaxRecord(), func(_ int, b []byte) { payloads = append(payloads, b) })
	n, err := ps.o.Shared.Append(ctx, p.tenant, logID, p.sharedN, payloads)
	if err != nil {
		if errors.Is(err, memerr.ErrSharedConflict) {
			// The shared log only grew: the next sync takes its tail, as
			// for a session, without rebuilding the file.
			ps.st.sharedConflicts.Add(1)
		}
		return fmt.Errorf("memory: shared pool log: %w", err)
	}
	p.sharedN = n
	ps.st.pushed.Add(int64(len(payloads)))
	return nil
}

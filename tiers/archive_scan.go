package tiers

// Reading the Archive's files: the start-up scan that rebuilds the index
// from headers, whole-file reads checked end to end, and quarantine of any
// file that fails its checks (reported, never served, never fatal).

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"path"
	"strconv"
	"strings"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

func (a *Archive) scan() error {
	shards, err := a.fs.ReadDir(a.blocksDir)
	if err != nil {
		return fmt.Errorf("archive: scan %s: %w", a.blocksDir, err)
	}
	for _, sd := range shards {
		if !sd.IsDir() || len(sd.Name()) != 2 {
			continue
		}
		dir := path.Join(a.blocksDir, sd.Name())
		a.shards[dir] = true
		files, err := a.fs.ReadDir(dir)
		if err != nil {
			a.report(dir, fmt.Sprintf("unreadable shard folder: %v", err))
			continue
		}
		removed := false
		for _, f := range files {
			name := path.Join(dir, f.Name())
			switch {
			case durable.IsTemp(f.Name()):
				// A write that never reached its rename: never acknowledged.
				if err := a.fs.Remove(name); err == nil {
					removed = true
				}
			case strings.HasSuffix(f.Name(), ".kva"):
				a.load(name, strings.TrimSuffix(f.Name(), ".kva"))
			}
		}
		if removed {
			_ = a.fs.SyncDir(dir)
		}
	}
	return nil
}

// load indexes one block file found by scan, or quarantines it.
func (a *Archive) load(name, id string) {
	h, size, err := a.readHeader(name)
	if err == nil && fileID(h.key) != id {
		err = fmt.Errorf("%w: file name does not match its key", errFormat)
	}
	if err == nil && a.opts.VerifyOnOpen {
		_, err = a.readFile(name, h.key)
	}
	if err != nil {
		a.quarantine(name, err.Error())
		return
	}
	e := &archEntry{key: h.key, name: name, meta: h.meta, rawLen: int64(h.rawLen), fileSize: size, gen: a.seq.Add(1)}
	e.elem = a.lru.PushBack(e)
	a.idx[h.key] = e
	a.bytes += size
	a.raw += e.rawLen
	a.tokens += h.meta.Tokens
}

func (a *Archive) readHeader(name string) (*fileHeader, int64, error) {
	f, err := a.fs.Open(name)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	size := fi.Size()
	buf := make([]byte, min(size, maxHeaderLen))
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, 0, fmt.Errorf("%w: read header: %v", errFormat, err)
	}
	h, err := parseHeader(buf, uint64(a.opts.MaxBlockBytes))
	if err != nil {
		return nil, 0, err
	}
	if want := int64(h.headerLen) + int64(h.storedLen) + 4; want != size {
		return nil, 0, fmt.Errorf("%w: file of %d bytes, header says %d", errFormat, size, want)
	}
	return h, size, nil
}

// readFile reads and checks a whole file and decodes its payload.
// Errors wrapping errFormat mean corruption; others are I/O.
func (a *Archive) readFile(name, key string) (Value, error) {
	f, err := a.fs.Open(name)
	if err != nil {
		return Value{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Value{}, err
	}
	size := fi.Size()
	if size > a.opts.MaxBlockBytes+a.opts.MaxBlockBytes/8+maxHeaderLen+(1<<16) {
		return Value{}, fmt.Errorf("%w: file of %d bytes", errFormat, size)
	}
	buf := getBuf(int(size))[:size]
	defer putBuf(buf)
	if _, err := io.ReadFull(f, buf); err != nil {
		return Value{}, fmt.Errorf("%w: read: %v", errFormat, err)
	}
	return decodeFile(buf, key, uint64(a.opts.MaxBlockBytes))
}

// decodeFile checks and decodes a whole archive file. It never panics.
func decodeFile(buf []byte, key string, maxRaw uint64) (Value, error) {
	h, err := parseHeader(buf, maxRaw)
	if err != nil {
		return Value{}, err
	}
	if h.key != key {
		return Value{}, fmt.Errorf("%w: file holds another key", errFormat)
	}
	end := uint64(h.headerLen) + h.storedLen
	if uint64(len(buf)) != end+4 {
		return Value{}, fmt.Errorf("%w: file of %d bytes, header says %d", errFormat, len(buf), end+4)
	}
	if got, want := crc32.Checksum(buf[:end], castagnoli), binary.LittleEndian.Uint32(buf[end:]); got != want {
		return Value{}, fmt.Errorf("%w: crc %08x, want %08x", errFormat, got, want)
	}
	data, err := decodePayload(make([]byte, 0, h.rawLen), buf[h.headerLen:end], h)
	if err != nil {
		return Value{}, err
	}
	return Value{Meta: h.meta, Data: data}, nil
}

// report records a quarantined or skipped file.
func (a *Archive) report(file, reason string) {
	a.quarantined.Add(1)
	a.mu.Lock()
	a.reports = append(a.reports, Quarantine{File: file, Reason: reason, Time: a.opts.Clock.Now()})
	if len(a.reports) > 1000 {
		a.reports = a.reports[len(a.reports)-1000:]
	}
	a.mu.Unlock()
}

// quarantine moves a file out of blocks/ and reports it.
func (a *Archive) quarantine(name, reason string) {
	dst := path.Join(a.quarantineDir, path.Base(name)+"."+strconv.FormatInt(a.opts.Clock.Now().UnixNano(), 10))
	if err := a.fs.Rename(name, dst); err != nil {
		a.report(name, reason+" (not moved: "+err.Error()+")")
		return
	}
	_ = a.fs.SyncDir(path.Dir(name))
	_ = a.fs.SyncDir(a.quarantineDir)
	a.report(dst, reason)
}

// Quarantined returns the files quarantined since open (the last 1000).
func (a *Archive) Quarantined() []Quarantine {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Quarantine(nil), a.reports...)
}

package remote

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// A blob is stored as chunks of Options.ChunkBytes under keys named by a
// random generation, then a manifest under the blob's own key that names
// the generation and holds each chunk's CRC32C. The manifest is written
// last, with one SET: until then readers see the previous blob or none, so
// a half-written blob is never served. Replacing a blob gives the previous
// generation's chunks a short expiry (the longest a reader of them may
// take) once the new manifest is in place; a reader that still misses a
// chunk rereads the manifest.
//
// Manifest layout (big-endian): "KVRB", version 1, u64 generation, u64
// size, u32 chunk size, u32 chunk count, u32 aux length, aux, one u32
// CRC32C per chunk, then a u32 CRC32C of everything before it.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const (
	manifestMagic   = "KVRB"
	manifestVersion = 1
	// MaxAux bounds the metadata kept with a blob's manifest.
	MaxAux = 64 << 10
)

type manifest struct {
	gen   uint64
	size  int64
	chunk int
	aux   []byte
	crcs  []uint32
}

func (m *manifest) encode() []byte {
	b := make([]byte, 0, 4+1+8+8+4+4+4+len(m.aux)+4*len(m.crcs)+4)
	b = append(b, manifestMagic...)
	b = append(b, manifestVersion)
	b = binary.BigEndian.AppendUint64(b, m.gen)
	b = binary.BigEndian.AppendUint64(b, uint64(m.size))
	b = binary.BigEndian.AppendUint32(b, uint32(m.chunk))
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.crcs)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.aux)))
	b = append(b, m.aux...)
	for _, c := range m.crcs {
		b = binary.BigEndian.AppendUint32(b, c)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func parseManifest(b []byte) (*manifest, error) {
	const head = 4 + 1 + 8 + 8 + 4 + 4 + 4
	bad := func(why string) error { return fmt.Errorf("%w: manifest: %s", errCorrupt, why) }
	if len(b) < head+4 || string(b[:4]) != manifestMagic || b[4] != manifestVersion {
		return nil, bad("bad header")
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, bad("checksum mismatch")
	}
	m := &manifest{
		gen:   binary.BigEndian.Uint64(b[5:]),
		size:  int64(binary.BigEndian.Uint64(b[13:])),
		chunk: int(binary.BigEndian.Uint32(b[21:])),
	}
	n := int(binary.BigEndian.Uint32(b[25:]))
	naux := int(binary.BigEndian.Uint32(b[29:]))
	if naux > MaxAux || len(body) != head+naux+4*n {
		return nil, bad("bad lengths")
	}
	if m.chunk <= 0 || m.size < 0 || int64(n) != (m.size+int64(m.chunk)-1)/int64(m.chunk) {
		return nil, bad("chunk count does not match the size")
	}
	m.aux = append([]byte(nil), body[head:head+naux]...)
	for i := range n {
		m.crcs = append(m.crcs, binary.BigEndian.Uint32(body[head+naux+4*i:]))
	}
	return m, nil
}

// BlobInfo describes a stored blob.
type BlobInfo struct {
	// Size is the blob's length in bytes.
	Size int64
	// Aux is the metadata stored with it (at most MaxAux bytes).
	Aux []byte
}

// blobCtx bounds a transfer of n bytes: Timeout plus one second per chunk.
func (s *Store) blobCtx(ctx context.Context, n int64) (context.Context, context.CancelFunc) {
	chunks := n/int64(s.opts.ChunkBytes) + 1
	return context.WithTimeout(ctx, s.opts.Timeout+time.Duration(chunks)*time.Second)
}

// PutBlob stores data (and aux, small metadata kept in the manifest) as
// blob id of tenant, replacing any blob of that id. It returns after the
// store has every chunk and then the manifest (see Durability); on error
// the previous blob, if any, is still what readers get.
func (s *Store) PutBlob(ctx context.Context, tenant, id string, data, aux []byte) error {
	if err := checkToken("tenant", tenant); err != nil {
		return err
	}
	if err := checkToken("blob id", id); err != nil {
		return err
	}
	if len(aux) > MaxAux {
		return fmt.Errorf("remote: put blob %s: aux of %d bytes exceeds %d", id, len(aux), MaxAux)
	}
	ctx, cancel := s.blobCtx(ctx, int64(len(data)))
	defer cancel()
	mkey := s.manifestKey(tenant, id)
	m := &manifest{gen: rand.Uint64(), size: int64(len(data)), chunk: s.opts.ChunkBytes, aux: aux}
	// Chunks outlive the manifest by a minute, so a reader that got the
	// manifest just before it expired still finds them.
	chunkTTL := s.opts.TTL
	if chunkTTL > 0 {
		chunkTTL += time.Minute
	}
	p := s.c.Pipeline()
	for i, off := 0, 0; off < len(data); i, off = i+1, off+s.opts.ChunkBytes {
		c := data[off:min(len(data), off+s.opts.ChunkBytes)]
		m.crcs = append(m.crcs, crc32.Checksum(c, castagnoli))
		p.Set(ctx, chunkKey(mkey, m.gen, i), c, chunkTTL)
	}
	if p.Len() > 0 {
		if _, err := p.Exec(ctx); err != nil {
			s.deleteChunks(mkey, m)
			return fmt.Errorf("remote: put blob %s: chunks: %w", id, err)
		}
	}
	old, err := s.c.SetArgs(ctx, mkey, m.encode(), redis.SetArgs{Get: true, TTL: s.opts.TTL}).Bytes()
	if err != nil && !errors.Is(err, redis.Nil) {
		// The manifest may or may not be in place: keep the chunks, the
		// TTL (if any) collects them.
		return fmt.Errorf("remote: put blob %s: manifest: %w", id, err)
	}
	if om, perr := parseManifest(old); err == nil && perr == nil && om.gen != m.gen {
		s.retireChunks(mkey, om)
	}
	return nil
}

// retireChunks lets a replaced generation's chunks expire once every
// reader that may have read its manifest has timed out (the bound of a
// transfer of that size), so a read in progress completes.
func (s *Store) retireChunks(mkey string, m *manifest) {
	ctx, cancel := s.opCtx(context.Background())
	defer cancel()
	grace := s.opts.Timeout + time.Duration(len(m.crcs)+1)*time.Second
	p := s.c.Pipeline()
	for i := range m.crcs {
		p.PExpire(ctx, chunkKey(mkey, m.gen, i), grace)
	}
	if _, err := p.Exec(ctx); err != nil {
		s.opts.Logger.Debug("remote: retire old chunks", "key", mkey, "err", err)
	}
}

// deleteChunks removes a generation's chunks, best effort.
func (s *Store) deleteChunks(mkey string, m *manifest) {
	if len(m.crcs) == 0 {
		return
	}
	keys := make([]string, len(m.crcs))
	for i := range keys {
		keys[i] = chunkKey(mkey, m.gen, i)
	}
	ctx, cancel := s.opCtx(context.Background())
	defer cancel()
	if err := s.c.Del(ctx, keys...).Err(); err != nil {
		s.opts.Logger.Debug("remote: delete old chunks", "key", mkey, "err", err)
	}
}

func (s *Store) readManifest(ctx context.Context, mkey string) (*manifest, error) {
	b, err := s.c.Get(ctx, mkey).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	return parseManifest(b)
}

// StatBlob returns the blob's size and metadata without reading its
// chunks.
func (s *Store) StatBlob(ctx context.Context, tenant, id string) (BlobInfo, error) {
	if err := checkToken("tenant", tenant); err != nil {
		return BlobInfo{}, err
	}
	if err := checkToken("blob id", id); err != nil {
		return BlobInfo{}, err
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	m, err := s.readManifest(ctx, s.manifestKey(tenant, id))
	if err != nil {
		return BlobInfo{}, fmt.Errorf("remote: stat blob %s: %w", id, err)
	}
	return BlobInfo{Size: m.size, Aux: m.aux}, nil
}

// GetBlob returns the blob's bytes and metadata. Every chunk is checked
// against its CRC32C; a mismatch matches durable.ErrCorrupt, never served.
func (s *Store) GetBlob(ctx context.Context, tenant, id string) ([]byte, BlobInfo, error) {
	var buf []byte
	info, err := s.readBlob(ctx, tenant, id, func(m *manifest) { buf = make([]byte, 0, m.size) },
		func(c []byte) error { buf = append(buf, c...); return nil })
	if err != nil {
		return nil, BlobInfo{}, err
	}
	return buf, info, nil
}

// chunksPerRead is how many chunks one pipelined read fetches.
const chunksPerRead = 4

func (s *Store) readBlob(ctx context.Context, tenant, id string, start func(*manifest), emit func([]byte) error) (BlobInfo, error) {
	if err := checkToken("tenant", tenant); err != nil {
		return BlobInfo{}, err
	}
	if err := checkToken("blob id", id); err != nil {
		return BlobInfo{}, err
	}
	mkey := s.manifestKey(tenant, id)
	// A replacement can delete the chunks of the manifest just read: then
	// the manifest has changed, and reading again finds the new one. Only
	// before the first byte was emitted.
	for attempt := 0; ; attempt++ {
		mctx, cancel := s.opCtx(ctx)
		m, err := s.readManifest(mctx, mkey)
		cancel()
		if err != nil {
			return BlobInfo{}, fmt.Errorf("remote: get blob %s: %w", id, err)
		}
		start(m)
		emitted, err := s.readChunks(ctx, mkey, m, emit)
		if errors.Is(err, ErrNotFound) && !emitted && attempt < 2 {
			continue
		}
		if err != nil {
			return BlobInfo{}, fmt.Errorf("remote: get blob %s: %w", id, err)
		}
		return BlobInfo{Size: m.size, Aux: m.aux}, nil
	}
}

func (s *Store) readChunks(ctx context.Context, mkey string, m *manifest, emit func([]byte) error) (emitted bool, err error) {
	ctx, cancel := s.blobCtx(ctx, m.size)
	defer cancel()
	var got int64
	for first := 0; first < len(m.crcs); first += chunksPerRead {
		p := s.c.Pipeline()
		var cmds []*redis.StringCmd
		for i := first; i < min(len(m.crcs), first+chunksPerRead); i++ {
			cmds = append(cmds, p.Get(ctx, chunkKey(mkey, m.gen, i)))
		}
		if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return emitted, err
		}
		for j, cmd := range cmds {
			i := first + j
			c, err := cmd.Bytes()
			if errors.Is(err, redis.Nil) {
				return emitted, fmt.Errorf("chunk %d: %w", i, ErrNotFound)
			}
			if err != nil {
				return emitted, err
			}
			want := min(int64(m.chunk), m.size-got)
			if int64(len(c)) != want || crc32.Checksum(c, castagnoli) != m.crcs[i] {
				return emitted, fmt.Errorf("%w: chunk %d of %d bytes fails its checksum or size", errCorrupt, i, len(c))
			}
			if err := emit(c); err != nil {
				return true, err
			}
			emitted = true
			got += int64(len(c))
		}
	}
	return emitted, nil
}

// DeleteBlob removes the blob (its manifest first, so no reader starts on
// it, then its chunks). Deleting a missing blob is not an error.
func (s *Store) DeleteBlob(ctx context.Context, tenant, id string) error {
	if err := checkToken("tenant", tenant); err != nil {
		return err
	}
	if err := checkToken("blob id", id); err != nil {
		return err
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	mkey := s.manifestKey(tenant, id)
	old, err := s.c.GetDel(ctx, mkey).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remote: delete blob %s: %w", id, err)
	}
	if m, err := parseManifest(old); err == nil {
		s.deleteChunks(mkey, m)
	}
	return nil
}

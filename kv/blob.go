package kv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/tiers"
)

// Bounds of blob names. Any bytes are allowed: names never reach the file
// system (archive files are named by a hash).
const (
	MaxNamespaceLen = 256
	MaxBlobKeyLen   = 1024
)

// BlobMeta describes a blob of the KV HTTP API: the optional X-KV-Dtype
// and X-KV-Shape, and the size in bytes.
type BlobMeta struct {
	// DType is the element type; zero when the client gave none.
	DType tiers.DType
	// Shape is the dimensions; nil when the client gave none.
	Shape []int64
	// Size is the blob's length in bytes (set by the cache).
	Size int64
	// Aux is small opaque metadata of the caller kept beside the blob (at
	// most tiers.MaxAuxLen bytes; the Archive keeps it in the file's
	// header), so RangeBlobs can list what is stored without reading it.
	// The HTTP API sets none.
	Aux []byte
}

func blobKey(ns, key string) (string, error) {
	if len(ns) == 0 || len(ns) > MaxNamespaceLen {
		return "", fmt.Errorf("%w: namespace of %d bytes, want 1 to %d", ErrInvalid, len(ns), MaxNamespaceLen)
	}
	if len(key) == 0 || len(key) > MaxBlobKeyLen {
		return "", fmt.Errorf("%w: key of %d bytes, want 1 to %d", ErrInvalid, len(key), MaxBlobKeyLen)
	}
	b := make([]byte, 0, 1+binary.MaxVarintLen64+len(ns)+len(key))
	b = append(b, 'b')
	b = binary.AppendUvarint(b, uint64(len(ns)))
	b = append(b, ns...)
	b = append(b, key...)
	return string(b), nil
}

func (m *BlobMeta) validate(size int) error {
	if !m.DType.Valid() {
		return fmt.Errorf("%w: dtype %d", ErrInvalid, m.DType)
	}
	if len(m.Shape) > tiers.MaxShapeNd {
		return fmt.Errorf("%w: shape of %d dimensions, at most %d", ErrInvalid, len(m.Shape), tiers.MaxShapeNd)
	}
	if len(m.Shape) == 0 {
		return nil
	}
	// The element count is checked before each product, so it never wraps
	// (1<<40 × 1<<24 used to overflow to 0 and match an empty body).
	const maxElems = 1 << 50
	n := uint64(1)
	for _, d := range m.Shape {
		if d < 0 || d > 1<<40 {
			return fmt.Errorf("%w: dimension %d", ErrInvalid, d)
		}
		if d > 0 && n > maxElems/uint64(d) {
			return fmt.Errorf("%w: shape %v too large", ErrInvalid, m.Shape)
		}
		n *= uint64(d)
	}
	if m.DType != tiers.DTypeNone && n*uint64(m.DType.ElemSize()) != uint64(size) {
		return fmt.Errorf("%w: shape %v of %s is %d bytes, body has %d", ErrInvalid, m.Shape, m.DType, n*uint64(m.DType.ElemSize()), size)
	}
	return nil
}

// PutBlob stores data under namespace ns and key, replacing any older
// blob. It returns nil only once the blob is fsynced in the Archive, so an
// acknowledged PUT survives kill -9. data is copied; the caller may reuse
// it. Errors: ErrInvalid (bad name or metadata; shape and dtype, when both
// given, must match len(data)), ErrTooLarge, or an I/O error.
func (c *Cache) PutBlob(ns, key string, meta BlobMeta, data []byte) error {
	return c.PutBlobWith(ns, key, meta, data, PutBlobOptions{})
}

// PutBlobOptions qualify PutBlobWith. The zero value is PutBlob: durable,
// data copied.
type PutBlobOptions struct {
	// Cached returns once the blob is in a memory tier (Focus or Working;
	// a blob too large for both goes to the Archive at once). It is not
	// yet durable: PersistBlob writes it to the Archive, and otherwise it
	// reaches the Archive when it is demoted or when the cache closes.
	Cached bool
	// Owned hands data to the cache instead of copying it: the caller
	// must not modify it afterwards (GetBlob shares it with readers).
	Owned bool
}

// PutBlobWith is PutBlob qualified by o.
func (c *Cache) PutBlobWith(ns, key string, meta BlobMeta, data []byte, o PutBlobOptions) error {
	if c.closed.Load() {
		return ErrClosed
	}
	k, err := blobKey(ns, key)
	if err != nil {
		return fmt.Errorf("kv: put blob: %w", err)
	}
	if int64(len(data)) > c.opts.MaxBlobBytes {
		return fmt.Errorf("kv: put blob of %d bytes, at most %d: %w", len(data), c.opts.MaxBlobBytes, ErrTooLarge)
	}
	if err := meta.validate(len(data)); err != nil {
		return fmt.Errorf("kv: put blob: %w", err)
	}
	if !o.Owned {
		data = append([]byte(nil), data...)
	}
	v := tiers.Value{
		Meta: tiers.Meta{DType: meta.DType, Shape: append([]int64(nil), meta.Shape...), Aux: append([]byte(nil), meta.Aux...)},
		Data: data,
	}
	if err := c.store.Put(k, v, tiers.PutOptions{Durable: !o.Cached}); err != nil {
		if errors.Is(err, tiers.ErrTooLarge) {
			return fmt.Errorf("kv: put blob: %w: %w", ErrTooLarge, err)
		}
		return fmt.Errorf("kv: put blob: %w", err)
	}
	return nil
}

// PersistBlob writes a blob that PutBlobWith left only in memory to the
// Archive, fsynced (tiers.Store.Persist); a blob already there costs a
// lookup. A blob no longer stored is ErrNotFound.
func (c *Cache) PersistBlob(ns, key string) error {
	if c.closed.Load() {
		return ErrClosed
	}
	k, err := blobKey(ns, key)
	if err != nil {
		return fmt.Errorf("kv: persist blob: %w", err)
	}
	if err := c.store.Persist(k); err != nil {
		return blobError("persist", ns, key, err)
	}
	return nil
}

// StageBlob is PersistBlob without fsyncs (tiers.Store.Stage): from when
// it returns nil the blob survives kill -9 of the process, and a power loss
// once SyncBlobs ran after it.
func (c *Cache) StageBlob(ns, key string) error {
	if c.closed.Load() {
		return ErrClosed
	}
	k, err := blobKey(ns, key)
	if err != nil {
		return fmt.Errorf("kv: stage blob: %w", err)
	}
	if err := c.store.Stage(k); err != nil {
		return blobError("stage", ns, key, err)
	}
	return nil
}

// SyncBlobs fsyncs what StageBlob wrote (tiers.Store.SyncArchive).
func (c *Cache) SyncBlobs() error {
	if c.closed.Load() {
		return ErrClosed
	}
	return c.store.SyncArchive()
}

// ContainsBlob reports in O(1), without I/O, whether any tier holds the
// blob. An Archive file is not read: one that fails its checks is found
// here and is ErrNotFound to GetBlob.
func (c *Cache) ContainsBlob(ns, key string) bool {
	if c.closed.Load() {
		return false
	}
	k, err := blobKey(ns, key)
	return err == nil && c.store.Contains(k)
}

// GetBlob returns a blob, its metadata and the tier that served it
// (focus, working or archive). The bytes are shared with the cache: do not
// modify them. A missing blob, or one whose file failed its checks, is
// ErrNotFound.
func (c *Cache) GetBlob(ns, key string) (BlobMeta, []byte, tiers.Tier, error) {
	if c.closed.Load() {
		return BlobMeta{}, nil, tiers.TierNone, ErrClosed
	}
	k, err := blobKey(ns, key)
	if err != nil {
		return BlobMeta{}, nil, tiers.TierNone, fmt.Errorf("kv: get blob: %w", err)
	}
	v, t, err := c.store.Get(k)
	if err != nil {
		return BlobMeta{}, nil, tiers.TierNone, blobError("get", ns, key, err)
	}
	return BlobMeta{DType: v.DType, Shape: v.Shape, Size: int64(len(v.Data)), Aux: v.Aux}, v.Data, t, nil
}

// LoadBlob is GetBlob for a lookup that stands in for a compute, such as an
// engine state restored instead of a prefill: a blob found counts as a hit
// in Stats and as a load from its tier, with the time it took, in
// AmortizationStats. A blob not found counts nothing (the compute that
// follows counts the miss, through GetOrComputeBlob).
func (c *Cache) LoadBlob(ns, key string) (BlobMeta, []byte, tiers.Tier, error) {
	start := time.Now()
	m, data, t, err := c.GetBlob(ns, key)
	if err == nil {
		c.hits.Add(1)
		c.amort.load(t, time.Since(start))
	}
	return m, data, t, err
}

// GetOrComputeBlob makes sure a blob is stored under ns and key: when it is
// (the blob is not read), a hit; otherwise compute runs, once however many
// callers ask at the same time, and its blob is stored durably (PutBlob),
// a miss whose cost is the compute's time plus the extra time it reports
// for work done before the call (an engine's prefill, measured by the
// engine). A failed compute stores nothing. It returns the blob's metadata
// and how it was produced.
func (c *Cache) GetOrComputeBlob(ctx context.Context, ns, key string, compute func(context.Context) (BlobMeta, []byte, time.Duration, error)) (BlobMeta, Outcome, error) {
	k, err := blobKey(ns, key)
	if err != nil {
		return BlobMeta{}, Outcome{}, fmt.Errorf("kv: get or compute blob: %w", err)
	}
	type blob struct {
		meta BlobMeta
		data []byte
	}
	b, out, err := getOrCompute(c, ctx, k, "",
		func() (blob, tiers.Tier, time.Duration, error) {
			m, t, err := c.StatBlob(ns, key)
			return blob{meta: m}, t, 0, err
		},
		func(ctx context.Context) (b blob, extra time.Duration, err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("kv: compute panicked: %v", r)
				}
			}()
			b.meta, b.data, extra, err = compute(ctx)
			if err != nil {
				return blob{}, extra, fmt.Errorf("kv: compute blob: %w", err)
			}
			return b, extra, nil
		},
		func(b blob) error { return c.PutBlob(ns, key, b.meta, b.data) })
	b.meta.Size = max(b.meta.Size, int64(len(b.data)))
	return b.meta, out, err
}

// RangeBlobs calls fn with the key, metadata (Aux included) and fastest
// tier of every blob of namespace ns, without reading their bytes, until
// fn returns false. Blobs put or deleted meanwhile may or may not be seen.
func (c *Cache) RangeBlobs(ns string, fn func(key string, m BlobMeta, t tiers.Tier) bool) {
	if c.closed.Load() {
		return
	}
	prefix, err := blobKey(ns, "x")
	if err != nil {
		return
	}
	prefix = prefix[:len(prefix)-1]
	c.store.Range(func(k string, m tiers.Meta, t tiers.Tier) bool {
		key, ok := strings.CutPrefix(k, prefix)
		if !ok || key == "" {
			return true
		}
		return fn(key, BlobMeta{DType: m.DType, Shape: m.Shape, Aux: m.Aux}, t)
	})
}

// StatBlob returns a blob's metadata and fastest tier (for HEAD). A blob
// held only by the Archive is read and checked as GetBlob would, so the
// two always agree: a file that fails its checks is quarantined and is
// ErrNotFound to both.
func (c *Cache) StatBlob(ns, key string) (BlobMeta, tiers.Tier, error) {
	if c.closed.Load() {
		return BlobMeta{}, tiers.TierNone, ErrClosed
	}
	k, err := blobKey(ns, key)
	if err != nil {
		return BlobMeta{}, tiers.TierNone, fmt.Errorf("kv: stat blob: %w", err)
	}
	m, n, t, err := c.store.Stat(k)
	if err == nil && t == tiers.TierArchive {
		// The archive's index knows a file's header, not whether its
		// payload still reads.
		var v tiers.Value
		if v, t, err = c.store.Get(k); err == nil {
			m, n = v.Meta, int64(len(v.Data))
		}
	}
	if err != nil {
		return BlobMeta{}, tiers.TierNone, blobError("stat", ns, key, err)
	}
	return BlobMeta{DType: m.DType, Shape: m.Shape, Size: n, Aux: m.Aux}, t, nil
}

// DeleteBlob removes a blob from every tier, durably. A missing blob is
// ErrNotFound.
func (c *Cache) DeleteBlob(ns, key string) error {
	if c.closed.Load() {
		return ErrClosed
	}
	k, err := blobKey(ns, key)
	if err != nil {
		return fmt.Errorf("kv: delete blob: %w", err)
	}
	if err := c.store.Delete(k); err != nil {
		return blobError("delete", ns, key, err)
	}
	return nil
}

// blobError wraps a tiers error once: a missing blob is ErrNotFound naming
// the blob (a corrupt one keeps the corruption's text and mark), anything
// else "kv: <op> blob ns/key: <cause>".
func blobError(op, ns, key string, err error) error {
	switch {
	case errors.Is(err, durable.ErrCorrupt):
		return fmt.Errorf("%w: blob %s/%s: %w", ErrNotFound, ns, key, err)
	case errors.Is(err, tiers.ErrNotFound):
		return fmt.Errorf("%w: blob %s/%s", ErrNotFound, ns, key)
	}
	return fmt.Errorf("kv: %s blob %s/%s: %w", op, ns, key, err)
}

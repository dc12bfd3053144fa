package index

import (
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/durable"
)

// File format (little-endian), version 1:
//
//	magic   "KVSIDX\x00\x01"
//	u32     version
//	str     embedder name          (str = u32 length, bytes), then, for
//	        a SpaceEmbedder, a NUL and the vectors' space
//	u32     dimension
//	u64     document count
//	per document:
//	  str   id
//	  str   text
//	  i64   time, Unix nanoseconds (math.MinInt64: zero time)
//	  f64   importance
//	  i64   access count
//	  u32   vector length (0 or dimension), then that many f32
//	u32     CRC-32C of every byte before it
//
// Postings and the HNSW graph are not stored: they are rebuilt from the
// texts and vectors on Load, so a file never holds derived state that could
// disagree with the documents, and the tokenizer may change between
// versions. Vectors are stored because recomputing them may need a remote
// model.
const (
	fileMagic   = "KVSIDX\x00\x01"
	fileVersion = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Save writes the index to path atomically and durably
// (durable.WriteAtomic: a temporary file in the same folder is written,
// fsynced and renamed over path, then the folder is fsynced). Readers of
// path see the old or the new index, never a mix. The index stays usable
// (searches and updates) while the file is written; the file holds the
// documents as they were when Save began.
func (x *Index) Save(path string) (err error) {
	x.mu.RLock()
	snap := make([]*entry, 0, x.bm.n)
	for _, e := range x.docs {
		if e != nil {
			snap = append(snap, e)
		}
	}
	dim := x.vec.dim
	name := x.emb.Name()
	if x.vec.space != "" {
		name += "\x00" + x.vec.space
	}
	x.mu.RUnlock()

	err = durable.WriteAtomic(path, func(w io.Writer) error {
		return encodeIndex(w, name, dim, snap)
	})
	if err != nil {
		return fmt.Errorf("index: save: %w", err)
	}
	return nil
}

// Load reads an index saved by Save, with opts as for New. A missing,
// unreadable, truncated or corrupt file, or one written with another
// embedder (name or dimension, or, when the embedder is a SpaceEmbedder
// that knows its space, another space), returns an error matching errCorrupt (and
// fs.ErrNotExist when missing): the caller then builds a new index with New
// and Rebuild from its own documents. Load never returns a partly loaded
// index.
func Load(path string, opts Options) (*Index, error) {
	x, err := New(opts)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("index: load %s: %w: %w", path, errCorrupt, err)
	}
	name, dim, docs, err := decodeIndex(data)
	if err != nil {
		return nil, fmt.Errorf("index: load %s: %w", path, err)
	}
	name, space, _ := strings.Cut(name, "\x00")
	have := x.emb.space()
	if name != x.emb.Name() || (x.emb.Dim() > 0 && dim != 0 && dim != x.emb.Dim()) || (space != "" && have != "" && space != have) {
		return nil, fmt.Errorf("index: load %s: written by embedder %s (dimension %d, space %q), have %s (space %q): %w",
			path, name, dim, space, x.emb.Name(), have, errCorrupt)
	}
	// Documents saved without a vector had a zero embedding: they are not
	// re-embedded.
	entries := make([]*entry, len(docs))
	seen := make(map[string]struct{}, len(docs))
	for i, d := range docs {
		if _, dup := seen[d.ID]; dup {
			return nil, fmt.Errorf("index: load %s: id %q repeated: %w", path, d.ID, errCorrupt)
		}
		seen[d.ID] = struct{}{}
		entries[i] = newEntry(d)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if dim != 0 {
		x.vec.dim = dim
	}
	x.vec.space = space
	if err := x.vec.checkDim(entries, true, x.emb.Dim()); err != nil {
		return nil, fmt.Errorf("index: load %s: %w: %w", path, errCorrupt, err)
	}
	x.load(entries)
	return x, nil
}

// crcWriter computes the checksum of what passes through it.
type crcWriter struct {
	w io.Writer
	h hash.Hash32
}

func (c *crcWriter) Write(p []byte) (int, error) {
	c.h.Write(p)
	return c.w.Write(p)
}

func encodeIndex(w io.Writer, name string, dim int, docs []*entry) error {
	cw := &crcWriter{w: w, h: crc32.New(castagnoli)}
	var buf []byte
	flush := func() error {
		_, err := cw.Write(buf)
		buf = buf[:0]
		return err
	}
	putStr := func(s string) {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(s)))
		buf = append(buf, s...)
	}
	buf = append(buf, fileMagic...)
	buf = binary.LittleEndian.AppendUint32(buf, fileVersion)
	putStr(name)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(dim))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(docs)))
	for _, e := range docs {
		d := &e.doc
		putStr(d.ID)
		putStr(d.Text)
		t := int64(math.MinInt64)
		if !d.Meta.Time.IsZero() {
			t = d.Meta.Time.UnixNano()
		}
		buf = binary.LittleEndian.AppendUint64(buf, uint64(t))
		buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(d.Meta.Importance))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(d.Meta.AccessCount))
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(d.Vector)))
		for _, f := range d.Vector {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(f))
		}
		if len(buf) >= 1<<16 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], cw.h.Sum32())
	_, err := w.Write(sum[:])
	return err
}

// decodeIndex parses a whole file. Every length is checked against the bytes
// left, so hostile input cannot make it allocate more than the file's size
// or read out of bounds; every failure wraps errCorrupt.
func decodeIndex(data []byte) (name string, dim int, docs []Doc, err error) {
	corrupt := func(what string) error {
		return fmt.Errorf("%s: %w", what, errCorrupt)
	}
	if len(data) < len(fileMagic)+4+4 {
		return "", 0, nil, corrupt("short file")
	}
	if string(data[:len(fileMagic)]) != fileMagic {
		return "", 0, nil, corrupt("bad magic")
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return "", 0, nil, corrupt("checksum mismatch")
	}
	return decodeBody(body[len(fileMagic):])
}

// decodeBody parses what follows the magic, checksum already verified.
func decodeBody(b []byte) (name string, dim int, docs []Doc, err error) {
	d := decoder{b: b}
	if v := d.u32(); v != fileVersion {
		if d.err != nil {
			return "", 0, nil, d.err
		}
		return "", 0, nil, fmt.Errorf("version %d: %w", v, errCorrupt)
	}
	name = d.str()
	dim = int(d.u32())
	n := d.u64()
	if d.err != nil {
		return "", 0, nil, d.err
	}
	const minDoc = 4 + 4 + 8 + 8 + 8 + 4
	if n > uint64(len(d.b)/minDoc) {
		return "", 0, nil, fmt.Errorf("%d documents in %d bytes: %w", n, len(d.b), errCorrupt)
	}
	if dim > len(d.b)/4+1 {
		return "", 0, nil, fmt.Errorf("dimension %d: %w", dim, errCorrupt)
	}
	docs = make([]Doc, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		var doc Doc
		doc.ID = d.str()
		doc.Text = d.str()
		if t := int64(d.u64()); t != math.MinInt64 {
			doc.Meta.Time = time.Unix(0, t).UTC()
		}
		doc.Meta.Importance = math.Float64frombits(d.u64())
		doc.Meta.AccessCount = int64(d.u64())
		vl := d.u32()
		if d.err != nil {
			break
		}
		if vl != 0 && int(vl) != dim {
			return "", 0, nil, fmt.Errorf("document %d: vector length %d, dimension %d: %w", i, vl, dim, errCorrupt)
		}
		if uint64(vl)*4 > uint64(len(d.b)) {
			return "", 0, nil, fmt.Errorf("document %d: truncated vector: %w", i, errCorrupt)
		}
		if vl > 0 {
			doc.Vector = make([]float32, vl)
			for j := range doc.Vector {
				f := math.Float32frombits(d.u32())
				if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
					return "", 0, nil, fmt.Errorf("document %d: non-finite vector: %w", i, errCorrupt)
				}
				doc.Vector[j] = f
			}
		}
		if doc.ID == "" {
			return "", 0, nil, fmt.Errorf("document %d: empty id: %w", i, errCorrupt)
		}
		docs = append(docs, doc)
	}
	if d.err != nil {
		return "", 0, nil, d.err
	}
	if len(d.b) != 0 {
		return "", 0, nil, fmt.Errorf("%d trailing bytes: %w", len(d.b), errCorrupt)
	}
	return name, dim, docs, nil
}

// decoder reads little-endian fields; the first short read sets err and
// every later read returns zero.
type decoder struct {
	b   []byte
	err error
}

var errTruncated = fmt.Errorf("truncated: %w", errCorrupt)

func (d *decoder) take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errTruncated
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *decoder) str() string {
	n := d.u32()
	return string(d.take(uint64(n)))
}

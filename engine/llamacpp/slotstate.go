package llamacpp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvsidecar/kvsidecar/kv"
)

// ggmlType is a ggml tensor type id as llama.cpp writes it in a state file.
type ggmlType int32

// Header values of a llama.cpp sequence state file ("ggsq", version 2).
const (
	SlotStateMagic   uint32 = 0x67677371
	SlotStateVersion uint32 = 2
)

// Bounds the parser enforces before it allocates anything.
const (
	// MaxSlotStreams bounds n_stream (a server's -np).
	MaxSlotStreams = 4096
	// MaxSlotRowBytes bounds one K or V row (one cell of one layer).
	MaxSlotRowBytes = 1 << 30
	maxSeqPerCell   = 1 << 16
)

var (
	// ErrSlotState marks a slot state file that is not in the documented
	// layout: wrong magic or version, a wrong layer count, truncated or
	// trailing data, or values out of range.
	ErrSlotState = errors.New("engine: invalid slot state")
)

// slotState is a parsed llama.cpp slot (sequence) state file. Its byte
// slices alias the parsed data: they live as long as the caller keeps
// that data and must not be modified.
//
// Layout (host-endian, little endian on every host llama.cpp supports):
//
//	u32 magic 0x67677371, u32 version 2, u32 n_tokens, i32 tokens[n_tokens],
//	[u32 n_stream]                       (newer builds; absent before)
//	per stream: u32 cell_count; if cell_count > 0:
//	  per cell: i32 pos, u32 n_seq_id, i32 seq_id[n_seq_id]
//	  u32 v_trans, u32 n_layer
//	  per layer: i32 k_type, u64 k_row_bytes, cell_count rows
//	  v_trans 0, per layer: i32 v_type, u64 v_row_bytes, cell_count rows
//	  v_trans 1, per layer: i32 v_type, u32 v_el_size, u32 n_embd_v_gqa,
//	                        n_embd_v_gqa rows of cell_count elements
type slotState struct {
	Version uint32
	// Tokens are the token ids the slot had processed.
	Tokens []int32
	// StreamHeader is true when the file has the n_stream header.
	StreamHeader bool
	// Streams are the KV cache's streams; a slot's own KV is in one of
	// them and the others are empty.
	Streams []slotStream
}

// slotStream is one stream of the KV cache.
type slotStream struct {
	Cells  []slotCell
	VTrans bool
	// Layers is empty when Cells is.
	Layers []slotLayer
}

// slotCell is one KV cell: its position and sequences.
type slotCell struct {
	Pos    int32
	SeqIDs []int32
}

// slotLayer is one layer's K and V bytes.
type slotLayer struct {
	KType     ggmlType
	KRowBytes uint64
	// K is len(Cells) rows of KRowBytes: [cells, n_embd_k_gqa].
	K     []byte
	VType ggmlType
	// VRowBytes is set when !VTrans: V is len(Cells) rows of VRowBytes.
	VRowBytes uint64
	// VElemSize and VEmbd are set when VTrans: V is VEmbd rows of
	// len(Cells) elements of VElemSize bytes: [n_embd_v_gqa, cells].
	VElemSize uint32
	VEmbd     uint32
	V         []byte
}

// Cells returns the number of KV cells over all streams.
func (s *slotState) Cells() int {
	n := 0
	for i := range s.Streams {
		n += len(s.Streams[i].Cells)
	}
	return n
}

// Layers returns the layer count of the non-empty streams (0 when all are
// empty).
func (s *slotState) Layers() int {
	for i := range s.Streams {
		if len(s.Streams[i].Cells) > 0 {
			return len(s.Streams[i].Layers)
		}
	}
	return 0
}

// parseSlotState parses a llama.cpp slot state file. wantLayers, when not
// zero, is the model's layer count: a file with another is an error. The
// whole input must be consumed: trailing bytes are an error, as is any
// truncation. Files with and without the n_stream header of newer builds
// are accepted. The result aliases data. parseSlotState never panics and
// allocates in proportion to len(data); errors are ErrSlotState.
func parseSlotState(data []byte, wantLayers int) (*slotState, error) {
	if wantLayers < 0 || wantLayers > kv.MaxLayers {
		return nil, fmt.Errorf("%w: want %d layers", ErrSlotState, wantLayers)
	}
	r := &slotReader{b: data}
	st := &slotState{}
	if m := r.u32(); r.err == nil && m != SlotStateMagic {
		return nil, fmt.Errorf("%w: magic %#08x, want %#08x", ErrSlotState, m, SlotStateMagic)
	}
	st.Version = r.u32()
	if r.err == nil && st.Version != SlotStateVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrSlotState, st.Version, SlotStateVersion)
	}
	n := r.u32()
	if r.err == nil && uint64(n)*4 > uint64(r.left()) {
		return nil, fmt.Errorf("%w: %d tokens in %d bytes: truncated", ErrSlotState, n, r.left())
	}
	if r.err != nil {
		return nil, r.err
	}
	st.Tokens = make([]int32, n)
	for i := range st.Tokens {
		st.Tokens[i] = r.i32()
	}
	kvStart := r.off

	// Newer builds write n_stream first; older ones one stream without
	// the count. Try the newer layout, then the older one: only a parse
	// that consumes exactly the file is accepted.
	streams, err := parseStreams(data, kvStart, true, wantLayers)
	if err != nil {
		legacy, lerr := parseStreams(data, kvStart, false, wantLayers)
		if lerr != nil {
			return nil, err
		}
		st.Streams = legacy
		return st, nil
	}
	st.StreamHeader = true
	st.Streams = streams
	return st, nil
}

func parseStreams(data []byte, off int, header bool, wantLayers int) ([]slotStream, error) {
	r := &slotReader{b: data, off: off}
	nStream := uint32(1)
	if header {
		nStream = r.u32()
		if r.err != nil {
			return nil, r.err
		}
		if nStream == 0 || nStream > MaxSlotStreams || uint64(nStream)*4 > uint64(r.left()) {
			return nil, fmt.Errorf("%w: n_stream %d", ErrSlotState, nStream)
		}
	}
	streams := make([]slotStream, nStream)
	layers, vtrans := -1, false
	for s := range streams {
		if err := r.stream(&streams[s], wantLayers); err != nil {
			return nil, fmt.Errorf("stream %d: %w", s, err)
		}
		if len(streams[s].Cells) == 0 {
			continue
		}
		if layers >= 0 && (len(streams[s].Layers) != layers || streams[s].VTrans != vtrans) {
			return nil, fmt.Errorf("%w: stream %d has %d layers (v_trans %t), stream before %d (%t)",
				ErrSlotState, s, len(streams[s].Layers), streams[s].VTrans, layers, vtrans)
		}
		layers, vtrans = len(streams[s].Layers), streams[s].VTrans
	}
	if r.left() != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrSlotState, r.left())
	}
	return streams, nil
}

func (r *slotReader) stream(st *slotStream, wantLayers int) error {
	cells := r.u32()
	if r.err != nil {
		return r.err
	}
	if cells == 0 {
		return nil
	}
	// A cell takes at least 8 bytes: bound the allocation by the input.
	if uint64(cells)*8 > uint64(r.left()) {
		return fmt.Errorf("%w: %d cells in %d bytes: truncated", ErrSlotState, cells, r.left())
	}
	st.Cells = make([]slotCell, cells)
	var seqs []int32
	for i := range st.Cells {
		st.Cells[i].Pos = r.i32()
		ns := r.u32()
		if r.err != nil {
			return r.err
		}
		if ns > maxSeqPerCell || uint64(ns)*4 > uint64(r.left()) {
			return fmt.Errorf("%w: cell %d has %d sequences", ErrSlotState, i, ns)
		}
		start := len(seqs)
		for range ns {
			seqs = append(seqs, r.i32())
		}
		st.Cells[i].SeqIDs = seqs[start:len(seqs):len(seqs)]
	}
	vt := r.u32()
	nl := r.u32()
	if r.err != nil {
		return r.err
	}
	if vt > 1 {
		return fmt.Errorf("%w: v_trans %d", ErrSlotState, vt)
	}
	if nl == 0 || nl > kv.MaxLayers {
		return fmt.Errorf("%w: %d layers", ErrSlotState, nl)
	}
	if wantLayers > 0 && int(nl) != wantLayers {
		return fmt.Errorf("%w: %d layers, the model has %d", ErrSlotState, nl, wantLayers)
	}
	// A layer takes at least 12 bytes of K and 12 of V headers.
	if uint64(nl)*24 > uint64(r.left()) {
		return fmt.Errorf("%w: %d layers in %d bytes: truncated", ErrSlotState, nl, r.left())
	}
	st.VTrans = vt == 1
	st.Layers = make([]slotLayer, nl)
	for l := range st.Layers {
		ly := &st.Layers[l]
		ly.KType = ggmlType(r.i32())
		ly.KRowBytes = r.u64()
		ly.K = r.rows(uint64(cells), ly.KRowBytes, "K", l)
	}
	for l := range st.Layers {
		ly := &st.Layers[l]
		ly.VType = ggmlType(r.i32())
		if st.VTrans {
			ly.VElemSize = r.u32()
			ly.VEmbd = r.u32()
			if r.err == nil && (ly.VElemSize == 0 || ly.VEmbd == 0) {
				return fmt.Errorf("%w: layer %d: V element size %d, width %d", ErrSlotState, l, ly.VElemSize, ly.VEmbd)
			}
			ly.V = r.rows(uint64(ly.VEmbd), uint64(cells)*uint64(ly.VElemSize), "V", l)
		} else {
			ly.VRowBytes = r.u64()
			ly.V = r.rows(uint64(cells), ly.VRowBytes, "V", l)
		}
	}
	return r.err
}

// slotReader reads little-endian values; the first error sticks and
// later reads return zeros.
type slotReader struct {
	b   []byte
	off int
	err error
}

func (r *slotReader) left() int { return len(r.b) - r.off }

func (r *slotReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > r.left() {
		r.err = fmt.Errorf("%w: truncated at byte %d (want %d more, %d left)", ErrSlotState, r.off, n, r.left())
		return nil
	}
	b := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return b
}

func (r *slotReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *slotReader) i32() int32 { return int32(r.u32()) }

func (r *slotReader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// rows takes n rows of rowBytes each, checking the row size and the
// product against what is left before taking.
func (r *slotReader) rows(n, rowBytes uint64, what string, layer int) []byte {
	if r.err != nil {
		return nil
	}
	if rowBytes == 0 || rowBytes > MaxSlotRowBytes {
		r.err = fmt.Errorf("%w: layer %d: %s row of %d bytes", ErrSlotState, layer, what, rowBytes)
		return nil
	}
	if n > uint64(r.left())/rowBytes {
		r.err = fmt.Errorf("%w: layer %d: %d %s rows of %d bytes in %d: truncated", ErrSlotState, layer, n, what, rowBytes, r.left())
		return nil
	}
	return r.take(int(n * rowBytes))
}

package llamacpp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func toks(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(1000 + 7*i)
	}
	return t
}

func TestParseSlotStateValid(t *testing.T) {
	multi := genFile{magic: SlotStateMagic, version: SlotStateVersion, tokens: toks(5), header: true, streams: []genStream{
		{cells: 3, layers: 2, width: 4, ktype: GGMLTypeF16},
		{cells: 0},
		{cells: 2, layers: 2, width: 4, ktype: GGMLTypeF16, seq: 2},
	}}
	legacy := simpleFile(toks(4), 3, 8, true)
	legacy.header = false
	secondEmpty := simpleFile(toks(6), 2, 8, false)
	secondEmpty.streams = append(secondEmpty.streams, genStream{cells: 0})
	f32 := simpleFile(toks(3), 1, 4, true)
	f32.streams[0].ktype = GGMLTypeF32
	for _, tc := range []struct {
		name          string
		f             genFile
		header        bool
		cells, layers int
		streams       int
	}{
		{"v_trans 0", simpleFile(toks(7), 3, 8, false), true, 7, 3, 1},
		{"v_trans 1", simpleFile(toks(7), 3, 8, true), true, 7, 3, 1},
		{"two streams, second empty (-np 2)", secondEmpty, true, 6, 2, 2},
		{"three streams, two with cells", multi, true, 5, 2, 3},
		{"no n_stream header (older builds)", legacy, false, 4, 3, 1},
		{"f32", f32, true, 3, 1, 1},
		{"no tokens, no cells", genFile{magic: SlotStateMagic, version: SlotStateVersion, header: true, streams: []genStream{{}}}, true, 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.f.bytes()
			st, err := parseSlotState(data, 0)
			if err != nil {
				t.Fatal(err)
			}
			if st.StreamHeader != tc.header || st.Cells() != tc.cells || st.Layers() != tc.layers || len(st.Streams) != tc.streams {
				t.Fatalf("header %t cells %d layers %d streams %d, want %t %d %d %d",
					st.StreamHeader, st.Cells(), st.Layers(), len(st.Streams), tc.header, tc.cells, tc.layers, tc.streams)
			}
			if !slicesEqual(st.Tokens, tc.f.tokens) {
				t.Fatalf("tokens %v, want %v", st.Tokens, tc.f.tokens)
			}
			if tc.layers > 0 {
				if _, err := parseSlotState(data, tc.layers); err != nil {
					t.Fatalf("with the right layer count: %v", err)
				}
			}
		})
	}
}

func slicesEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestParseSlotStateErrors(t *testing.T) {
	good := simpleFile(toks(4), 2, 8, true)
	mutate := func(f func(*genFile)) []byte {
		g := good
		g.streams = append([]genStream(nil), good.streams...)
		f(&g)
		return g.bytes()
	}
	patch := func(off int, v uint32) []byte {
		b := good.bytes()
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	// Offset of v_trans: header 12, tokens 16, n_stream 4, cell_count 4, cells 4×12.
	vtOff := 12 + 16 + 4 + 4 + 48
	for _, tc := range []struct {
		name  string
		data  []byte
		want  int
		inErr string
	}{
		{"wrong magic", mutate(func(g *genFile) { g.magic = 0x67677372 }), 0, "magic"},
		{"session file magic", mutate(func(g *genFile) { g.magic = 0x6767736e }), 0, "magic"},
		{"wrong version", mutate(func(g *genFile) { g.version = 1 }), 0, "version"},
		{"future version", mutate(func(g *genFile) { g.version = 3 }), 0, "version"},
		{"layer count differs from the model's", good.bytes(), 3, "layers"},
		{"streams with different layer counts", mutate(func(g *genFile) {
			g.streams = append(g.streams, genStream{cells: 2, layers: 3, width: 8, ktype: GGMLTypeF16})
		}), 0, "layers"},
		{"zero layers", patch(vtOff+4, 0), 0, "layers"},
		{"v_trans 2", patch(vtOff, 2), 0, "v_trans"},
		{"trailing byte", append(good.bytes(), 0), 0, "trailing"},
		{"too many tokens", patch(8, 1<<30), 0, "truncated"},
		{"too many cells", patch(12+16+4, 1<<30), 0, "cells"},
		{"empty", nil, 0, "truncated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseSlotState(tc.data, tc.want)
			if !errors.Is(err, ErrSlotState) {
				t.Fatalf("err %v, want ErrSlotState", err)
			}
			if !bytes.Contains([]byte(err.Error()), []byte(tc.inErr)) {
				t.Fatalf("err %q does not mention %q", err, tc.inErr)
			}
		})
	}
	// Every truncation of valid files is an error.
	for _, g := range []genFile{good, simpleFile(toks(3), 2, 4, false)} {
		data := g.bytes()
		for n := range len(data) {
			if _, err := parseSlotState(data[:n], 0); !errors.Is(err, ErrSlotState) {
				t.Fatalf("truncated to %d of %d bytes: err %v", n, len(data), err)
			}
		}
	}
}

func FuzzParseSlotState(f *testing.F) {
	f.Add(simpleFile(toks(3), 2, 4, false).bytes())
	f.Add(simpleFile(toks(2), 1, 4, true).bytes())
	legacy := simpleFile(toks(2), 1, 2, false)
	legacy.header = false
	f.Add(legacy.bytes())
	f.Add(genFile{magic: SlotStateMagic, version: SlotStateVersion, tokens: toks(3), header: true, streams: []genStream{
		{cells: 0}, {cells: 2, vtrans: true, layers: 2, width: 2, ktype: GGMLTypeF32}}}.bytes())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := parseSlotState(data, 0)
		if err != nil {
			if !errors.Is(err, ErrSlotState) {
				t.Fatalf("error without ErrSlotState: %v", err)
			}
			return
		}
		// Whatever parsed is self-consistent and converts or says why.
		n := 0
		for _, s := range st.Streams {
			for _, l := range s.Layers {
				n += len(l.K) + len(l.V)
				if uint64(len(l.K)) != uint64(len(s.Cells))*l.KRowBytes {
					t.Fatalf("K of %d bytes for %d cells of %d", len(l.K), len(s.Cells), l.KRowBytes)
				}
			}
		}
		if n > len(data) {
			t.Fatalf("%d tensor bytes from %d input bytes", n, len(data))
		}
	})
}

package durable

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
)

func frame(payloads ...string) []byte {
	var b []byte
	for _, p := range payloads {
		b = AppendRecord(b, []byte(p))
	}
	return b
}

func scanAll(b []byte) ([]string, Scan) {
	var got []string
	sc := ScanRecords(b, 1<<20, func(_ int, p []byte) { got = append(got, string(p)) })
	return got, sc
}

func TestScanRecordsKeepsEveryIntactRecord(t *testing.T) {
	var recs []string
	for i := range 256 {
		recs = append(recs, fmt.Sprintf(`{"k":"msg","seq":%d,"text":"%s"}`, i, bytes.Repeat([]byte{'a' + byte(i%26)}, i%50)))
	}
	b := frame(recs...)
	got, sc := scanAll(b)
	if len(got) != 256 || sc.End != len(b) || len(sc.Damaged) != 0 {
		t.Fatalf("clean: %d records, end %d/%d, damaged %v", len(got), sc.End, len(b), sc.Damaged)
	}
	// Where each record starts, to aim the damage.
	offs := []int{}
	ScanRecords(b, 1<<20, func(off int, _ []byte) { offs = append(offs, off) })

	f := func(name string, damage func([]byte) []byte, lost ...int) {
		t.Helper()
		d := damage(bytes.Clone(b))
		got, sc := scanAll(d)
		want := []string{}
		for i, r := range recs {
			skip := false
			for _, l := range lost {
				skip = skip || l == i
			}
			if !skip {
				want = append(want, r)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: got %d records, want %d (lost %v); damaged %v", name, len(got), len(want), lost, sc.Damaged)
		}
	}
	// The reproduction: one flipped byte mid-log used to drop
	// every record after it (127 of 256).
	f("payload byte flipped mid-log", func(d []byte) []byte { d[offs[128]+RecordHeaderSize+3] ^= 0x20; return d }, 128)
	f("length byte flipped mid-log", func(d []byte) []byte { d[offs[128]] ^= 0x01; return d }, 128)
	f("header checksum flipped", func(d []byte) []byte { d[offs[7]+9] ^= 0xff; return d }, 7)
	f("first record damaged", func(d []byte) []byte { d[offs[0]+RecordHeaderSize] ^= 1; return d }, 0)
	f("two separate records", func(d []byte) []byte { d[offs[3]+2] ^= 4; d[offs[200]+RecordHeaderSize+1] ^= 4; return d }, 3, 200)
	f("zeros over two records", func(d []byte) []byte { clear(d[offs[10]:offs[12]]); return d }, 10, 11)
	f("torn tail", func(d []byte) []byte { return d[:offs[255]+5] }, 255)
	f("garbage tail", func(d []byte) []byte { return append(d[:offs[255]], 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9) }, 255)
	f("last record's payload damaged", func(d []byte) []byte { d[len(d)-1] ^= 1; return d }, 255)
}

func TestScanRecordsTail(t *testing.T) {
	b := frame("one", "two", "three")
	full := len(b)
	_, sc := scanAll(b[:full-2])
	if sc.Records != 2 || sc.End != full-2-(RecordHeaderSize+3) || len(sc.Damaged) != 0 {
		t.Fatalf("torn: %+v", sc)
	}
	// Zero fill after the records is a tail, not records.
	_, sc = scanAll(append(bytes.Clone(b), make([]byte, 100)...))
	if sc.Records != 3 || sc.End != full {
		t.Fatalf("zero fill: %+v", sc)
	}
	// A length over the bound is damage, not a huge allocation.
	huge := frame("x")
	binary.LittleEndian.PutUint32(huge[0:4], 1<<30)
	if _, sc := scanAll(append(huge, frame("after")...)); sc.Records != 1 || len(sc.Damaged) != 1 {
		t.Fatalf("huge length: %+v", sc)
	}
}

// FuzzScanRecords: any input decodes without panicking; every record it
// returns re-frames to the exact bytes at its offset; records, damaged
// spans and the tail tile the input in order.
func FuzzScanRecords(f *testing.F) {
	f.Add(frame(`{"k":"meta"}`, "second", "third"))
	f.Add([]byte{})
	f.Add(make([]byte, 40))
	d := frame("a", "bb", "ccc")
	d[RecordHeaderSize+1+3] ^= 1
	f.Add(d)
	f.Fuzz(func(t *testing.T, data []byte) {
		type rec struct{ off, n int }
		var recs []rec
		sc := ScanRecords(data, 1<<16, func(off int, p []byte) {
			if len(p) == 0 || len(p) > 1<<16 {
				t.Fatalf("payload of %d bytes", len(p))
			}
			if got := AppendRecord(nil, p); !bytes.Equal(got, data[off:off+len(got)]) {
				t.Fatalf("record at %d does not re-frame to its bytes", off)
			}
			recs = append(recs, rec{off, RecordHeaderSize + len(p)})
		})
		if sc.Records != len(recs) || sc.End < 0 || sc.End > len(data) {
			t.Fatalf("scan %+v with %d records of %d bytes", sc, len(recs), len(data))
		}
		// Records and damaged spans are disjoint, ascending, and cover
		// [0, End) without gaps.
		pos, ri, di := 0, 0, 0
		for pos < sc.End {
			switch {
			case ri < len(recs) && recs[ri].off == pos:
				pos += recs[ri].n
				ri++
			case di < len(sc.Damaged) && sc.Damaged[di].Off == pos && sc.Damaged[di].End > pos:
				pos = sc.Damaged[di].End
				di++
			default:
				t.Fatalf("gap at %d (records %v, damaged %v, end %d)", pos, recs, sc.Damaged, sc.End)
			}
		}
		if pos != sc.End || ri != len(recs) || di != len(sc.Damaged) {
			t.Fatalf("tiling ends at %d, end %d", pos, sc.End)
		}
	})
}

func BenchmarkScanRecordsResync(b *testing.B) {
	// 1 MiB of garbage with no zero byte (worst case for the cheap filter
	// is many plausible lengths; text is the common case).
	garbage := bytes.Repeat([]byte("lorem ipsum dolor sit amet "), 40000)
	data := append(append(frame("before"), garbage...), frame("after")...)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, sc := scanAll(data); sc.Records != 2 {
			b.Fatal(sc)
		}
	}
}

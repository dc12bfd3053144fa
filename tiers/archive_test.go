package tiers

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// fp16Data makes KV-like data: normally distributed values as fp16.
func fp16Data(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], F32ToF16(float32(r.NormFloat64())))
	}
	return b
}

func openTestArchive(t *testing.T, dir string, fsys FS) *Archive {
	t.Helper()
	a, err := OpenArchive(ArchiveOptions{Dir: dir, FS: fsys})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestArchiveRoundTrip(t *testing.T) {
	dir := t.TempDir()
	a := openTestArchive(t, dir, nil)
	f32 := make([]byte, 4096)
	for i := range 1024 {
		binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(float32(i%17)*0.25))
	}
	cases := []struct {
		name  string
		v     Value
		codec uint8
	}{
		{"f16", Value{Meta: Meta{DType: DTypeF16, Shape: []int64{2, 8, 64, 64}, Tokens: 64, Aux: []byte("model")}, Data: fp16Data(64*64*16, 1)}, codecPlanes},
		{"bf16", Value{Meta: Meta{DType: DTypeBF16, Shape: []int64{4096}}, Data: bytes.Repeat([]byte{0x3f, 0x80}, 4096)}, codecPlanes},
		{"f32", Value{Meta: Meta{DType: DTypeF32}, Data: f32}, codecPlanes},
		{"random", Value{Meta: Meta{}, Data: value("r", 10000)}, codecRaw},
		{"text", Value{Meta: Meta{}, Data: bytes.Repeat([]byte("user: hello there\nassistant: hi!\n"), 300)}, codecZstd},
		{"empty", Value{Meta: Meta{DType: DTypeF16}, Data: nil}, codecRaw},
		{"odd", Value{Meta: Meta{DType: DTypeF16}, Data: []byte{1, 2, 3}}, codecRaw},
	}
	for _, c := range cases {
		if err := a.Put(c.name, c.v, false); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	check := func(a *Archive) {
		t.Helper()
		for _, c := range cases {
			got, _, err := a.Get(c.name)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if !bytes.Equal(got.Data, c.v.Data) || got.DType != c.v.DType || got.Tokens != c.v.Tokens ||
				!bytes.Equal(got.Aux, c.v.Aux) || fmt.Sprint(got.Shape) != fmt.Sprint(c.v.Shape) {
				t.Fatalf("%s: round trip changed the value: %+v", c.name, got.Meta)
			}
			_, name := a.paths(c.name)
			h, _, err := a.readHeader(name)
			if err != nil {
				t.Fatal(err)
			}
			if h.codec != c.codec {
				t.Errorf("%s: codec %d, want %d", c.name, h.codec, c.codec)
			}
		}
	}
	check(a)
	a.Close()
	a = openTestArchive(t, dir, nil)
	check(a)
	if a.Len() != len(cases) {
		t.Fatalf("reopened with %d blocks, want %d", a.Len(), len(cases))
	}
	if err := a.Delete("f16"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Get("f16"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted block: %v", err)
	}
	a.Close()
	if a := openTestArchive(t, dir, nil); a.Contains("f16") {
		t.Fatal("delete did not survive reopen")
	}
}

func TestArchiveLossyQ8(t *testing.T) {
	a := openTestArchive(t, t.TempDir(), nil)
	data := fp16Data(1<<16, 2)
	v := Value{Meta: Meta{DType: DTypeF16}, Data: data}
	if err := a.Put("k", v, true); err != nil {
		t.Fatal(err)
	}
	got, _, err := a.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Data) != len(data) {
		t.Fatalf("len %d, want %d", len(got.Data), len(data))
	}
	var maxErr, maxAbs float64
	for i := range len(data) / 2 {
		x := float64(F16ToF32(binary.LittleEndian.Uint16(data[2*i:])))
		y := float64(F16ToF32(binary.LittleEndian.Uint16(got.Data[2*i:])))
		maxErr = max(maxErr, math.Abs(x-y))
		maxAbs = max(maxAbs, math.Abs(x))
	}
	// Half a quantisation step of the largest group, plus fp16 rounding.
	if maxErr > maxAbs/254+maxAbs/1024 {
		t.Fatalf("max error %g for max |x| %g", maxErr, maxAbs)
	}
	_, name := a.paths("k")
	fi, _ := os.Stat(name)
	if fi.Size() > int64(len(data))*6/10 {
		t.Fatalf("q8 file of %d bytes for %d bytes of fp16", fi.Size(), len(data))
	}
}

func TestF16(t *testing.T) {
	for h := range 1 << 16 {
		f := F16ToF32(uint16(h))
		if f != f {
			if back := F32ToF16(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back := F32ToF16(f); back != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, back)
		}
	}
	f := func(in float32, want uint16) {
		t.Helper()
		if got := F32ToF16(in); got != want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", in, got, want)
		}
	}
	f(65520, 0x7c00)      // rounds to +Inf
	f(1e-8, 0)            // underflows
	f(1+1.0/2048, 0x3c00) // ties to even
	f(1+3.0/2048, 0x3c02) // ties to even, upward
	f(5.96e-8, 0x0001)    // smallest subnormal
	if F32ToBF16(1.0) != 0x3f80 || F32ToBF16(-2) != 0xc000 {
		t.Error("bf16")
	}
}

func TestArchiveScanCleansAndQuarantines(t *testing.T) {
	dir := t.TempDir()
	a := openTestArchive(t, dir, nil)
	for i := range 4 {
		if err := a.Put("k"+strconv.Itoa(i), Value{Meta: Meta{DType: DTypeF16}, Data: fp16Data(1000, uint64(i))}, false); err != nil {
			t.Fatal(err)
		}
	}
	a.Close()
	_, name0 := a.paths("k0")
	_, name1 := a.paths("k1")
	_, name2 := a.paths("k2")
	// k0: truncated (a torn file that somehow got its final name)
	b, _ := os.ReadFile(name0)
	os.WriteFile(name0, b[:len(b)/2], 0o600)
	// k1: payload bit flip, caught by the CRC on read (or on open with VerifyOnOpen)
	b, _ = os.ReadFile(name1)
	b[len(b)-20] ^= 1
	os.WriteFile(name1, b, 0o600)
	// k2: renamed to another key's name
	os.Rename(name2, filepath.Join(filepath.Dir(name2), strings.Repeat("0", 32)+".kva"))
	// leftovers of a crash and foreign files
	tmp := filepath.Join(filepath.Dir(name0), ".x.kva.7.tmp")
	os.WriteFile(tmp, []byte("partial"), 0o600)
	os.WriteFile(filepath.Join(dir, "blocks", "README"), []byte("hi"), 0o600)

	a, err := OpenArchive(ArchiveOptions{Dir: dir, VerifyOnOpen: true})
	if err != nil {
		t.Fatalf("open must not fail on corrupt files: %v", err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("temp file left behind: %v", err)
	}
	if a.Len() != 1 || !a.Contains("k3") {
		t.Fatalf("index after scan: %d blocks", a.Len())
	}
	q := a.Quarantined()
	if len(q) != 3 {
		t.Fatalf("quarantined %d files, want 3: %+v", len(q), q)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "quarantine"))
	if len(entries) != 3 {
		t.Fatalf("%d files in quarantine/, want 3", len(entries))
	}
	for _, k := range []string{"k0", "k1", "k2"} {
		if _, _, err := a.Get(k); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s served: %v", k, err)
		}
	}
}

// faultFS injects failures into OSFS.
type faultFS struct {
	OSFS
	failSync, failRename atomic.Bool
	writeLimit           atomic.Int64 // fail writes past this many bytes per file; 0 = off
	keepTemp             atomic.Bool  // removing temp files fails, as when the process dies
}

var errInjected = errors.New("injected fault")

type faultFile struct {
	File
	fs      *faultFS
	written int64
}

func (f *faultFile) Write(p []byte) (int, error) {
	if lim := f.fs.writeLimit.Load(); lim > 0 && f.written+int64(len(p)) > lim {
		n := int(lim - f.written)
		n, _ = f.File.Write(p[:n])
		f.written += int64(n)
		return n, errInjected
	}
	n, err := f.File.Write(p)
	f.written += int64(n)
	return n, err
}

func (f *faultFile) Sync() error {
	if f.fs.failSync.Load() {
		return errInjected
	}
	return f.File.Sync()
}

func (f *faultFS) Create(name string) (File, error) {
	file, err := f.OSFS.Create(name)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f}, nil
}

func (f *faultFS) Rename(o, n string) error {
	if f.failRename.Load() {
		return errInjected
	}
	return f.OSFS.Rename(o, n)
}

func (f *faultFS) Remove(name string) error {
	if f.keepTemp.Load() && strings.HasSuffix(name, ".tmp") {
		return errInjected
	}
	return f.OSFS.Remove(name)
}

func countFiles(t *testing.T, dir, suffix string) int {
	t.Helper()
	n := 0
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, suffix) {
			n++
		}
		return nil
	})
	return n
}

func TestArchiveFaults(t *testing.T) {
	dir := t.TempDir()
	fsys := &faultFS{}
	a := openTestArchive(t, dir, fsys)
	good := Value{Meta: Meta{DType: DTypeF16}, Data: fp16Data(5000, 9)}
	if err := a.Put("k", good, false); err != nil {
		t.Fatal(err)
	}
	newer := Value{Meta: Meta{DType: DTypeF16}, Data: fp16Data(5000, 10)}
	faults := []struct {
		name string
		set  func(on bool)
	}{
		{"short write", func(on bool) {
			if on {
				fsys.writeLimit.Store(100)
			} else {
				fsys.writeLimit.Store(0)
			}
		}},
		{"fsync", func(on bool) { fsys.failSync.Store(on) }},
		{"rename", func(on bool) { fsys.failRename.Store(on) }},
	}
	for _, f := range faults {
		f.set(true)
		err := a.Put("k", newer, false)
		f.set(false)
		if !errors.Is(err, errInjected) {
			t.Fatalf("%s: Put = %v, want the injected error", f.name, err)
		}
		got, _, err := a.Get("k")
		if err != nil || !bytes.Equal(got.Data, good.Data) {
			t.Fatalf("%s: a failed Put must leave the old block: %v", f.name, err)
		}
		if n := countFiles(t, dir, ".tmp"); n != 0 {
			t.Fatalf("%s: %d temp files left", f.name, n)
		}
	}
	// A crash between write and rename leaves a temp file; open removes it
	// and serves the last acknowledged block.
	fsys.keepTemp.Store(true)
	fsys.failRename.Store(true)
	if err := a.Put("k", newer, false); err == nil {
		t.Fatal("Put succeeded with rename failing")
	}
	if countFiles(t, dir, ".tmp") != 1 {
		t.Fatal("expected a leftover temp file")
	}
	a.Close()
	a = openTestArchive(t, dir, OSFS{})
	if countFiles(t, dir, ".tmp") != 0 {
		t.Fatal("open left the temp file")
	}
	got, _, err := a.Get("k")
	if err != nil || !bytes.Equal(got.Data, good.Data) {
		t.Fatalf("after reopen: %v", err)
	}
}

const crashEnv = "TIERS_CRASH_CHILD_DIR"

// TestArchiveCrash re-executes the test binary as a child that writes blocks
// and prints "ack N" after each Put returns, kills it with SIGKILL while it
// writes, and checks that the reopened archive serves every acknowledged
// block intact and nothing torn.
func TestArchiveCrash(t *testing.T) {
	if dir := os.Getenv(crashEnv); dir != "" {
		crashChild(dir)
		return
	}
	dir := t.TempDir()
	start := 0
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestArchiveCrash$")
		cmd.Env = append(os.Environ(), crashEnv+"="+dir, "TIERS_CRASH_START="+strconv.Itoa(start))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		acked := map[int]bool{}
		killAt := 3 + round*4
		killed := false
		for sc.Scan() {
			n, ok := strings.CutPrefix(sc.Text(), "ack ")
			if !ok {
				continue
			}
			i, _ := strconv.Atoi(n)
			acked[i] = true
			if len(acked) == killAt && !killed {
				cmd.Process.Kill() // SIGKILL: the child is inside its next Put
				killed = true
			}
		}
		cmd.Wait()
		if !killed {
			t.Fatalf("round %d: child stopped after %d acks before it was killed", round, len(acked))
		}
		a, err := OpenArchive(ArchiveOptions{Dir: dir, VerifyOnOpen: true})
		if err != nil {
			t.Fatal(err)
		}
		if q := a.Quarantined(); len(q) != 0 {
			t.Fatalf("round %d: torn files reached their final names: %+v", round, q)
		}
		if n := countFiles(t, dir, ".tmp"); n != 0 {
			t.Fatalf("round %d: %d temp files after open", round, n)
		}
		for i := range acked {
			key := "block-" + strconv.Itoa(i)
			got, _, err := a.Get(key)
			if err != nil {
				t.Fatalf("round %d: acknowledged %s lost: %v", round, key, err)
			}
			if !bytes.Equal(got.Data, crashValue(i)) {
				t.Fatalf("round %d: acknowledged %s has other bytes", round, key)
			}
		}
		// Anything else present (the block in flight may have been renamed
		// before its ack was printed) is whole too.
		a.Keys(func(k string, _ Meta) bool {
			i, _ := strconv.Atoi(strings.TrimPrefix(k, "block-"))
			if got, _, err := a.Get(k); err != nil || !bytes.Equal(got.Data, crashValue(i)) {
				t.Errorf("round %d: %s present but not intact: %v", round, k, err)
			}
			return true
		})
		a.Close()
		start += 1000
	}
}

func crashValue(i int) []byte {
	return fp16Data(16<<10+i*100, uint64(i))
}

func crashChild(dir string) {
	start, _ := strconv.Atoi(os.Getenv("TIERS_CRASH_START"))
	a, err := OpenArchive(ArchiveOptions{Dir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for i := start; i < start+1000; i++ {
		if err := a.Put("block-"+strconv.Itoa(i), Value{Meta: Meta{DType: DTypeF16}, Data: crashValue(i)}, false); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Fprintf(os.Stdout, "ack %d\n", i)
	}
	os.Exit(0)
}

func FuzzDecodeFile(f *testing.F) {
	for _, v := range []Value{
		{Meta: Meta{DType: DTypeF16, Shape: []int64{2, 3}, Tokens: 3, Aux: []byte("m")}, Data: fp16Data(600, 1)},
		{Meta: Meta{}, Data: []byte("hello hello hello hello hello")},
	} {
		for _, lossy := range []bool{false, true} {
			payload, codec := encodePayload(nil, v.Data, v.DType, lossy, 1)
			h := &fileHeader{meta: v.Meta, key: "k", codec: codec, rawLen: uint64(len(v.Data)), storedLen: uint64(len(payload))}
			b := appendHeader(nil, h)
			b = append(b, payload...)
			b = binary.LittleEndian.AppendUint32(b, crcOf(b))
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeFile(b, "k", 1<<20)
		h, herr := parseHeader(b, 1<<20)
		if herr == nil && h.headerLen > len(b) {
			t.Fatalf("header length %d beyond %d bytes", h.headerLen, len(b))
		}
		if err == nil && (herr != nil || uint64(len(v.Data)) != h.rawLen) {
			t.Fatalf("decoded %d bytes, header %v says %d", len(v.Data), herr, h.rawLen)
		}
	})
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

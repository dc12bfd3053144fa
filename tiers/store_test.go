package tiers

import (
	"bytes"
	"errors"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
)

func TestStoreConcurrent(t *testing.T) {
	s, err := Open(Options{
		Dir:     t.TempDir(),
		Focus:   Budget{MaxBytes: 64 << 10},
		Working: Budget{MaxBytes: 128 << 10},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Each goroutine owns its keys, so what it reads back must be what it
	// last wrote, wherever the block has moved meanwhile.
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			last := map[string][]byte{}
			for i := range 300 {
				key := "g" + strconv.Itoa(g) + "-" + strconv.Itoa(i%20)
				switch i % 4 {
				case 0, 1:
					v := value(key+strconv.Itoa(i), 4096)
					if err := s.Put(key, Value{Meta: Meta{DType: DTypeF16}, Data: v}, PutOptions{Durable: i%8 == 0}); err != nil {
						t.Error(err)
						return
					}
					last[key] = v
				case 2:
					v, _, err := s.Get(key)
					want, ok := last[key]
					if ok && (err != nil || !bytes.Equal(v.Data, want)) {
						t.Errorf("get %s: %v, bytes equal %v", key, err, bytes.Equal(v.Data, want))
						return
					}
					if !ok && !errors.Is(err, ErrNotFound) {
						t.Errorf("get %s never written: %v", key, err)
					}
				case 3:
					if i%12 == 3 {
						err := s.Delete(key)
						if _, ok := last[key]; ok != (err == nil) {
							t.Errorf("delete %s: %v", key, err)
						}
						delete(last, key)
					}
				}
			}
		})
	}
	wg.Wait()
	s.Maintain()
	for _, ts := range s.Stats().Tiers {
		if ts.Tier != "archive" && ts.Bytes > ts.MaxBytes {
			t.Errorf("%s holds %d bytes over its budget of %d", ts.Tier, ts.Bytes, ts.MaxBytes)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get("g0-1"); !errors.Is(err, ErrClosed) {
		t.Fatalf("get after close: %v", err)
	}
}

// TestStoreNoLeak runs a store in a synctest bubble: the bubble fails the
// test if the maintenance goroutine outlives Close.
func TestStoreNoLeak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := Open(Options{Focus: Budget{MaxBytes: 1000}, Working: Budget{MaxBytes: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 30 {
			if err := s.Put(strconv.Itoa(i), Value{Data: make([]byte, 100)}, PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait() // the maintenance goroutine has caught up
		for _, ts := range s.Stats().Tiers {
			if float64(ts.Bytes) > 0.9*float64(ts.MaxBytes) {
				t.Errorf("%s at %d bytes after background maintenance", ts.Tier, ts.Bytes)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestStoreOptions(t *testing.T) {
	bad := []Options{
		{Strategy: "nope"},
		{Focus: Budget{Soft: 0.9, Hard: 0.5}},
		{Working: Budget{MaxBytes: -1}},
		{PromoteThreshold: -1},
	}
	for i, o := range bad {
		if s, err := Open(o); err == nil {
			s.Close()
			t.Errorf("case %d: invalid options accepted", i)
		}
	}
	s, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Strategy() != DefaultStrategy {
		t.Fatalf("strategy %q", s.Strategy())
	}
	if err := s.Put("k", Value{Data: []byte("x")}, PutOptions{Durable: true}); !errors.Is(err, ErrNoArchive) {
		t.Fatalf("durable put without archive: %v", err)
	}
	if err := s.Put("", Value{}, PutOptions{}); err == nil {
		t.Fatal("empty key accepted")
	}
	if err := s.Put("k", Value{Meta: Meta{Shape: make([]int64, 9)}}, PutOptions{}); err == nil {
		t.Fatal("9-d shape accepted")
	}
	if _, err := ParseDType("f64"); err == nil {
		t.Fatal("f64 parsed")
	}
	for _, d := range []DType{DTypeNone, DTypeF16, DTypeBF16, DTypeF32, DTypeQ8} {
		if got, err := ParseDType(d.String()); err != nil || got != d {
			t.Fatalf("ParseDType(%q) = %v, %v", d, got, err)
		}
	}
}

// Persist writes a cached value to the Archive once, leaves it served from
// memory, and a reopened store (no flush on close) serves it from disk.
func TestStorePersist(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, DisableFocus: true, NoFlushOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	v := value("persisted", 4096)
	if err := s.Put("k", Value{Meta: Meta{DType: DTypeF16}, Data: v}, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("lost", Value{Data: value("lost", 100)}, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Persist("k"); err != nil {
		t.Fatal(err)
	}
	if err := s.Persist("k"); err != nil {
		t.Fatalf("second persist: %v", err)
	}
	if err := s.Persist("absent"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("persist of an absent key: %v, want ErrNotFound", err)
	}
	if got, tier, err := s.Get("k"); err != nil || tier != TierWorking || !bytes.Equal(got.Data, v) {
		t.Fatalf("get after persist: tier %v err %v equal %v", tier, err, bytes.Equal(got.Data, v))
	}
	// Stage writes without fsync: a second store on the folder (as after
	// a kill -9, the page cache survives) finds it; SyncArchive fsyncs it.
	staged := value("staged", 8192)
	if err := s.Put("s", Value{Meta: Meta{DType: DTypeF16}, Data: staged}, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Stage("s"); err != nil {
		t.Fatal(err)
	}
	if n := len(s.archive.staged); n != 1 {
		t.Fatalf("%d files staged, want 1", n)
	}
	other, err := Open(Options{Dir: dir, DisableFocus: true, NoFlushOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, tier, err := other.Get("s"); err != nil || tier != TierArchive || !bytes.Equal(got.Data, staged) {
		t.Fatalf("a staged value from another store: tier %v err %v", tier, err)
	}
	other.Close()
	if err := s.SyncArchive(); err != nil || len(s.archive.staged) != 0 {
		t.Fatalf("sync: %v, %d still staged", err, len(s.archive.staged))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(Options{Dir: dir, DisableFocus: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, tier, err := s.Get("k"); err != nil || tier != TierArchive || !bytes.Equal(got.Data, v) {
		t.Fatalf("after reopen: tier %v err %v", tier, err)
	}
	if _, _, err := s.Get("lost"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a value never persisted survived a close without flush: %v", err)
	}
	mem, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if err := mem.Put("k", Value{Data: v}, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := mem.Persist("k"); !errors.Is(err, ErrNoArchive) {
		t.Fatalf("persist without an archive: %v", err)
	}
}

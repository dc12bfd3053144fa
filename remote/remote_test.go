package remote_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver/redistest"
	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/remote"
)

var ctx = context.Background()

// open starts a redis-server (unless srv is given) and a Store on it.
func open(t *testing.T, srv *redisserver.Server, mod func(*remote.Options)) (*remote.Store, *redisserver.Server) {
	t.Helper()
	if srv == nil {
		srv = redistest.Start(t, redisserver.Options{})
	}
	o := remote.Options{URL: srv.URL(), ChunkBytes: 1024, Owner: "10.0.0.1:8080"}
	if mod != nil {
		mod(&o)
	}
	s, err := remote.Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, srv
}

// raw is a plain client for looking behind the Store's back.
func raw(t *testing.T, srv *redisserver.Server) *redis.Client {
	t.Helper()
	o, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

func blobOf(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7+i/251)
	}
	return b
}

func TestOptionsValidate(t *testing.T) {
	bad := []remote.Options{
		{},
		{URL: "http://127.0.0.1:6379"},
		{URL: "redis://"},
		{URL: "redis://127.0.0.1:1", Prefix: "a{b"},
		{URL: "redis://127.0.0.1:1", ChunkBytes: 10},
		{URL: "redis://127.0.0.1:1", ChunkBytes: 1 << 30},
		{URL: "redis://127.0.0.1:1", TTL: -time.Second},
		{URL: "redis://127.0.0.1:1", LeaseTTL: time.Millisecond},
		{URL: "redis://127.0.0.1:1", Owner: "a b"},
	}
	for _, o := range bad {
		if _, err := remote.Open(ctx, o); err == nil {
			t.Errorf("Open(%+v) accepted", o)
		}
	}
	// Valid options, nothing listening: an error naming the store without
	// its password.
	_, err := remote.Open(ctx, remote.Options{URL: "redis://:secret@127.0.0.1:1/0", Timeout: 500 * time.Millisecond})
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("Open on a closed port: %v", err)
	}
}

func TestDurabilityReported(t *testing.T) {
	for _, fsync := range []string{"always", "everysec"} {
		srv := redistest.Start(t, redisserver.Options{AppendFsync: fsync})
		s, _ := open(t, srv, nil)
		if got, want := s.Durability(), "aof appendfsync="+fsync; got != want {
			t.Errorf("Durability() = %q, want %q", got, want)
		}
	}
	srv := redistest.Start(t, redisserver.Options{Args: []string{"--appendonly", "no"}})
	s, _ := open(t, srv, nil)
	if got := s.Durability(); got != "no aof" {
		t.Errorf("Durability() without AOF = %q", got)
	}
}

func TestBlobRoundTrip(t *testing.T) {
	s, srv := open(t, nil, nil)
	for _, n := range []int{0, 1, 1023, 1024, 1025, 3*1024 + 512, 20 * 1024} {
		id := fmt.Sprint("state-", n)
		data, aux := blobOf(n, byte(n)), []byte(fmt.Sprint("meta ", n))
		if err := s.PutBlob(ctx, "t1", id, data, aux); err != nil {
			t.Fatal(err)
		}
		got, info, err := s.GetBlob(ctx, "t1", id)
		if err != nil || !bytes.Equal(got, data) || info.Size != int64(n) || string(info.Aux) != string(aux) {
			t.Fatalf("GetBlob(%d bytes): %d bytes, %+v, %v", n, len(got), info, err)
		}
		if info, err := s.StatBlob(ctx, "t1", id); err != nil || info.Size != int64(n) {
			t.Fatalf("StatBlob: %+v %v", info, err)
		}
		// Another tenant does not see it.
		if _, _, err := s.GetBlob(ctx, "t2", id); !errors.Is(err, remote.ErrNotFound) {
			t.Fatalf("tenant t2 reads t1's blob: %v", err)
		}
	}
	// Replacing a blob leaves only the new generation's chunks.
	if err := s.PutBlob(ctx, "t1", "x", blobOf(5000, 1), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.PutBlob(ctx, "t1", "x", blobOf(2500, 2), nil); err != nil {
		t.Fatal(err)
	}
	// The old generation's chunks expire once no reader can still be on
	// them; the new ones have no TTL (Options.TTL is zero).
	keys, _ := raw(t, srv).Keys(ctx, "kvs:b:{t1:x}*").Result()
	var retiring int
	for _, k := range keys {
		if ttl, _ := raw(t, srv).PTTL(ctx, k).Result(); ttl > 0 {
			retiring++
		}
	}
	if len(keys) != 1+3+5 || retiring != 5 {
		t.Fatalf("after a replace, keys %v (%d expiring): want the manifest, 3 chunks and 5 expiring", keys, retiring)
	}
	if got, _, err := s.GetBlob(ctx, "t1", "x"); err != nil || !bytes.Equal(got, blobOf(2500, 2)) {
		t.Fatalf("replaced blob: %v", err)
	}
	if err := s.DeleteBlob(ctx, "t1", "x"); err != nil {
		t.Fatal(err)
	}
	keys, _ = raw(t, srv).Keys(ctx, "kvs:b:{t1:x}*").Result()
	for _, k := range keys {
		if ttl, _ := raw(t, srv).PTTL(ctx, k).Result(); ttl <= 0 {
			t.Fatalf("after delete, %s is kept (TTL %v)", k, ttl)
		}
	}
	if _, _, err := s.GetBlob(ctx, "t1", "x"); !errors.Is(err, remote.ErrNotFound) {
		t.Fatalf("deleted blob: %v", err)
	}
	if err := s.DeleteBlob(ctx, "t1", "x"); err != nil {
		t.Fatalf("deleting a missing blob: %v", err)
	}
	// Names that are not plain tokens are refused, not turned into keys.
	for _, id := range []string{"", "a}b", "a b", strings.Repeat("a", 201)} {
		if err := s.PutBlob(ctx, "t1", id, nil, nil); err == nil {
			t.Errorf("blob id %q accepted", id)
		}
	}
	if err := s.PutBlob(ctx, "t{1", "a", nil, nil); err == nil {
		t.Error("tenant with a brace accepted")
	}
	if err := s.PutBlob(ctx, "t1", "a", nil, make([]byte, remote.MaxAux+1)); err == nil {
		t.Error("oversized aux accepted")
	}
}

func TestBlobDamageNeverServed(t *testing.T) {
	s, srv := open(t, nil, nil)
	r := raw(t, srv)
	data := blobOf(4000, 9)
	put := func() {
		t.Helper()
		if err := s.PutBlob(ctx, "t1", "d", data, []byte("aux")); err != nil {
			t.Fatal(err)
		}
	}
	// chunk names chunk i of the current generation (the retired ones
	// are expiring).
	chunk := func(i int) string {
		t.Helper()
		keys, _ := r.Keys(ctx, fmt.Sprintf("kvs:b:{t1:d}:*:%d", i)).Result()
		var live []string
		for _, k := range keys {
			if ttl, _ := r.PTTL(ctx, k).Result(); ttl < 0 {
				live = append(live, k)
			}
		}
		if len(live) != 1 {
			t.Fatalf("chunk %d: keys %v", i, keys)
		}
		return live[0]
	}
	// A flipped byte in a chunk.
	put()
	k := chunk(2)
	b, _ := r.Get(ctx, k).Bytes()
	b[10] ^= 1
	r.Set(ctx, k, b, 0)
	if _, _, err := s.GetBlob(ctx, "t1", "d"); !errors.Is(err, durable.ErrCorrupt) {
		t.Fatalf("flipped chunk byte: %v", err)
	}
	// A truncated chunk.
	put()
	k = chunk(1)
	r.Set(ctx, k, b[:100], 0)
	if _, _, err := s.GetBlob(ctx, "t1", "d"); !errors.Is(err, durable.ErrCorrupt) {
		t.Fatalf("truncated chunk: %v", err)
	}
	// A missing chunk.
	put()
	r.Del(ctx, chunk(3))
	if _, _, err := s.GetBlob(ctx, "t1", "d"); !errors.Is(err, remote.ErrNotFound) {
		t.Fatalf("missing chunk: %v", err)
	}
	// A damaged manifest.
	put()
	m, _ := r.Get(ctx, "kvs:b:{t1:d}").Bytes()
	for _, pos := range []int{0, 6, 15, len(m) - 9, len(m) - 1} {
		mm := bytes.Clone(m)
		mm[pos] ^= 0x40
		r.Set(ctx, "kvs:b:{t1:d}", mm, 0)
		if _, _, err := s.GetBlob(ctx, "t1", "d"); !errors.Is(err, durable.ErrCorrupt) {
			t.Fatalf("manifest byte %d flipped: %v", pos, err)
		}
		if _, err := s.StatBlob(ctx, "t1", "d"); !errors.Is(err, durable.ErrCorrupt) {
			t.Fatalf("stat, manifest byte %d flipped: %v", pos, err)
		}
	}
	r.Set(ctx, "kvs:b:{t1:d}", m[:20], 0)
	if _, _, err := s.GetBlob(ctx, "t1", "d"); !errors.Is(err, durable.ErrCorrupt) {
		t.Fatalf("short manifest: %v", err)
	}
}

// A writer that dies between its chunks and its manifest leaves chunks
// no reader ever serves: the previous blob (or none) is what readers get.
func TestBlobHalfWrittenNeverServed(t *testing.T) {
	s, srv := open(t, nil, nil)
	r := raw(t, srv)
	if err := s.PutBlob(ctx, "t1", "h", blobOf(3000, 1), nil); err != nil {
		t.Fatal(err)
	}
	// The chunks of a newer generation, written without a manifest.
	for i := range 3 {
		r.Set(ctx, fmt.Sprintf("kvs:b:{t1:h}:%016x:%d", 42, i), blobOf(1024, 99), 0)
	}
	if got, _, err := s.GetBlob(ctx, "t1", "h"); err != nil || !bytes.Equal(got, blobOf(3000, 1)) {
		t.Fatalf("with a half-written newer blob: %v", err)
	}
	for i := range 2 {
		r.Set(ctx, fmt.Sprintf("kvs:b:{t1:new}:%016x:%d", 7, i), blobOf(1024, 5), 0)
	}
	if _, _, err := s.GetBlob(ctx, "t1", "new"); !errors.Is(err, remote.ErrNotFound) {
		t.Fatalf("chunks without a manifest served: %v", err)
	}
}

// Readers racing a writer that replaces a blob get one version or the
// other, whole, every time.
func TestBlobReplaceWhileReading(t *testing.T) {
	s, _ := open(t, nil, nil)
	a, b := blobOf(9000, 1), blobOf(5000, 2)
	if err := s.PutBlob(ctx, "t1", "r", a, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			v := a
			if i%2 == 0 {
				v = b
			}
			if err := s.PutBlob(ctx, "t1", "r", v, nil); err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		}
	})
	for range 300 {
		got, _, err := s.GetBlob(context.Background(), "t1", "r")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, a) && !bytes.Equal(got, b) {
			t.Fatalf("read a blob of %d bytes that is neither version", len(got))
		}
	}
}

func TestRecordsIdempotentAppend(t *testing.T) {
	s, _ := open(t, nil, nil)
	rec := func(i int) []byte { return []byte(fmt.Sprintf("record %d", i)) }
	if n, err := s.Append(ctx, "t1", "sess/1", nil, 0, rec(0), rec(1)); err != nil || n != 2 {
		t.Fatalf("append: %d %v", n, err)
	}
	// A retry of the same append (its answer was lost) adds nothing.
	if n, err := s.Append(ctx, "t1", "sess/1", nil, 0, rec(0), rec(1)); err != nil || n != 2 {
		t.Fatalf("retried append: %d %v", n, err)
	}
	// A retry overlapping new records adds only the new ones.
	if n, err := s.Append(ctx, "t1", "sess/1", nil, 1, rec(1), rec(2)); err != nil || n != 3 {
		t.Fatalf("overlapping append: %d %v", n, err)
	}
	// Other bytes at a taken position: a fork, refused.
	if _, err := s.Append(ctx, "t1", "sess/1", nil, 2, []byte("other")); !errors.Is(err, remote.ErrConflict) {
		t.Fatalf("conflicting append: %v", err)
	}
	if _, err := s.Append(ctx, "t1", "sess/1", nil, 5, rec(5)); !errors.Is(err, remote.ErrGap) {
		t.Fatalf("append past the end: %v", err)
	}
	got, err := s.Records(ctx, "t1", "sess/1", 0, 0)
	if err != nil || len(got) != 3 {
		t.Fatalf("records: %d %v", len(got), err)
	}
	for i, r := range got {
		if !bytes.Equal(r, rec(i)) {
			t.Fatalf("record %d = %q", i, r)
		}
	}
	if got, _ := s.Records(ctx, "t1", "sess/1", 1, 1); len(got) != 1 || !bytes.Equal(got[0], rec(1)) {
		t.Fatalf("records(1,1) = %q", got)
	}
	if got, err := s.Records(ctx, "t1", "nobody", 0, 0); err != nil || len(got) != 0 {
		t.Fatalf("unknown session: %q %v", got, err)
	}
	// A large append goes in several atomic steps and keeps its order.
	var many [][]byte
	for i := 3; i < 1000; i++ {
		many = append(many, rec(i))
	}
	if n, err := s.Append(ctx, "t1", "sess/1", nil, 3, many...); err != nil || n != 1000 {
		t.Fatalf("large append: %d %v", n, err)
	}
	all, _ := s.Records(ctx, "t1", "sess/1", 0, 0)
	for i, r := range all {
		if !bytes.Equal(r, rec(i)) {
			t.Fatalf("record %d = %q after a large append", i, r)
		}
	}
	if n, _ := s.RecordCount(ctx, "t1", "sess/1"); n != 1000 {
		t.Fatalf("count %d", n)
	}
	// Replace swaps the whole list at once (a tombstone for a deletion).
	if err := s.ReplaceRecords(ctx, "t1", "sess/2", []byte("a"), []byte("b")); err != nil {
		t.Fatal(err)
	}
	if err := s.ReplaceRecords(ctx, "t1", "sess/2", []byte("gone")); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Records(ctx, "t1", "sess/2", 0, 0); len(got) != 1 || string(got[0]) != "gone" {
		t.Fatalf("after replace: %q", got)
	}
}

func TestIndexLongestPrefix(t *testing.T) {
	s, _ := open(t, nil, nil)
	hashes := func(n int) []string {
		var h []string
		for i := range n {
			h = append(h, fmt.Sprintf("%016x", uint64(i+1)*0x9e3779b97f4a7c15))
		}
		return h
	}
	all := hashes(2000)
	if err := s.IndexPut(ctx, "t1", "fp1", all[:10], "state-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.IndexPut(ctx, "t1", "fp1", all[:1500], "state-b"); err != nil {
		t.Fatal(err)
	}
	got, err := s.IndexGet(ctx, "t1", "fp1", all)
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for i, id := range got {
		if id != "" {
			last = i
		}
	}
	if last != 1499 || got[last] != "state-b" || got[1500] != "" {
		t.Fatalf("longest prefix at %d (%q)", last, got[max(last, 0)])
	}
	// Another space (model) or tenant sees nothing.
	if got, _ := s.IndexGet(ctx, "t1", "fp2", all[:5]); strings.Join(got, "") != "" {
		t.Fatalf("another model's index: %q", got)
	}
	if got, _ := s.IndexGet(ctx, "t2", "fp1", all[:5]); strings.Join(got, "") != "" {
		t.Fatalf("another tenant's index: %q", got)
	}
	if _, err := s.IndexGet(ctx, "t1", "fp1", []string{"bad hash"}); err == nil {
		t.Fatal("a hash with a space accepted")
	}
}

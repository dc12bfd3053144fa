package respstore

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSaltOf(t *testing.T) {
	h := strings.Repeat("ab", 32)
	for _, c := range []struct{ key, salt string }{
		// multiprocess mode (native resp connector, fs, mooncake adapters)
		{"meta-llama/Llama-3-8B@00000000@0@" + h, ""},
		{"meta-llama/Llama-3-8B@00000000@0@" + h + "@user-a", "user-a"},
		{"meta-llama/Llama-3-8B@0000000a@1f@" + h + "@abc123", "abc123"},
		// before object groups: model@rank@hash[@salt]
		{"m@00000001@" + h, ""},
		{"m@00000001@" + h + "@tenant-x", "tenant-x"},
		// redis:// and valkey:// (CacheEngineKey), with the per-chunk suffix
		{"m@1@0@" + h + "@bfloat16", ""},
		{"m@1@0@" + h + "@bfloat16kv_bytes", ""},
		{"m@1@0@" + h + "@bfloat16@cache_salt%user-b", "user-b"},
		{"m@1@0@" + h + "@bfloat16@cache_salt%user-bkv_bytes", "user-b"},
		{"m@1@0@" + h + "@bfloat16@other%1@cache_salt%user-cmetadata", "user-c"},
		{"m@8@3@" + h + "@half@3", ""}, // a layer key
		// anything else
		{"plain-key", ""},
		{"a@b", ""},
		{"", ""},
	} {
		if got := SaltOf(c.key); got != c.salt {
			t.Errorf("SaltOf(%q) = %q, want %q", c.key, got, c.salt)
		}
	}
}

func TestBlobKeyRoundTrip(t *testing.T) {
	for _, c := range []struct {
		tenant string
		db     int
		key    string
	}{{"t_0123456789abcdef", 0, "k"}, {"u_alice", 15, "a@b@c"}, {"anonymous", 3, ""}} {
		tn, db, key, ok := parseBlobKey(blobKey(c.tenant, c.db, []byte(c.key)))
		if !ok || tn != c.tenant || db != c.db || key != c.key {
			t.Errorf("%+v: got %q %d %q %v", c, tn, db, key, ok)
		}
	}
	// A tenant cannot spell another's key: the length prefix differs.
	if blobKey("ab", 0, []byte("c")) == blobKey("a", 0, []byte("bc")) {
		t.Fatal("two tenants' keys collide")
	}
}

// Each tenant is kept within its quota by evicting its own least recently
// used keys; a salt within its salt quota by evicting that salt's keys.
func TestQuotas(t *testing.T) {
	s, addr := start(t, Options{Quota: 10 << 10, SaltQuota: 4 << 10})
	a, b := dial(t, addr), dial(t, addr)
	a.do("+OK\r\n", "AUTH", "a")
	b.do("+OK\r\n", "AUTH", "b")
	kb := strings.Repeat("x", 1<<10)
	// b fills 8 KiB of its own quota; a's traffic never touches it.
	for i := range 8 {
		b.do("+OK\r\n", "SET", "b"+strconv.Itoa(i), kb)
	}
	for i := range 10 {
		a.do("+OK\r\n", "SET", "a"+strconv.Itoa(i), kb)
	}
	a.do(bulk(kb), "GET", "a0") // a0 is now the most recently used
	a.do("+OK\r\n", "SET", "a10", kb)
	a.do(":1\r\n", "EXISTS", "a0")
	a.do(":0\r\n", "EXISTS", "a1") // the least recently used went
	a.do(":10\r\n", "DBSIZE")
	b.do(":8\r\n", "DBSIZE")
	// A value larger than the whole quota is refused, nothing evicted.
	a.do("-OOM value exceeds the quota: 11264 bytes, the tenant's quota is 10240\r\n", "SET", "huge", strings.Repeat("y", 11<<10))
	a.do(":10\r\n", "DBSIZE")
	// Salts: each user-x key is 1 KiB, the salt holds 4.
	h := strings.Repeat("cd", 32)
	salted := func(i int, salt string) string {
		return "m@00000000@0@" + h[:60] + strconv.Itoa(1000+i) + "@" + salt
	}
	for i := range 6 {
		b.do("+OK\r\n", "SET", salted(i, "user-x"), kb)
	}
	b.do(":0\r\n", "EXISTS", salted(0, "user-x"), salted(1, "user-x"))
	b.do(":4\r\n", "EXISTS", salted(2, "user-x"), salted(3, "user-x"), salted(4, "user-x"), salted(5, "user-x"))
	// ... and the tenant's quota (10 KiB) evicted b's own oldest plain
	// keys for the first four salted ones.
	b.do(":0\r\n", "EXISTS", "b0", "b1")
	b.do(":6\r\n", "EXISTS", "b2", "b3", "b4", "b5", "b6", "b7")
	for _, ts := range s.Stats().Tenants {
		if ts.Bytes != 10<<10 || ts.TierBytes["working"] != 10<<10 || ts.Keys != 10 {
			t.Errorf("tenant %s: %d bytes (%v by tier) in %d keys, want 10 KiB in 10", ts.Tenant, ts.Bytes, ts.TierBytes, ts.Keys)
		}
	}
}

// A users file's accounts are the only ones; each has its quota.
func TestUsersFile(t *testing.T) {
	us, err := ParseUsers(strings.NewReader("# accounts\nalice s3cret 2KiB\n\nbob hunter2\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, addr := start(t, Options{Users: us})
	r := dial(t, addr)
	r.do("-WRONGPASS invalid username-password pair or user is disabled.\r\n", "AUTH", "alice", "wrong")
	r.do("-WRONGPASS invalid username-password pair or user is disabled.\r\n", "AUTH", "mallory", "s3cret")
	r.do("-WRONGPASS invalid username-password pair or user is disabled.\r\n", "AUTH", "s3cret")
	r.do("+OK\r\n", "AUTH", "alice", "s3cret")
	r.do("-OOM value exceeds the quota: 3072 bytes, the tenant's quota is 2048\r\n", "SET", "k", strings.Repeat("z", 3<<10))
	r.do("+OK\r\n", "SET", "k", "v")
	for _, bad := range []string{"x", "a b c d", "bad/name pw", "dup pw\ndup pw", "u pw 0"} {
		if _, err := ParseUsers(strings.NewReader(bad)); err == nil {
			t.Errorf("users file %q accepted", bad)
		}
	}
}

func TestAnonymous(t *testing.T) {
	_, addr := start(t, Options{AllowAnonymous: true})
	r, other := dial(t, addr), dial(t, addr)
	r.do("+OK\r\n", "SET", "k", "v")
	other.do(bulk("v"), "GET", "k")
	other.do("+OK\r\n", "AUTH", "pw")
	other.do("$-1\r\n", "GET", "k") // its own tenant now
}

// manualClock is a clock tests move by hand; its After never fires.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) After(time.Duration) <-chan time.Time { return nil }

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// SET … EX (LMCache's valkey:// connector with a TTL) and the other
// options of SET.
func TestExpiryAndSetOptions(t *testing.T) {
	clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
	_, addr := start(t, Options{Clock: clk})
	r := dial(t, addr)
	r.do("+OK\r\n", "AUTH", "pw")
	r.do("+OK\r\n", "SET", "k", "v", "EX", "10")
	r.do(":10\r\n", "TTL", "k")
	r.do("+OK\r\n", "SET", "plain", "v")
	r.do(":-1\r\n", "TTL", "plain")
	r.do(":-2\r\n", "TTL", "missing")
	clk.advance(11 * time.Second)
	r.do("$-1\r\n", "GET", "k")
	r.do(":0\r\n", "EXISTS", "k")
	r.do("$-1\r\n", "SET", "plain", "w", "NX")
	r.do("+OK\r\n", "SET", "plain", "w", "XX", "PX", "5000")
	r.do("$-1\r\n", "SET", "absent", "w", "XX")
	r.do("+OK\r\n", "SET", "plain", "x", "KEEPTTL")
	r.do(":5000\r\n", "PTTL", "plain")
	r.do("-ERR syntax error\r\n", "SET", "k", "v", "NX", "XX")
	r.do("-ERR invalid expire time in 'set' command\r\n", "SET", "k", "v", "EX", "0")
	r.do("-ERR syntax error\r\n", "SET", "k", "v", "EX")
	r.do("-ERR wrong number of arguments for 'get' command\r\n", "GET")
}

// What a previous process wrote to disk is served again; a file that
// fails its checks is a miss, never served, and quarantined.
func TestRestartAndCorruption(t *testing.T) {
	dir := t.TempDir()
	s, addr := start(t, Options{Dir: dir})
	r := dial(t, addr)
	r.do("+OK\r\n", "AUTH", "pw")
	vals := map[string][]byte{}
	for i := range 5 {
		v := make([]byte, 100_000+i) // random: the payload is most of the file
		rand.Read(v)
		vals["k"+strconv.Itoa(i)] = v
		r.do("+OK\r\n", "SET", "k"+strconv.Itoa(i), string(v))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	inv, err := Inspect(dir)
	if err != nil || inv.Values != 5 || len(inv.Tenants) != 1 || inv.Tenants[0].Keys != 5 || inv.Bytes != 5*100_000+10 {
		t.Fatalf("inspect: %+v %v", inv, err)
	}
	// Corrupt one block file: flip a byte in its payload.
	var files []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.Contains(p, "quarantine") {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 5 {
		t.Fatalf("%d files on disk, want 5: %v", len(files), files)
	}
	b, _ := os.ReadFile(files[0])
	b[len(b)/2] ^= 0xff
	os.WriteFile(files[0], b, 0o644)

	s2, addr2 := start(t, Options{Dir: dir})
	if s2.Loaded() != 5 {
		t.Fatalf("loaded %d values, want 5", s2.Loaded())
	}
	r2 := dial(t, addr2)
	r2.do("+OK\r\n", "AUTH", "pw")
	served, missed := 0, 0
	for k, v := range vals {
		r2.send(cmd("GET", k))
		got := r2.reply()
		switch got {
		case bulk(string(v)):
			served++
		case "$-1\r\n":
			missed++
		default:
			t.Fatalf("GET %s: %d bytes that are neither the value nor a miss", k, len(got))
		}
	}
	if served != 4 || missed != 1 {
		t.Fatalf("served %d, missed %d; want 4 and 1", served, missed)
	}
	if q := s2.cache.Store().Quarantined(); len(q) != 1 {
		t.Fatalf("quarantined %v", q)
	}
}

// Malformed and oversized requests: a Redis-shaped protocol error, then
// the connection closes; before AUTH nothing large is buffered.
func TestHostileRequests(t *testing.T) {
	_, addr := start(t, Options{MaxValueBytes: 1 << 20})
	for _, c := range []struct{ send, want string }{
		{"*1\r\n$3\r\nGET\r\n*2\r\n$3\r\nGET\r\n$99999\r\nk\r\n", "-NOAUTH Authentication required.\r\n-ERR Protocol error: invalid bulk length\r\n"},
		{"*11\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"*x\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"*1\r\n:3\r\n", "-ERR Protocol error: expected ':', got ':'\r\n"[:0] + "-ERR Protocol error: expected '$', got ':'\r\n"},
		{"*1\r\n$3\r\nGETxx", "-ERR Protocol error: invalid bulk length\r\n"},
		{"GET \"unbalanced\r\n", "-ERR Protocol error: unbalanced quotes in request\r\n"},
		{"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1048577\r\n", "+OK\r\n-ERR Protocol error: invalid bulk length\r\n"},
	} {
		r := dial(t, addr)
		r.send([]byte(c.send))
		r.expect(c.want)
		if _, err := r.br.ReadByte(); err == nil {
			t.Errorf("%q: connection still open after a protocol error", c.send)
		}
	}
	// Inline commands and blank lines work, as with Redis.
	r := dial(t, addr)
	r.send([]byte("\r\nAUTH pw\r\nSET 'a b' \"c\\x41d\"\r\nGET \"a b\"\r\n"))
	r.expect("+OK\r\n+OK\r\n" + bulk("cAd"))
}

// The in-flight budget bounds the memory connections hold for values
// being received: a value waits for room, and one that never arrives
// whole gives its bytes back.
func TestInflightBudget(t *testing.T) {
	s, addr := start(t, Options{MaxValueBytes: 1 << 20, MaxInflightBytes: 1 << 20})
	half := strings.Repeat("h", 600<<10)
	// A client announces 600 KiB and sends half of it, then leaves.
	x := dial(t, addr)
	x.do("+OK\r\n", "AUTH", "pw")
	x.send([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$614400\r\n" + half[:300<<10]))
	deadline := time.Now().Add(10 * time.Second)
	for s.inflight.TryAcquire(1<<20) && time.Now().Before(deadline) {
		s.inflight.Release(1 << 20) // not yet holding: wait for the reader
		time.Sleep(time.Millisecond)
	}
	// Another 600 KiB value must wait for the first's bytes.
	y := dial(t, addr)
	y.do("+OK\r\n", "AUTH", "pw")
	done := make(chan struct{})
	go func() {
		y.do("+OK\r\n", "SET", "k2", half)
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("a value was received beyond the in-flight budget")
	case <-time.After(300 * time.Millisecond):
	}
	x.c.Close() // its bytes come back
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the budget was not given back by a connection that left mid-value")
	}
	if !s.inflight.TryAcquire(1 << 20) {
		t.Fatal("budget still held after both commands ended")
	}
	s.inflight.Release(1 << 20)
}

func TestErrQuotaIsClassified(t *testing.T) {
	ix := newIndex(func(string) int64 { return 10 }, 0)
	if _, err := ix.reserve(ix.tenant("t"), "k", "", 11); !errors.Is(err, ErrQuota) {
		t.Fatalf("reserve over the quota: %v", err)
	}
}

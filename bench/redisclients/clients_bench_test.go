package redisclients

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
	"github.com/redis/go-redis/v9"
	"github.com/valkey-io/valkey-go"
)

// client is the workload, as each library best expresses it.
type client interface {
	// appendRecords pushes recs onto a list and refreshes its TTL in one
	// pipeline.
	appendRecords(ctx context.Context, key string, recs [][]byte) error
	mget(ctx context.Context, keys []string) (found int, err error)
	// putChunks and getChunks move one blob as chunks in one pipeline.
	putChunks(ctx context.Context, keys []string, chunks [][]byte) error
	getChunks(ctx context.Context, keys []string) (int, error)
	// lease takes, renews and releases a lease on key.
	lease(ctx context.Context, key, owner string) error
	close()
}

const (
	renewLua   = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0`
	releaseLua = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`
	ttl        = 10 * time.Minute
)

type goredis struct {
	c              *redis.Client
	renew, release *redis.Script
}

func newGoredis(url string) (client, error) {
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	return &goredis{c: redis.NewClient(o), renew: redis.NewScript(renewLua), release: redis.NewScript(releaseLua)}, nil
}

func (g *goredis) appendRecords(ctx context.Context, key string, recs [][]byte) error {
	p := g.c.Pipeline()
	for _, r := range recs {
		p.RPush(ctx, key, r)
	}
	p.PExpire(ctx, key, ttl)
	_, err := p.Exec(ctx)
	return err
}

func (g *goredis) mget(ctx context.Context, keys []string) (int, error) {
	vals, err := g.c.MGet(ctx, keys...).Result()
	n := 0
	for _, v := range vals {
		if v != nil {
			n++
		}
	}
	return n, err
}

func (g *goredis) putChunks(ctx context.Context, keys []string, chunks [][]byte) error {
	p := g.c.Pipeline()
	for i, k := range keys {
		p.Set(ctx, k, chunks[i], ttl)
	}
	_, err := p.Exec(ctx)
	return err
}

func (g *goredis) getChunks(ctx context.Context, keys []string) (int, error) {
	p := g.c.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = p.Get(ctx, k)
	}
	if _, err := p.Exec(ctx); err != nil {
		return 0, err
	}
	n := 0
	for _, c := range cmds {
		b, err := c.Bytes()
		if err != nil {
			return 0, err
		}
		n += len(b)
	}
	return n, nil
}

func (g *goredis) lease(ctx context.Context, key, owner string) error {
	ok, err := g.c.SetNX(ctx, key, owner, 10*time.Second).Result()
	if err != nil || !ok {
		return fmt.Errorf("setnx %v %v", ok, err)
	}
	if n, err := g.renew.Run(ctx, g.c, []string{key}, owner, 10000).Int(); err != nil || n != 1 {
		return fmt.Errorf("renew %d %v", n, err)
	}
	if n, err := g.release.Run(ctx, g.c, []string{key}, owner).Int(); err != nil || n != 1 {
		return fmt.Errorf("release %d %v", n, err)
	}
	return nil
}

func (g *goredis) close() { g.c.Close() }

type valkeygo struct {
	c              valkey.Client
	renew, release *valkey.Lua
}

func newValkey(url string) (client, error) {
	o, err := valkey.ParseURL(url)
	if err != nil {
		return nil, err
	}
	o.DisableCache = true // no client-side caching: the tier reads each key rarely
	c, err := valkey.NewClient(o)
	if err != nil {
		return nil, err
	}
	return &valkeygo{c: c, renew: valkey.NewLuaScript(renewLua), release: valkey.NewLuaScript(releaseLua)}, nil
}

func (v *valkeygo) appendRecords(ctx context.Context, key string, recs [][]byte) error {
	cmds := make(valkey.Commands, 0, len(recs)+1)
	for _, r := range recs {
		cmds = append(cmds, v.c.B().Rpush().Key(key).Element(valkey.BinaryString(r)).Build())
	}
	cmds = append(cmds, v.c.B().Pexpire().Key(key).Milliseconds(ttl.Milliseconds()).Build())
	for _, r := range v.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

func (v *valkeygo) mget(ctx context.Context, keys []string) (int, error) {
	msgs, err := v.c.Do(ctx, v.c.B().Mget().Key(keys...).Build()).ToArray()
	n := 0
	for _, m := range msgs {
		if !m.IsNil() {
			n++
		}
	}
	return n, err
}

func (v *valkeygo) putChunks(ctx context.Context, keys []string, chunks [][]byte) error {
	cmds := make(valkey.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = v.c.B().Set().Key(k).Value(valkey.BinaryString(chunks[i])).Px(ttl).Build()
	}
	for _, r := range v.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

func (v *valkeygo) getChunks(ctx context.Context, keys []string) (int, error) {
	cmds := make(valkey.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = v.c.B().Get().Key(k).Build()
	}
	n := 0
	for _, r := range v.c.DoMulti(ctx, cmds...) {
		b, err := r.AsBytes()
		if err != nil {
			return 0, err
		}
		n += len(b)
	}
	return n, nil
}

func (v *valkeygo) lease(ctx context.Context, key, owner string) error {
	err := v.c.Do(ctx, v.c.B().Set().Key(key).Value(owner).Nx().Px(10*time.Second).Build()).Error()
	if err != nil {
		return fmt.Errorf("set nx: %v", err)
	}
	if n, err := v.renew.Exec(ctx, v.c, []string{key}, []string{owner, "10000"}).AsInt64(); err != nil || n != 1 {
		return fmt.Errorf("renew %d %v", n, err)
	}
	if n, err := v.release.Exec(ctx, v.c, []string{key}, []string{owner}).AsInt64(); err != nil || n != 1 {
		return fmt.Errorf("release %d %v", n, err)
	}
	return nil
}

func (v *valkeygo) close() { v.c.Close() }

var libs = []struct {
	name string
	open func(url string) (client, error)
}{{"go-redis", newGoredis}, {"valkey-go", newValkey}}

var (
	srvOnce sync.Once
	srv     *redisserver.Server
	srvErr  error
)

func server(b *testing.B) string {
	srvOnce.Do(func() {
		srv, srvErr = redisserver.Start(context.Background(), redisserver.Options{AppendFsync: "everysec"})
	})
	if srvErr != nil {
		b.Skip(srvErr)
	}
	return srv.URL()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if srv != nil {
		srv.Close()
	}
	if code != 0 {
		panic(code)
	}
}

func each(b *testing.B, f func(b *testing.B, c client)) {
	url := server(b)
	for _, l := range libs {
		b.Run(l.name, func(b *testing.B) {
			c, err := l.open(url)
			if err != nil {
				b.Fatal(err)
			}
			defer c.close()
			b.ReportAllocs()
			f(b, c)
		})
	}
}

func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*31)
	}
	return b
}

// BenchmarkAppend: one turn's records (8 of 300 bytes) and a TTL refresh
// in one pipeline.
func BenchmarkAppend(b *testing.B) {
	recs := make([][]byte, 8)
	for i := range recs {
		recs[i] = payload(300, byte(i))
	}
	each(b, func(b *testing.B, c client) {
		ctx := context.Background()
		for i := 0; b.Loop(); i++ {
			if err := c.appendRecords(ctx, "append:"+strconv.Itoa(i%64), recs); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkMGet: a longest-prefix lookup of n prefix-hash keys, one in
// four present (values are 40-byte state ids).
func BenchmarkMGet(b *testing.B) {
	for _, n := range []int{50, 500, 2000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("idx:{t1:fp}:%016x", uint64(i)*0x9e3779b97f4a7c15)
			}
			each(b, func(b *testing.B, c client) {
				ctx := context.Background()
				var sets, vals [][]byte
				var ks []string
				for i := 0; i < n; i += 4 {
					ks = append(ks, keys[i])
					vals = append(vals, payload(40, byte(i)))
				}
				_ = sets
				if err := c.putChunks(ctx, ks, vals); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					found, err := c.mget(ctx, keys)
					if err != nil || found != len(ks) {
						b.Fatalf("found %d of %d: %v", found, len(ks), err)
					}
				}
			})
		})
	}
}

// BenchmarkBlob: a state of size bytes as 4 MiB chunks, put then got.
func BenchmarkBlob(b *testing.B) {
	const chunk = 4 << 20
	for _, size := range []int{4 << 20, 64 << 20} {
		blob := payload(size, 7)
		var keys []string
		var chunks [][]byte
		for off := 0; off < size; off += chunk {
			keys = append(keys, fmt.Sprintf("blob:{t1:s}:%d", off/chunk))
			chunks = append(chunks, blob[off:min(size, off+chunk)])
		}
		b.Run(fmt.Sprintf("put/%dMiB", size>>20), func(b *testing.B) {
			each(b, func(b *testing.B, c client) {
				b.SetBytes(int64(size))
				for b.Loop() {
					if err := c.putChunks(context.Background(), keys, chunks); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
		b.Run(fmt.Sprintf("get/%dMiB", size>>20), func(b *testing.B) {
			each(b, func(b *testing.B, c client) {
				if err := c.putChunks(context.Background(), keys, chunks); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(size))
				for b.Loop() {
					if n, err := c.getChunks(context.Background(), keys); err != nil || n != size {
						b.Fatalf("got %d bytes: %v", n, err)
					}
				}
			})
		})
	}
}

// BenchmarkLease: SET NX PX, Lua compare-and-renew, Lua compare-and-delete.
func BenchmarkLease(b *testing.B) {
	each(b, func(b *testing.B, c client) {
		for b.Loop() {
			if err := c.lease(context.Background(), "lease:{t1:s}", "10.0.0.1:8080/abc"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLeaseDuringBlobs: the lease cycle while another goroutine gets
// 64 MiB blobs through the same client; a client that multiplexes one
// connection makes the lease wait behind the blob.
func BenchmarkLeaseDuringBlobs(b *testing.B) {
	const size, chunk = 64 << 20, 4 << 20
	blob := payload(size, 3)
	var keys []string
	var chunks [][]byte
	for off := 0; off < size; off += chunk {
		keys = append(keys, fmt.Sprintf("bg:{t1:s}:%d", off/chunk))
		chunks = append(chunks, blob[off:off+chunk])
	}
	each(b, func(b *testing.B, c client) {
		ctx, cancel := context.WithCancel(context.Background())
		if err := c.putChunks(ctx, keys, chunks); err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		var moved atomic.Int64
		wg.Go(func() {
			for ctx.Err() == nil {
				if n, err := c.getChunks(ctx, keys); err == nil {
					moved.Add(int64(n))
				}
			}
		})
		var worst time.Duration
		for b.Loop() {
			t := time.Now()
			if err := c.lease(context.Background(), "lease2:{t1:s}", "10.0.0.1:8080/abc"); err != nil {
				b.Fatal(err)
			}
			worst = max(worst, time.Since(t))
		}
		cancel()
		wg.Wait()
		b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
		b.ReportMetric(float64(moved.Load())/float64(1<<20)/b.Elapsed().Seconds(), "bg-MiB/s")
	})
}

// BenchmarkIdleHeap: heap held by a connected client after one command of
// each kind (connection buffers included).
func BenchmarkIdleHeap(b *testing.B) {
	url := server(b)
	for _, l := range libs {
		b.Run(l.name, func(b *testing.B) {
			var held uint64
			for b.Loop() {
				var m0, m1 runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m0)
				c, err := l.open(url)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if err := c.appendRecords(ctx, "idle", [][]byte{[]byte("x")}); err != nil {
					b.Fatal(err)
				}
				if _, err := c.mget(ctx, []string{"idle:a", "idle:b"}); err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&m1)
				held = m1.HeapInuse - m0.HeapInuse
				c.close()
			}
			b.ReportMetric(float64(held)/1024, "heap-KiB")
		})
	}
}

package respstore

import (
	"context"
	"crypto/rand"
	"testing"

	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver/redistest"
	"github.com/kvsidecar/kvsidecar/remote"
)

// With --remote (a fleet's Redis), a value SET on one sidecar is written
// through behind the client and read through by another whose own tiers
// miss it; a DEL deletes it there too.
func TestRemoteWriteAndReadThrough(t *testing.T) {
	srv := redistest.Start(t, redisserver.Options{AppendFsync: "everysec"})
	rs, err := remote.Open(context.Background(), remote.Options{URL: srv.URL(), Prefix: "resp-test", Owner: "a:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	a, addrA := start(t, Options{Remote: rs})
	_, addrB := start(t, Options{Remote: rs})
	v := make([]byte, 3<<20)
	rand.Read(v)
	ra := dial(t, addrA)
	ra.do("+OK\r\n", "AUTH", "fleet-key")
	ra.do("+OK\r\n", "SET", "m@00000000@0@abcd", string(v))
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	rb := dial(t, addrB)
	rb.do("+OK\r\n", "AUTH", "fleet-key")
	rb.do(":1\r\n", "EXISTS", "m@00000000@0@abcd")
	rb.do(bulk(string(v)), "GET", "m@00000000@0@abcd")
	// Another tenant of the same fleet finds nothing.
	rc := dial(t, addrB)
	rc.do("+OK\r\n", "AUTH", "other-key")
	rc.do(":0\r\n", "EXISTS", "m@00000000@0@abcd")
	rc.do("$-1\r\n", "GET", "m@00000000@0@abcd")
	// B now holds it locally too; a DEL there removes it from the store,
	// so a third replica misses it.
	rb.do(":1\r\n", "DEL", "m@00000000@0@abcd")
	_, addrC := start(t, Options{Remote: rs})
	rx := dial(t, addrC)
	rx.do("+OK\r\n", "AUTH", "fleet-key")
	rx.do("$-1\r\n", "GET", "m@00000000@0@abcd")
}

package respstore

import (
	"bytes"
	"crypto/rand"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvsidecar/kvsidecar/internal/obs"
)

// The replies LMCache's native resp connector compares byte for byte
// (csrc/storage_backends/redis/connector.cpp): AUTH and SET "+OK\r\n",
// EXISTS and DEL ":1\r\n" or ":0\r\n", GET "$<len>\r\n<bytes>\r\n" or
// "$-1\r\n".
func TestStrictReplies(t *testing.T) {
	_, addr := start(t, Options{})
	r := dial(t, addr)
	r.do("-NOAUTH Authentication required.\r\n", "GET", "k")
	r.do("+OK\r\n", "AUTH", "lmcache", "secret")
	key := "meta-llama/Llama-3-8B@00000000@0@" + strings.Repeat("ab", 32)
	r.do(":0\r\n", "EXISTS", key)
	r.do("$-1\r\n", "GET", key)
	r.do(":0\r\n", "DEL", key)
	r.do("+OK\r\n", "SET", key, "value")
	r.do(":1\r\n", "EXISTS", key)
	r.do(bulk("value"), "GET", key)
	r.do(":1\r\n", "DEL", key)
	r.do(":0\r\n", "EXISTS", key)
	r.do("$-1\r\n", "GET", key)
	r.do("-WRONGPASS invalid username-password pair or user is disabled.\r\n", "AUTH", "x", "")
}

// Values of every size up to 64 MiB come back byte-exact, through the
// small and the large paths of the parser and the writer.
func TestValuesByteExact(t *testing.T) {
	_, addr := start(t, Options{RAMBytes: 64 << 20})
	r := dial(t, addr)
	r.do("+OK\r\n", "AUTH", "pw")
	for _, n := range []int{0, 1, smallArg - 1, smallArg, smallArg + 1, bigReply - 1, bigReply, 1 << 20, 8<<20 + 3, 64 << 20} {
		v := make([]byte, n)
		rand.Read(v)
		k := "k" + strconv.Itoa(n)
		r.do("+OK\r\n", "SET", k, string(v))
		r.do(bulk(string(v)), "GET", k)
	}
}

// Pipelined commands are answered in order, across small and large
// replies.
func TestPipelineInOrder(t *testing.T) {
	_, addr := start(t, Options{})
	r := dial(t, addr)
	big := string(bytes.Repeat([]byte("x"), 1<<20))
	var req bytes.Buffer
	var want strings.Builder
	req.Write(cmd("AUTH", "pw"))
	want.WriteString("+OK\r\n")
	for i := range 50 {
		k := "k" + strconv.Itoa(i)
		v := strconv.Itoa(i)
		if i%10 == 0 {
			v = big + v
		}
		req.Write(cmd("SET", k, v))
		req.Write(cmd("GET", k))
		req.Write(cmd("EXISTS", k, "nope"))
		req.Write(cmd("NOSUCH", k))
		want.WriteString("+OK\r\n" + bulk(v) + ":1\r\n-ERR unknown command 'NOSUCH', with args beginning with: '" + k + "' \r\n")
	}
	req.Write(cmd("QUIT"))
	want.WriteString("+OK\r\n")
	r.send(req.Bytes())
	r.expect(want.String())
}

// Tenants never see each other's keys; the same credentials are the same
// tenant on any connection.
func TestTenantsApart(t *testing.T) {
	_, addr := start(t, Options{})
	a, b, a2 := dial(t, addr), dial(t, addr), dial(t, addr)
	a.do("+OK\r\n", "AUTH", "alice", "pa")
	b.do("+OK\r\n", "AUTH", "bob", "pb")
	a2.do("+OK\r\n", "AUTH", "alice", "pa")
	a.do("+OK\r\n", "SET", "shared-name", "alice's")
	b.do("$-1\r\n", "GET", "shared-name")
	b.do(":0\r\n", "EXISTS", "shared-name")
	b.do(":0\r\n", "DEL", "shared-name")
	b.do(":0\r\n", "DBSIZE")
	b.do("+OK\r\n", "FLUSHALL")
	b.do("+OK\r\n", "SET", "shared-name", "bob's")
	a2.do(bulk("alice's"), "GET", "shared-name")
	b.do(bulk("bob's"), "GET", "shared-name")
	// Another database of the same tenant is another namespace.
	a.do("+OK\r\n", "SELECT", "1")
	a.do("$-1\r\n", "GET", "shared-name")
	a.do("-ERR DB index is out of range\r\n", "SELECT", "16")
}

// /metrics shows each tenant's hits, misses, bytes by tier and evictions,
// and the store's tiers, through the sidecar's one registry.
func TestMetrics(t *testing.T) {
	reg := obs.New()
	_, addr := start(t, Options{Metrics: reg, Quota: 1 << 10})
	r := dial(t, addr)
	r.do("+OK\r\n", "AUTH", "pw")
	r.do("+OK\r\n", "SET", "a", strings.Repeat("x", 600))
	r.do("+OK\r\n", "SET", "b", strings.Repeat("y", 600)) // evicts a
	r.do("$-1\r\n", "GET", "a")
	r.do(bulk(strings.Repeat("y", 600)), "GET", "b")
	var b bytes.Buffer
	reg.WritePrometheus(&b)
	tenant := `tenant="t_` // the hash of "pw"
	for _, want := range []string{
		"sidecar_resp_tenant_hits_total{" + tenant,
		"sidecar_resp_tenant_misses_total{" + tenant,
		"sidecar_resp_tenant_evictions_total{" + tenant,
		`sidecar_resp_tenant_bytes{` + tenant,
		`sidecar_resp_tier_bytes{tier="working"} 600`,
		`sidecar_resp_commands_total{command="SET"} 2`,
		"# HELP sidecar_resp_tenant_hits_total GETs that found a value",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !regexp.MustCompile(`sidecar_resp_tenant_evictions_total\{tenant="t_[0-9a-f]{16}"\} 1\n`).MatchString(b.String()) {
		t.Errorf("eviction not counted:\n%s", b.String())
	}
}

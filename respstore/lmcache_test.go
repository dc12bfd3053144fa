package respstore

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// nativeConn replays LMCache's native RESP connector
// (csrc/storage_backends/redis/connector.cpp, WorkerConn and
// RedisConnector): the same bytes in the same writev parts, and its
// replies read exactly as it reads them (a fixed number of bytes compared
// with memcmp, or a header read byte by byte up to LF). The C++ itself is
// built and run against the listener by scripts/lmcache-native.sh (see
// docs/BENCHMARKS.md); this replay keeps its contract in `make test`.
type nativeConn struct {
	t testing.TB
	c net.Conn
}

func (n *nativeConn) sendMultipart(parts ...[]byte) {
	bufs := net.Buffers(parts)
	if _, err := bufs.WriteTo(n.c); err != nil {
		n.t.Fatal(err)
	}
}

func (n *nativeConn) recvExactly(k int) []byte {
	b := make([]byte, k)
	if _, err := io.ReadFull(n.c, b); err != nil {
		n.t.Fatalf("recv_exactly(%d): %v (%q)", k, err, b)
	}
	return b
}

func keyHeader(key string) []byte  { return fmt.Appendf(nil, "$%d\r\n%s\r\n", len(key), key) }
func sizeHeader(size int) []byte   { return fmt.Appendf(nil, "$%d\r\n", size) }
func (n *nativeConn) line() string { return n.readUntilLF(1 << 10) }

func (n *nativeConn) readUntilLF(max int) string {
	var b []byte
	for {
		c := n.recvExactly(1)
		b = append(b, c[0])
		if c[0] == '\n' {
			return string(b)
		}
		if len(b) > max {
			n.t.Fatalf("header too long: %q", b)
		}
	}
}

// authenticate_if_needed: AUTH user password (or AUTH password), then a
// line that must start with "+OK\r\n".
func (n *nativeConn) auth(user, pass string) {
	if user != "" {
		n.sendMultipart([]byte("*3\r\n$4\r\nAUTH\r\n"), keyHeader(user), keyHeader(pass))
	} else {
		n.sendMultipart([]byte("*2\r\n$4\r\nAUTH\r\n"), keyHeader(pass))
	}
	if l := n.line(); !strings.HasPrefix(l, "+OK\r\n") {
		n.t.Fatalf("AUTH: %q", l)
	}
}

// do_single_set: the reply must be exactly the 5 bytes "+OK\r\n".
func (n *nativeConn) set(key string, buf []byte) {
	n.sendMultipart([]byte("*3\r\n$3\r\nSET\r\n"), keyHeader(key), sizeHeader(len(buf)), buf, []byte("\r\n"))
	if got := n.recvExactly(5); string(got) != "+OK\r\n" {
		n.t.Fatalf("SET: response was not OK: %q", got)
	}
}

// do_single_get: a header up to LF that is "$-1\r\n" or exactly the size
// header, the payload, then exactly CRLF.
func (n *nativeConn) get(key string, buf []byte) bool {
	n.sendMultipart([]byte("*2\r\n$3\r\nGET\r\n"), keyHeader(key))
	h := n.readUntilLF(len(sizeHeader(len(buf))) + 32)
	if h == "$-1\r\n" {
		return false
	}
	if h != string(sizeHeader(len(buf))) {
		n.t.Fatalf("GET: size header mismatch: %q", h)
	}
	if _, err := io.ReadFull(n.c, buf); err != nil {
		n.t.Fatal(err)
	}
	if tr := n.recvExactly(2); string(tr) != "\r\n" {
		n.t.Fatalf("GET: trailer mismatch: %q", tr)
	}
	return true
}

// do_single_exists and do_single_delete: exactly ":1\r\n" or ":0\r\n".
func (n *nativeConn) flag(prefix, key string) bool {
	n.sendMultipart([]byte(prefix), keyHeader(key))
	switch got := string(n.recvExactly(4)); got {
	case ":1\r\n":
		return true
	case ":0\r\n":
		return false
	default:
		n.t.Fatalf("%q returned %q, not :0 or :1", prefix, got)
	}
	return false
}

func (n *nativeConn) exists(key string) bool { return n.flag("*2\r\n$6\r\nEXISTS\r\n", key) }
func (n *nativeConn) del(key string) bool    { return n.flag("*2\r\n$3\r\nDEL\r\n", key) }

// objectKey is the multiprocess mode's key (native_connector_l2_adapter.py
// _object_key_to_string): model@kv_rank:08x@object_group_id:x@hash[@salt].
func objectKey(model string, rank, group int, hash []byte, salt string) string {
	k := fmt.Sprintf("%s@%08x@%x@%x", model, rank, group, hash)
	if salt != "" {
		k += "@" + salt
	}
	return k
}

// LMCache's multiprocess mode with the resp L2 adapter: num_workers
// connections, each authenticating once, storing, looking up, retrieving
// and deleting fixed-size chunks; two LMCache deployments (two
// credentials) and a cache_salt never see each other's chunks.
func TestLMCacheNativeReplay(t *testing.T) {
	s, addr := start(t, Options{RAMBytes: 64 << 20})
	const workers, chunksPerWorker, chunk = 8, 4, 1 << 20
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Minute))
			n := &nativeConn{t: t, c: c}
			user := "vllm"
			if w%2 == 1 {
				user = "" // AUTH password alone: the hash of the password
			}
			n.auth(user, "deployment-"+strconv.Itoa(w%4))
			for i := range chunksPerWorker {
				hash := make([]byte, 32)
				rand.Read(hash)
				salt := ""
				if i%2 == 1 {
					salt = "user-" + strconv.Itoa(w)
				}
				key := objectKey("meta-llama/Llama-3.1-70B", w, 0, hash, salt)
				if n.exists(key) {
					t.Errorf("fresh key %s exists", key)
				}
				miss := make([]byte, chunk)
				if n.get(key, miss) {
					t.Errorf("fresh key %s served", key)
				}
				val := make([]byte, chunk)
				rand.Read(val)
				n.set(key, val)
				if !n.exists(key) {
					t.Errorf("stored key %s missing", key)
				}
				got := make([]byte, chunk)
				if !n.get(key, got) || !bytes.Equal(got, val) {
					t.Errorf("chunk %s not served byte-exact", key)
				}
				// Another deployment with the same key finds nothing.
				o, err := net.Dial("tcp", addr)
				if err != nil {
					t.Error(err)
					return
				}
				other := &nativeConn{t: t, c: o}
				other.auth("vllm", "another-deployment")
				if other.exists(key) || other.get(key, got) || other.del(key) {
					t.Errorf("another tenant reached %s", key)
				}
				o.Close()
				if i == chunksPerWorker-1 {
					if !n.del(key) || n.del(key) || n.exists(key) {
						t.Errorf("delete of %s", key)
					}
				}
			}
		})
	}
	wg.Wait()
	st := s.Stats()
	if st.Commands["AUTH"] < workers || st.Commands["SET"] != workers*chunksPerWorker {
		t.Fatalf("commands %v", st.Commands)
	}
}

// What clients send when they connect, in one pipelined write each, and
// the replies they need. redis-rs (GLIDE's core, which LMCache's valkey://
// connector runs): HELLO 3 AUTH user pass, SELECT when db ≠ 0, CLIENT
// SETINFO LIB-NAME and LIB-VER (glide-core/redis-rs/redis/src/connection.rs,
// connection_setup_pipeline). redis-py 5 and later: HELLO 3 AUTH default
// pass when it speaks RESP3 (redis-py 8's default), CLIENT SETINFO twice,
// SELECT (redis/connection.py, on_connect).
func TestConnectHandshakes(t *testing.T) {
	_, addr := start(t, Options{})
	hello := func(id string) string {
		return "%7\r\n" + bulk("server") + bulk("redis") + bulk("version") + bulk(redisVersion) +
			bulk("proto") + ":3\r\n" + bulk("id") + ":" + id + "\r\n" + bulk("mode") + bulk("standalone") +
			bulk("role") + bulk("master") + bulk("modules") + "*0\r\n"
	}
	// redis-rs / GLIDE, then the valkey:// connector's SET with a TTL.
	r := dial(t, addr)
	var b bytes.Buffer
	b.Write(cmd("HELLO", "3", "AUTH", "lmcache", "pw", "SETNAME", "glide"))
	b.Write(cmd("SELECT", "3"))
	b.Write(cmd("CLIENT", "SETINFO", "LIB-NAME", "GlideSync"))
	b.Write(cmd("CLIENT", "SETINFO", "LIB-VER", "2.1.0"))
	b.Write(cmd("INFO", "REPLICATION"))
	b.Write(cmd("SET", "m@1@0@abcdef@bfloat16", "kv", "EX", "86400"))
	b.Write(cmd("GET", "m@1@0@abcdef@bfloat16"))
	b.Write(cmd("GET", "absent"))
	b.Write(cmd("EXISTS", "m@1@0@abcdef@bfloat16"))
	b.Write(cmd("CLIENT", "GETNAME"))
	r.send(b.Bytes())
	r.expect(hello("1"))
	r.expect("+OK\r\n+OK\r\n+OK\r\n")
	info := r.reply()
	if !strings.HasPrefix(info, "$") || !strings.Contains(info, "role:master\r\n") {
		t.Fatalf("INFO REPLICATION: %q", info)
	}
	r.expect("+OK\r\n" + bulk("kv") + "_\r\n:1\r\n" + bulk("glide"))

	// redis-py 8 (RESP3), AUTH with a password alone: user "default".
	p := dial(t, addr)
	b.Reset()
	b.Write(cmd("HELLO", "3", "AUTH", "default", "pw"))
	b.Write(cmd("CLIENT", "SETINFO", "LIB-NAME", "redis-py"))
	b.Write(cmd("CLIENT", "SETINFO", "LIB-VER", "8.0.0"))
	b.Write(cmd("SELECT", "0"))
	b.Write(cmd("PING"))
	b.Write(cmd("GET", "m@1@0@abcdef@bfloat16")) // db 0 of that tenant: not there
	b.Write(cmd("SELECT", "3"))
	b.Write(cmd("GET", "m@1@0@abcdef@bfloat16")) // another tenant (lmcache:pw ≠ default:pw)
	p.send(b.Bytes())
	p.expect(hello("2") + "+OK\r\n+OK\r\n+OK\r\n+PONG\r\n_\r\n+OK\r\n_\r\n")

	// AUTH pw and HELLO 3 AUTH default pw are the same tenant; RESP2 nil.
	q := dial(t, addr)
	q.do("+OK\r\n", "AUTH", "pw")
	q.do("+OK\r\n", "SET", "same", "1")
	p.do("+OK\r\n", "SELECT", "0")
	p.do(bulk("1"), "GET", "same")
	q.do("$-1\r\n", "GET", "nothing")
	q.do("-NOPROTO unsupported protocol version\r\n", "HELLO", "4")
	q.do("*14\r\n"+bulk("server")+bulk("redis")+bulk("version")+bulk(redisVersion)+bulk("proto")+":2\r\n"+bulk("id")+":3\r\n"+
		bulk("mode")+bulk("standalone")+bulk("role")+bulk("master")+bulk("modules")+"*0\r\n", "HELLO", "2")
	// HELLO before AUTH without credentials is refused, as by Redis.
	u := dial(t, addr)
	u.send(cmd("HELLO", "3"))
	if l := u.reply(); !strings.HasPrefix(l, "-NOAUTH HELLO must be called") {
		t.Fatalf("HELLO 3 unauthenticated: %q", l)
	}
	u.do("-WRONGPASS invalid username-password pair or user is disabled.\r\n", "HELLO", "3", "AUTH", "u", "")
}

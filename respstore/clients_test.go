package respstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// requireEnv, set to 1 (as .ci/run does), turns a missing client into a
// failure instead of a skip: CI runs every real client.
const requireEnv = "KVSIDECAR_REQUIRE_REDIS"

func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv(requireEnv) == "1" {
			t.Fatalf("%s required ($%s=1): %v", name, requireEnv, err)
		}
		t.Skipf("no %s (apt-get install redis-tools python3-redis, or $%s=1 to fail instead)", name, requireEnv)
	}
	return p
}

// go-redis v9 connects with HELLO 3 AUTH user pass and CLIENT SETINFO,
// then speaks RESP3: a missing key is "_", which it reads as redis.Nil.
// RESP2 (Protocol: 2) starts with AUTH instead.
func TestGoRedis(t *testing.T) {
	s, addr := start(t, Options{})
	for _, proto := range []int{3, 2} {
		t.Run("resp"+strconv.Itoa(proto), func(t *testing.T) {
			ctx := context.Background()
			c := redis.NewClient(&redis.Options{Addr: addr, Username: "svc", Password: "pw" + strconv.Itoa(proto), Protocol: proto, DB: 2})
			defer c.Close()
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			v := make([]byte, 8<<20)
			rand.Read(v)
			if err := c.Set(ctx, "chunk", v, 0).Err(); err != nil {
				t.Fatal(err)
			}
			got, err := c.Get(ctx, "chunk").Bytes()
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("get: %v, equal %v", err, bytes.Equal(got, v))
			}
			if _, err := c.Get(ctx, "missing").Result(); !errors.Is(err, redis.Nil) {
				t.Fatalf("missing key: %v, want redis.Nil", err)
			}
			if n, err := c.Exists(ctx, "chunk", "missing", "chunk").Result(); err != nil || n != 2 {
				t.Fatalf("exists: %d %v", n, err)
			}
			cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := range 20 {
					p.Set(ctx, "p"+strconv.Itoa(i), i, time.Minute)
					p.Get(ctx, "p"+strconv.Itoa(i))
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 20 {
				if got := cmds[2*i+1].(*redis.StringCmd).Val(); got != strconv.Itoa(i) {
					t.Fatalf("pipelined get %d: %q", i, got)
				}
			}
			if ttl := c.TTL(ctx, "p3").Val(); ttl < 59*time.Second || ttl > time.Minute {
				t.Fatalf("ttl %v", ttl)
			}
			if n := c.Del(ctx, "chunk", "missing").Val(); n != 1 {
				t.Fatalf("del: %d", n)
			}
			if _, err := c.Do(ctx, "XADD", "s", "*", "a", "b").Result(); err == nil || !strings.Contains(err.Error(), "unknown command") {
				t.Fatalf("a command outside the subset: %v", err)
			}
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatalf("the connection after an unknown command: %v", err)
			}
		})
	}
	if cmds := s.Stats().Commands; cmds["HELLO"] < 2 { // HELLO 3 AUTH …, and HELLO 2 AUTH … with Protocol: 2
		t.Fatalf("go-redis connected without HELLO: %v", cmds)
	}
}

// redis-cli, RESP2 and RESP3 (-3), with --user and --pass.
func TestRedisCLI(t *testing.T) {
	cli := requireTool(t, "redis-cli")
	_, addr := start(t, Options{})
	host, port, _ := net.SplitHostPort(addr)
	run := func(in string, args ...string) string {
		t.Helper()
		all := append([]string{"-h", host, "-p", port, "--user", "ops", "--pass", "pw", "--no-auth-warning"}, args...)
		c := exec.Command(cli, all...)
		c.Stdin = strings.NewReader(in)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := run("", "SET", "greeting", "hello world"); out != "OK\n" {
		t.Fatalf("SET: %q", out)
	}
	if out := run("", "GET", "greeting"); out != "hello world\n" {
		t.Fatalf("GET: %q", out)
	}
	if out := run("", "-3", "GET", "nothing"); out != "\n" && out != "(nil)\n" {
		t.Fatalf("RESP3 GET of a missing key: %q", out)
	}
	if out := run("", "-3", "HELLO", "3"); !strings.Contains(out, "proto") || !strings.Contains(out, "3") {
		t.Fatalf("HELLO 3: %q", out)
	}
	// -x reads the last argument from stdin: a binary value.
	bin := string([]byte{0, 1, 2, '\r', '\n', 255})
	if out := run(bin, "-x", "SET", "bin"); out != "OK\n" {
		t.Fatalf("SET -x: %q", out)
	}
	if out := run("", "--no-raw", "STRLEN", "bin"); !strings.Contains(out, "unknown command") {
		t.Fatalf("STRLEN (outside the subset): %q", out)
	}
	if out := run("", "EXISTS", "bin", "greeting", "nothing"); out != "2\n" {
		t.Fatalf("EXISTS: %q", out)
	}
	if out := run("", "INFO", "keyspace"); !strings.Contains(out, "db0:keys=2") {
		t.Fatalf("INFO keyspace: %q", out)
	}
}

// redis-benchmark drives SET and GET of 64 KiB values over 4
// connections, pipelined 4 deep, and reports no error.
func TestRedisBenchmark(t *testing.T) {
	rb := requireTool(t, "redis-benchmark")
	_, addr := start(t, Options{})
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command(rb, "-h", host, "-p", port, "--user", "bench", "-a", "pw",
		"-t", "set,get", "-n", "400", "-c", "4", "-P", "4", "-d", "65536", "-r", "100", "-q").CombinedOutput()
	if err != nil {
		t.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	for _, op := range []string{"SET", "GET"} {
		if !regexp.MustCompile(op + `: [0-9.]+ requests per second`).Match(out) {
			t.Fatalf("no %s figure:\n%s", op, out)
		}
	}
	if bytes.Contains(bytes.ToLower(out), []byte("error")) {
		t.Fatalf("errors:\n%s", out)
	}
}

// python3 returns an interpreter that imports Debian's python3-redis.
func python3(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil && exec.Command(path, "-c", "import redis").Run() == nil {
			return path
		}
	}
	if os.Getenv(requireEnv) == "1" {
		t.Fatalf("python3 with redis-py required ($%s=1): apt-get install python3-redis", requireEnv)
	}
	t.Skipf("no python3 with redis-py (apt-get install python3-redis, or $%s=1 to fail instead)", requireEnv)
	return ""
}

// redis-py (Debian's), sync and asyncio, runs test/resp/redispy_client.py:
// plain commands, a pipeline, and LMCache's redis:// connector's exact
// sequence of calls (lmcache/v1/storage_backend/connector/redis_connector.py
// on redis.asyncio: EXISTS <key>metadata, SET <key>kv_bytes then
// <key>metadata, GET metadata then kv_bytes, DEL metadata).
func TestRedisPy(t *testing.T) {
	py := python3(t)
	_, addr := start(t, Options{})
	script, err := filepath.Abs("../test/resp/redispy_client.py")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, script, "redis://lmcache:secret@"+addr+"/0").CombinedOutput()
	if err != nil {
		t.Fatalf("redis-py: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("redis-py ok")) {
		t.Fatalf("redis-py did not finish:\n%s", out)
	}
	t.Logf("%s", out)
}

package redisserver_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver"
	"github.com/kvsidecar/kvsidecar/bench/harness/redisserver/redistest"
)

// do sends one command in RESP and returns the first reply line.
func do(t *testing.T, addr string, args ...string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(line, "$") && line != "$-1\r\n" {
		val, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(val)
	}
	return strings.TrimSpace(line)
}

func TestKillRestartKeepsAOF(t *testing.T) {
	for _, fsync := range []string{"always", "everysec"} {
		t.Run(fsync, func(t *testing.T) {
			s := redistest.Start(t, redisserver.Options{AppendFsync: fsync})
			addr := s.Addr()
			for i := range 100 {
				if got := do(t, addr, "SET", fmt.Sprint("k", i), fmt.Sprint("v", i)); got != "+OK" {
					t.Fatalf("SET: %s", got)
				}
			}
			s.Kill()
			if s.Running() {
				t.Fatal("running after Kill")
			}
			if err := s.Restart(context.Background()); err != nil {
				t.Fatal(err)
			}
			if s.Addr() != addr {
				t.Fatalf("address moved from %s to %s", addr, s.Addr())
			}
			// kill -9 of the process (not of the machine) loses nothing
			// the server answered, under either policy: the AOF write
			// happens before the reply.
			for i := range 100 {
				if got := do(t, addr, "GET", fmt.Sprint("k", i)); got != fmt.Sprint("v", i) {
					t.Fatalf("k%d after kill -9 and restart: %q", i, got)
				}
			}
		})
	}
}

func TestPasswordAndBadOptions(t *testing.T) {
	s := redistest.Start(t, redisserver.Options{Password: "pw"})
	if got := do(t, s.Addr(), "PING"); !strings.HasPrefix(got, "-NOAUTH") {
		t.Fatalf("PING without AUTH: %q", got)
	}
	if !strings.Contains(s.URL(), ":pw@") {
		t.Fatalf("URL %q lacks the password", s.URL())
	}
	if _, err := redisserver.Start(context.Background(), redisserver.Options{AppendFsync: "sometimes"}); err == nil {
		t.Fatal("AppendFsync sometimes accepted")
	}
}

func TestCloseRemovesTempDirAndStops(t *testing.T) {
	redistest.Require(t)
	s, err := redisserver.Start(context.Background(), redisserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	s.Close()
	s.Close()
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatalf("%s still accepts after Close", addr)
	}
}

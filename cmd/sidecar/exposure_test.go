package main

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Issue 12 row 6: --pprof 0.0.0.0:PORT bound every interface without a
// word although its help says loopback only (heap dumps hold prompts).
func TestPprofRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:0"} {
		cmd := exec.Command(os.Args[0], "serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--pprof", addr, "--log-format", "text")
		cmd.Env = append(cmd.Environ(), "SIDECAR_TEST_MAIN=1")
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("--pprof %s: the sidecar started and kept running", addr)
		}
		if err == nil || !strings.Contains(string(out), "--pprof") || !strings.Contains(string(out), "loopback") {
			t.Fatalf("--pprof %s: exit %v, output %s", addr, err, out)
		}
	}
	ln, err := listenLoopback("127.0.0.1:0")
	if err != nil {
		t.Fatalf("loopback pprof refused: %v", err)
	}
	ln.Close()
	if ln, err = listenLoopback("localhost:0"); err != nil {
		t.Fatalf("localhost pprof refused: %v", err)
	}
	ln.Close()
}

// Issue 12 row 6: --listen on a non-loopback address gave no warning.
func TestExposureWarnings(t *testing.T) {
	lo := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	if w := exposureWarnings(lo, true); len(w) != 0 {
		t.Fatalf("loopback warned: %q", w)
	}
	if w := exposureWarnings(&net.TCPAddr{IP: net.IPv6loopback, Port: 8080}, false); len(w) != 0 {
		t.Fatalf("::1 warned: %q", w)
	}
	for _, ip := range []net.IP{net.IPv4zero, net.IPv6unspecified, net.IPv4(10, 1, 2, 3)} {
		a := &net.TCPAddr{IP: ip, Port: 8080}
		if w := exposureWarnings(a, false); len(w) != 1 || !strings.Contains(w[0], "NON-LOOPBACK") {
			t.Fatalf("%s: %q", a, w)
		}
		if w := exposureWarnings(a, true); len(w) != 2 || !strings.Contains(w[1], "allow-anonymous") {
			t.Fatalf("%s with --allow-anonymous: %q", a, w)
		}
	}
}

//go:build linux

package rawconn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// rawPair is a loopback TCP connection: the accepted side as a Conn
// and the dialed side as it is.
func rawPair(t *testing.T) (raw net.Conn, peer *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	s := Server(a)
	if _, ok := s.(*Conn); !ok {
		t.Fatalf("accepted %T, want *Conn", s)
	}
	t.Cleanup(func() { s.Close(); c.Close() })
	return s, c.(*net.TCPConn)
}

// TestRawConnBehavesAsTCPConn: what the proxy relies on of a connection
// (bytes both ways past the socket buffers, end of stream, deadlines,
// Close from another goroutine, a reset) is what net.TCPConn does.
func TestRawConnBehavesAsTCPConn(t *testing.T) {
	t.Run("bytes both ways, larger than the socket buffers", func(t *testing.T) {
		raw, peer := rawPair(t)
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: writes wait for room
		got := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(io.LimitReader(peer, int64(len(big))))
			got <- b
		}()
		if n, err := raw.Write(big); err != nil || n != len(big) {
			t.Fatalf("Write = %d, %v", n, err)
		}
		if b := <-got; !bytes.Equal(b, big) {
			t.Fatalf("the peer read %d bytes, not what was written", len(b))
		}
		go func() { _, _ = peer.Write(big); _ = peer.CloseWrite() }()
		b, err := io.ReadAll(raw)
		if err != nil || !bytes.Equal(b, big) {
			t.Fatalf("ReadAll = %d bytes, %v", len(b), err)
		}
		if n, err := raw.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("after the end: %d, %v; want 0, EOF", n, err)
		}
	})
	t.Run("read deadline", func(t *testing.T) {
		raw, _ := rawPair(t)
		_ = raw.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := raw.Read(make([]byte, 8))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past its deadline: %v", err)
		}
		_ = raw.SetReadDeadline(time.Time{})
	})
	t.Run("write deadline", func(t *testing.T) {
		raw, _ := rawPair(t) // the peer never reads: the buffers fill
		_ = raw.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := raw.Write(make([]byte, 64<<20))
		if !errors.Is(err, os.ErrDeadlineExceeded) || n >= 64<<20 {
			t.Fatalf("Write past its deadline: %d, %v", n, err)
		}
	})
	t.Run("close from another goroutine", func(t *testing.T) {
		raw, _ := rawPair(t)
		done := make(chan error, 1)
		go func() {
			_, err := raw.Read(make([]byte, 8))
			done <- err
		}()
		time.Sleep(20 * time.Millisecond)
		_ = raw.Close()
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Read on a closed connection: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not wake a waiting Read")
		}
	})
	t.Run("peek", func(t *testing.T) {
		raw, peer := rawPair(t)
		rc, err := raw.(*Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		peek := func() (n int, e syscall.Errno) {
			_ = rc.Control(func(fd uintptr) {
				var b [1]byte
				n, e = Peek(fd, &b)
			})
			return n, e
		}
		if n, e := peek(); e != syscall.EAGAIN {
			t.Fatalf("Peek of a quiet open connection = %d, %v; want EAGAIN", n, e)
		}
		_, _ = peer.Write([]byte("x"))
		deadline := time.Now().Add(5 * time.Second)
		for n, _ := peek(); n != 1; n, _ = peek() {
			if time.Now().After(deadline) {
				t.Fatal("Peek never saw the byte")
			}
			time.Sleep(time.Millisecond)
		}
		b := make([]byte, 1)
		if n, err := raw.Read(b); n != 1 || err != nil || b[0] != 'x' {
			t.Fatalf("the peek consumed the byte: %d %q %v", n, b, err)
		}
		_ = peer.Close()
		for n, e := peek(); n != 0 || e != 0; n, e = peek() {
			if time.Now().After(deadline) {
				t.Fatalf("Peek after the peer closed = %d, %v; want 0, 0", n, e)
			}
			time.Sleep(time.Millisecond)
		}
	})
	t.Run("reset", func(t *testing.T) {
		raw, peer := rawPair(t)
		_ = peer.SetLinger(0)
		_ = peer.Close() // RST
		var err error
		for range 100 {
			if _, err = raw.Read(make([]byte, 8)); err != nil {
				break
			}
		}
		var op *net.OpError
		if !errors.Is(err, syscall.ECONNRESET) || !errors.As(err, &op) || op.Op != "read" {
			t.Fatalf("Read after a reset: %v", err)
		}
		for range 100 {
			if _, err = raw.Write([]byte("x")); err != nil {
				break
			}
		}
		if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Write after a reset: %v", err)
		}
	})
}

// TestRawConnLazyDeadlines: a server connection sets a deadline on its
// socket only when the one there would fire later, and a deadline that
// fires before the one asked for does not end the Read or Write waiting.
func TestRawConnLazyDeadlines(t *testing.T) {
	timeout := func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("err = %v, want a deadline exceeded", err)
		}
	}
	t.Run("a later deadline waits for its own time", func(t *testing.T) {
		raw, peer := rawPair(t)
		rc := raw.(*Conn)
		start := time.Now()
		_ = raw.SetReadDeadline(start.Add(100 * time.Millisecond))
		_ = raw.SetReadDeadline(start.Add(400 * time.Millisecond)) // kept lazily
		if !rc.rset.Equal(start.Add(100 * time.Millisecond)) {
			t.Fatalf("the socket's deadline is %v, want the first one kept", rc.rset)
		}
		go func() { time.Sleep(250 * time.Millisecond); _, _ = peer.Write([]byte("late")) }()
		b := make([]byte, 8)
		n, err := raw.Read(b)
		if err != nil || string(b[:n]) != "late" {
			t.Fatalf("Read = %q, %v: the first deadline set ended it", b[:n], err)
		}
		_, err = raw.Read(b)
		timeout(t, err)
		if el := time.Since(start); el < 400*time.Millisecond || el > 2*time.Second {
			t.Fatalf("the deadline fired after %v, want 400ms", el)
		}
	})
	t.Run("an earlier deadline is set at once", func(t *testing.T) {
		raw, _ := rawPair(t)
		start := time.Now()
		_ = raw.SetReadDeadline(start.Add(time.Hour))
		_ = raw.SetReadDeadline(start.Add(80 * time.Millisecond))
		_, err := raw.Read(make([]byte, 8))
		timeout(t, err)
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("the earlier deadline fired after %v", el)
		}
	})
	t.Run("a deadline in the past ends a Read from another goroutine", func(t *testing.T) {
		raw, _ := rawPair(t)
		_ = raw.SetReadDeadline(time.Now().Add(time.Hour))
		go func() { time.Sleep(50 * time.Millisecond); _ = raw.SetReadDeadline(time.Unix(1, 0)) }()
		_, err := raw.Read(make([]byte, 8))
		timeout(t, err)
	})
	t.Run("a zero deadline clears", func(t *testing.T) {
		raw, peer := rawPair(t)
		_ = raw.SetDeadline(time.Now().Add(50 * time.Millisecond))
		_ = raw.SetDeadline(time.Time{})
		go func() { time.Sleep(200 * time.Millisecond); _, _ = peer.Write([]byte("x")) }()
		if _, err := raw.Read(make([]byte, 8)); err != nil {
			t.Fatalf("Read after the deadline was cleared: %v", err)
		}
	})
	t.Run("one passed while nobody waited", func(t *testing.T) {
		raw, peer := rawPair(t)
		start := time.Now()
		_ = raw.SetReadDeadline(start.Add(30 * time.Millisecond))
		time.Sleep(80 * time.Millisecond) // the socket's deadline passes
		_ = raw.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = peer.Write([]byte("y"))
		if _, err := raw.Read(make([]byte, 8)); err != nil {
			t.Fatalf("Read = %v: the deadline set before ended it", err)
		}
	})
	t.Run("write", func(t *testing.T) {
		raw, peer := rawPair(t)
		start := time.Now()
		// The second deadline leaves the drain most of a second: on two
		// cores busy with make test's other groups, 150 ms did not always
		// suffice to read 8 MiB.
		_ = raw.SetWriteDeadline(start.Add(100 * time.Millisecond))
		_ = raw.SetWriteDeadline(start.Add(time.Second))
		go func() { // drains the buffers once, after the first deadline
			time.Sleep(250 * time.Millisecond)
			_, _ = io.CopyN(io.Discard, peer, 8<<20)
		}()
		n, err := raw.Write(make([]byte, 64<<20))
		timeout(t, err)
		el := time.Since(start)
		if n <= 8<<20 || el < time.Second || el > 3*time.Second {
			t.Fatalf("Write = %d bytes in %v, want more than the 8 MiB drained, ended at 1s", n, el)
		}
	})
}

// TestRawConnHoldsWritesBack: held writes reach the peer only with the
// first write after ReleaseHeld, in order, in that one call; a hold past
// holdMax goes out at once.
func TestRawConnHoldsWritesBack(t *testing.T) {
	raw, peer := rawPair(t)
	rc := raw.(*Conn)
	quiet := func() {
		t.Helper()
		_ = peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if n, err := peer.Read(make([]byte, 16)); !isTimeout(err) {
			t.Fatalf("the peer read %d bytes of held writes (%v)", n, err)
		}
		_ = peer.SetReadDeadline(time.Time{})
	}
	rc.HoldWrites()
	for _, s := range []string{"last chunk ", "0\r\n"} {
		if n, err := raw.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("held Write = %d, %v", n, err)
		}
	}
	quiet()
	rc.ReleaseHeld()
	quiet() // released to the next write, not sent by itself
	if n, err := raw.Write([]byte("\r\n")); n != 2 || err != nil {
		t.Fatalf("Write after release = %d, %v", n, err)
	}
	want := "last chunk 0\r\n\r\n"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(peer, got); err != nil || string(got) != want {
		t.Fatalf("the peer read %q, %v; want %q", got, err, want)
	}
	if n, err := raw.Write([]byte("next")); n != 4 || err != nil {
		t.Fatalf("a later Write = %d, %v", n, err)
	}
	if _, err := io.ReadFull(peer, got[:4]); err != nil || string(got[:4]) != "next" {
		t.Fatalf("after the release: %q, %v", got[:4], err)
	}

	rc.HoldWrites()
	_, _ = raw.Write([]byte("x"))
	big := bytes.Repeat([]byte("y"), holdMax)
	if n, err := raw.Write(big); n != len(big) || err != nil {
		t.Fatalf("Write past holdMax = %d, %v", n, err)
	}
	all := make([]byte, 1+len(big))
	if _, err := io.ReadFull(peer, all); err != nil || all[0] != 'x' || !bytes.Equal(all[1:], big) {
		t.Fatalf("a hold past holdMax: %v", err)
	}
	if n, err := raw.Write([]byte("z")); n != 1 || err != nil {
		t.Fatalf("Write after the hold ended = %d, %v", n, err)
	}
	if _, err := io.ReadFull(peer, got[:1]); err != nil || got[0] != 'z' {
		t.Fatalf("the hold did not end: %q, %v", got[:1], err)
	}
}

// TestRawConnSendsOnRead: after SendOnRead, writes wait for the next
// Read, which sends them and returns the answer, however fast it comes;
// a send larger than the socket's buffer, a peer that closes or resets,
// and a read deadline behave as a Write then a Read would.
func TestRawConnSendsOnRead(t *testing.T) {
	t.Run("round trips, answered at once", func(t *testing.T) {
		raw, peer := rawPair(t)
		rc := raw.(*Conn)
		go func() { // an echo that answers each request the moment it reads it
			b := make([]byte, 64)
			for {
				n, err := peer.Read(b)
				if err != nil {
					return
				}
				if _, err := peer.Write(b[:n]); err != nil {
					return
				}
			}
		}()
		in := make([]byte, 64)
		for i := range 2000 {
			rc.SendOnRead()
			msg := []byte{'a' + byte(i%26), 'b', 'c'}
			for _, part := range [][]byte{msg[:1], msg[1:]} {
				if n, err := raw.Write(part); n != len(part) || err != nil {
					t.Fatalf("held Write = %d, %v", n, err)
				}
			}
			_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(raw, in[:3]); err != nil || !bytes.Equal(in[:3], msg) {
				t.Fatalf("round trip %d: %q, %v; want %q", i, in[:3], err, msg)
			}
		}
	})
	t.Run("held until the read", func(t *testing.T) {
		raw, peer := rawPair(t)
		rc := raw.(*Conn)
		rc.SendOnRead()
		if _, err := raw.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		_ = peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if n, err := peer.Read(make([]byte, 16)); !isTimeout(err) {
			t.Fatalf("the peer read %d bytes before the Read (%v)", n, err)
		}
		_ = peer.SetReadDeadline(time.Time{})
		go func() {
			b := make([]byte, 7)
			if _, err := io.ReadFull(peer, b); err == nil && string(b) == "request" {
				_, _ = peer.Write([]byte("answer"))
			}
			_ = peer.CloseWrite()
		}()
		b, err := io.ReadAll(raw)
		if err != nil || string(b) != "answer" {
			t.Fatalf("read %q, %v; want the answer, then the end", b, err)
		}
	})
	t.Run("a send past the socket's buffer", func(t *testing.T) {
		raw, peer := rawPair(t)
		rc := raw.(*Conn)
		_ = rc.tc.SetWriteBuffer(4096)
		_ = peer.SetReadBuffer(4096)
		big := bytes.Repeat([]byte("0123456789abcdef"), holdMax/16-1)
		go func() {
			time.Sleep(20 * time.Millisecond) // the send fills the buffers first
			b := make([]byte, len(big))
			if _, err := io.ReadFull(peer, b); err == nil && bytes.Equal(b, big) {
				_, _ = peer.Write([]byte("ok"))
			}
			_ = peer.CloseWrite()
		}()
		rc.SendOnRead()
		if n, err := raw.Write(big); n != len(big) || err != nil {
			t.Fatalf("held Write = %d, %v", n, err)
		}
		b, err := io.ReadAll(raw)
		if err != nil || string(b) != "ok" {
			t.Fatalf("read %q, %v; want the peer to have read it all", b, err)
		}
	})
	t.Run("a peer that reset", func(t *testing.T) {
		raw, peer := rawPair(t)
		rc := raw.(*Conn)
		_ = peer.SetLinger(0)
		_ = peer.Close()
		time.Sleep(20 * time.Millisecond)
		rc.SendOnRead()
		_, _ = raw.Write([]byte("request"))
		_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := raw.Read(make([]byte, 16)); err == nil || isTimeout(err) {
			t.Fatalf("Read = %d, %v; want the reset", n, err)
		}
	})
	t.Run("a deadline", func(t *testing.T) {
		raw, peer := rawPair(t)
		rc := raw.(*Conn)
		rc.SendOnRead()
		_, _ = raw.Write([]byte("request"))
		_ = raw.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if n, err := raw.Read(make([]byte, 16)); !isTimeout(err) {
			t.Fatalf("Read = %d, %v; want a timeout", n, err)
		}
		b := make([]byte, 7)
		if _, err := io.ReadFull(peer, b); err != nil || string(b) != "request" {
			t.Fatalf("the peer read %q, %v", b, err)
		}
	})
}

// TestRawConnAllocatesNothing: a Read and a Write cost no allocation.
func TestRawConnAllocatesNothing(t *testing.T) {
	raw, peer := rawPair(t)
	msg := []byte("ping")
	in := make([]byte, 16)
	pb := make([]byte, 16)
	i := 0
	allocs := testing.AllocsPerRun(200, func() {
		i++ // a deadline kept (read) and one set on the socket each time (write: cleared, then set)
		_ = raw.SetReadDeadline(time.Now().Add(time.Hour))
		wdl := time.Time{}
		if i%2 == 1 {
			wdl = time.Now().Add(time.Hour)
		}
		_ = raw.SetWriteDeadline(wdl)
		if _, err := raw.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, pb[:len(msg)]); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(raw, in[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per round trip, want 0", allocs)
	}
	go func() { // an echo, allocating nothing per request
		for {
			if _, err := io.ReadFull(peer, pb[:len(msg)]); err != nil {
				return
			}
			if _, err := peer.Write(pb[:len(msg)]); err != nil {
				return
			}
		}
	}()
	allocs = testing.AllocsPerRun(200, func() {
		raw.(*Conn).SendOnRead()
		if _, err := raw.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(raw, in[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per sent-on-read round trip, want 0", allocs)
	}
}

// isTimeout reports a deadline's error, as net.Error says it.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

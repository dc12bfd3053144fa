//go:build linux

package proxy

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// goneDelay is how long a request waits on its upstream before the client
// connection starts being checked; fast requests never pay for the check.
const goneDelay = 50 * time.Millisecond

// goneEvery is the interval between checks.
const goneEvery = 50 * time.Millisecond

// watchClientGone calls cancel (and onGone) when the client closes its
// connection while the handler still waits on the upstream. It peeks at the
// socket without consuming bytes, so a pipelined next request is untouched.
// The returned stop must be called before the handler returns; after it the
// connection is not touched again.
func watchClientGone(conn net.Conn, cancel, onGone func()) (stop func()) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return func() {}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return func() {}
	}
	var (
		mu      sync.Mutex
		stopped bool
		done    = make(chan struct{})
		wg      sync.WaitGroup
	)
	t := time.AfterFunc(goneDelay, func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		wg.Add(1)
		mu.Unlock()
		defer wg.Done()
		tick := time.NewTicker(goneEvery)
		defer tick.Stop()
		var b [1]byte
		for {
			gone := false
			_ = rc.Read(func(fd uintptr) bool {
				n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
				gone = n == 0 && err == nil || err != nil && err != syscall.EAGAIN && err != syscall.EINTR
				return true
			})
			if gone {
				onGone()
				cancel()
				return
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		t.Stop()
		close(done)
		wg.Wait()
	}
}

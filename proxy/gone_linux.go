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

// goneWatch calls cancel (and onGone) when the client closes its connection
// while the request still waits on the upstream. It peeks at the socket
// without consuming bytes, so a pipelined next request is untouched.
type goneWatch struct {
	conn   net.Conn
	cancel func()
	onGone func()
	timer  *time.Timer

	// mu protects the fields below.
	mu      sync.Mutex
	stopped bool
	done    chan struct{} // made when checking starts; closed by stop
	running sync.WaitGroup
}

// watchClientGone starts watching conn. The returned stop must be called
// before the handler's connection is used again by anyone else; after it the
// connection is not touched. Until goneDelay passes it costs one timer.
func watchClientGone(conn net.Conn, cancel, onGone func()) (stop func()) {
	w := &goneWatch{conn: conn, cancel: cancel, onGone: onGone}
	w.timer = time.AfterFunc(goneDelay, w.run)
	return w.stop
}

func (w *goneWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	if w.done != nil {
		close(w.done)
	}
	w.mu.Unlock()
	w.timer.Stop()
	w.running.Wait()
}

func (w *goneWatch) run() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.running.Add(1)
	w.done = make(chan struct{})
	done := w.done
	w.mu.Unlock()
	defer w.running.Done()

	sc, ok := w.conn.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
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
			w.onGone()
			w.cancel()
			return
		}
		select {
		case <-done:
			return
		case <-tick.C:
		}
	}
}

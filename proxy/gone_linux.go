//go:build linux

package proxy

import (
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/kvsidecar/kvsidecar/internal/rawconn"
)

// goneDelay is how long a request waits on its upstream before the client
// connection starts being checked; fast requests never pay for the check.
const goneDelay = 50 * time.Millisecond

// goneEvery is the interval between checks.
const goneEvery = 50 * time.Millisecond

// goneWatch cancels a request's slot (and counts a disconnect) when the
// client closes its connection while the request still waits on the
// upstream. It peeks at the socket without consuming bytes, so a pipelined
// next request is untouched. It lives in a pooled exchange and is armed
// once per request: until goneDelay passes it costs re-arming one timer,
// made with the watch's first use; no allocation (BenchmarkProxyChatEngine).
type goneWatch struct {
	conn  net.Conn
	slot  *cancelSlot
	gone  counter
	timer *time.Timer

	// mu protects the fields below.
	mu      sync.Mutex
	stopped bool
	done    chan struct{} // made when checking starts; closed by stop
	running sync.WaitGroup
}

// start watches conn for the request whose upstream call slot cancels.
// stop must be called before the handler's connection is used again by
// anyone else.
func (w *goneWatch) start(conn net.Conn, slot *cancelSlot, gone counter) {
	w.conn, w.slot, w.gone = conn, slot, gone
	w.stopped, w.done = false, nil
	if w.timer == nil {
		w.timer = time.AfterFunc(goneDelay, w.run)
	} else {
		w.timer.Reset(goneDelay)
	}
}

// stop ends the watch; after it the connection is not touched. It reports
// whether the watch may be started again: false once its timer fired,
// whose run may still be on its way to seeing stopped.
func (w *goneWatch) stop() (reusable bool) {
	w.mu.Lock()
	w.stopped = true
	if w.done != nil {
		close(w.done)
	}
	w.mu.Unlock()
	reusable = w.timer.Stop()
	w.running.Wait()
	w.conn = nil
	return reusable
}

func (w *goneWatch) run() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.running.Add(1)
	w.done = make(chan struct{})
	done, conn, slot, gone := w.done, w.conn, w.slot, w.gone
	w.mu.Unlock()
	defer w.running.Done()

	sc, ok := conn.(syscall.Conn)
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
		closed := false
		// Control, not Read: a read deadline that passed (fasthttp's
		// ReadTimeout, during a long answer) would end a Read before
		// its peek, and a lazy one (rawconn.Conn) may pass early.
		_ = rc.Control(func(fd uintptr) {
			n, err := rawconn.Peek(fd, &b)
			closed = n == 0 && err == 0 || err != 0 && err != syscall.EAGAIN && err != syscall.EINTR
		})
		if closed {
			gone.Add(1)
			slot.cancel()
			return
		}
		select {
		case <-done:
			return
		case <-tick.C:
		}
	}
}

//go:build !linux

package proxy

import (
	"context"
	"net"
)

// evLoop is Linux's (evloop_linux.go); elsewhere the pass-through stays on
// Go's poller.
type evLoop struct{ done chan struct{} }

func (l *evLoop) shutdown(context.Context) {}

// startLoop serves ln on Go's poller: the event loop is Linux's.
func (s *Server) startLoop(ln net.Listener) (net.Listener, *evLoop) {
	if s.opts.EventLoop {
		s.log.Warn("event loop off: it runs on Linux only; serving on Go's poller")
	}
	return s.frontListener(ln), nil
}

//go:build !linux

package frontdoor

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// Loop is Linux's (loop_linux.go); elsewhere StartLoop refuses and every
// connection is read on Go's poller through a Listener.
type Loop struct{}

// StartLoop refuses: the event loop runs on Linux only.
func StartLoop(*net.TCPListener, LoopOptions, Backend) (*Loop, error) {
	return nil, fmt.Errorf("frontdoor: the event loop runs on Linux only: %w", errors.ErrUnsupported)
}

// Shutdown does nothing.
func (l *Loop) Shutdown(context.Context) {}

// Done is closed.
func (l *Loop) Done() <-chan struct{} { return closedChan }

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Counts is zero.
func (l *Loop) Counts() (served, handed uint64) { return 0, 0 }

// Accept, Close and Addr make a Loop a net.Listener, as on Linux.
func (l *Loop) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (l *Loop) Close() error              { return nil }
func (l *Loop) Addr() net.Addr            { return nil }

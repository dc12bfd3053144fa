//go:build !linux

package proxy

import "net"

// newRawConn is c where raw socket calls are not wired: the runtime's own
// reads and writes serve.
func newRawConn(c net.Conn) net.Conn { return c }

// rawListener is its listener.
type rawListener struct{ net.Listener }

//go:build !linux

package rawconn

import "net"

// New is c where raw socket calls are not wired: the runtime's own
// reads and writes serve.
func New(c net.Conn) net.Conn { return c }

// Server is c.
func Server(c net.Conn) net.Conn { return c }

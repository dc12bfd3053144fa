//go:build !linux

package proxy

import "net"

// goneWatch is a no-op where sockets cannot be peeked portably: a gone
// client is noticed when its response is written.
type goneWatch struct{}

func (*goneWatch) start(net.Conn, *cancelSlot, counter) {}
func (*goneWatch) stop() (reusable bool)                { return true }

//go:build !linux

package proxy

import "net"

// watchClientGone is a no-op where sockets cannot be peeked portably: a gone
// client is noticed when its response is written.
func watchClientGone(net.Conn, func(), func()) (stop func()) { return func() {} }

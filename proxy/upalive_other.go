//go:build !linux

package proxy

import "net"

// connProbe is a no-op where sockets cannot be peeked portably: a pooled
// connection the upstream closed is found when a request fails on it
// before any response byte, and roundTrip sends it again on a fresh one.
type connProbe struct{}

func (p *connProbe) init(net.Conn) {}

func (p *connProbe) alive() bool { return true }

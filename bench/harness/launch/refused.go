package launch

import (
	"net"
	"strconv"
	"syscall"
)

// RefusedAddr returns a loopback address ("127.0.0.1:port") where a
// connection is refused for as long as the returned close function is not
// called: a TCP socket bound there that never listens holds the port, so
// no other process or test can take it meanwhile (a port merely closed
// again, as FreePort's, may be reused by the next listener at once and
// answer). Linux and the BSDs refuse a connection to a bound, non-listening
// socket.
func RefusedAddr() (addr string, closeFn func(), err error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return "", nil, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return "", nil, err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return "", nil, err
	}
	port := sa.(*syscall.SockaddrInet4).Port
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), func() { syscall.Close(fd) }, nil
}

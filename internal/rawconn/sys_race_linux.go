//go:build linux && race

package rawconn

import "syscall"

// With the race detector on, a Conn's calls go through syscall.Read and
// syscall.Write, which tell the detector what raw calls cannot: the bytes
// a read wrote and a write read, and that a write happens before the read
// that sees its bytes, on any connection (a test that sets a field and
// then sends the request the server reads is ordered through the socket).

func SysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return n, errnoOf(err)
}

func SysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return n, errnoOf(err)
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return err.(syscall.Errno) //nolint:errorlint // syscall returns a bare Errno
}

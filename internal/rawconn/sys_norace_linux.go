//go:build linux && !race

package rawconn

import (
	"syscall"
	"unsafe"
)

// SysRead and SysWrite are read(2) and write(2) as raw calls (Conn);
// with the race detector on they are syscall's (sys_race_linux.go). Only
// for a socket that never blocks (O_NONBLOCK): a raw call holds its thread.

func SysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(n), e
}

func SysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(n), e
}

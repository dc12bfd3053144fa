package redisserver

import "syscall"

// sysProcAttr makes the kernel kill the server when the thread that
// started it dies, so a crashed test leaves no process behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

package launch

import "syscall"

// SysProcAttr makes the kernel kill a child (the server, or any other child
// process of a test or benchmark) when the thread that started it dies, so
// a crashed parent leaves no process behind.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

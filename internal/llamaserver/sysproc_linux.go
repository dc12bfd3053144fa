package llamaserver

import "syscall"

// sysProcAttr makes the kernel kill the server when the thread that
// started it dies, so a crashed parent leaves no llama-server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

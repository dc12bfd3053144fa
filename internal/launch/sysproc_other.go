//go:build !linux

package launch

import "syscall"

// SysProcAttr: no parent-death signal outside Linux; Close and test
// cleanups kill the children.
func SysProcAttr() *syscall.SysProcAttr { return nil }

//go:build !linux

package redisserver

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; Close and test
// cleanups kill the server.
func sysProcAttr() *syscall.SysProcAttr { return nil }

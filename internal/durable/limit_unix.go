//go:build unix

package durable

import "syscall"

// DefaultMaxOpen is a quarter of the process's soft RLIMIT_NOFILE (read
// now; Go raises the soft limit to the hard one at start), between 16 and
// 65536: logs never take more than a quarter of the descriptors, leaving
// the rest to connections, archive reads and index writes.
func DefaultMaxOpen() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 256
	}
	return int(min(max(rl.Cur/4, 16), 65536))
}

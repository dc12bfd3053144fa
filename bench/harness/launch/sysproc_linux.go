package launch

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// SysProcAttr makes the kernel kill a child (the server, or any other child
// process of a test or benchmark) when the thread that started it dies, so
// a crashed parent leaves no process behind.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// listensOn reports whether process pid holds a listening TCP socket on
// port, from /proc/net/tcp{,6} and /proc/pid/fd. A server that answers on
// its port may be another process that took the port between FreePort and
// the child's bind (tests and benchmarks start many servers at once); the
// launcher only trusts an answer from its own child. Where /proc/net cannot
// be read it says yes.
func listensOn(pid, port int) bool {
	inodes := map[string]bool{}
	readable := false
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		readable = true
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			i := strings.LastIndexByte(fs[1], ':')
			if p, err := strconv.ParseUint(fs[1][i+1:], 16, 16); err == nil && int(p) == port {
				inodes[fs[9]] = true
			}
		}
	}
	if !readable {
		return true
	}
	fdDir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(fdDir)
	if err != nil { // the child is gone (or a zombie): not listening
		return false
	}
	for _, e := range ents {
		l, err := os.Readlink(fdDir + "/" + e.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
			return true
		}
	}
	return false
}

package workload

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// userHZ is the unit of utime and stime in /proc/PID/stat: USER_HZ, 100 on
// every Linux architecture Go runs on (the kernel scales its own HZ to it
// for user space).
const userHZ = 100

// procCPU returns the CPU time (user + system) the processes pids and their
// direct children (an nginx master's workers) have used so far, from
// /proc/PID/stat. A process that is gone counts zero; pid 0 means this
// process.
func procCPU(pids []int) (time.Duration, error) {
	var ticks int64
	seen := map[int]bool{}
	for _, pid := range pids {
		if pid == 0 {
			pid = os.Getpid()
		}
		for _, p := range append([]int{pid}, childPIDs(pid)...) {
			if seen[p] {
				continue
			}
			seen[p] = true
			t, _, err := statTicks(p)
			if err != nil {
				if os.IsNotExist(err) {
					continue
				}
				return 0, err
			}
			ticks += t
		}
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// statTicks reads utime + stime and the parent's pid of one process.
func statTicks(pid int) (ticks int64, ppid int, err error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	return parseStat(b)
}

// parseStat parses /proc/PID/stat: "pid (comm) state ppid … utime stime
// …", comm possibly holding spaces and parentheses, so the fields are
// counted after the last ')'. utime and stime are fields 14 and 15.
func parseStat(b []byte) (ticks int64, ppid int, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("bench: /proc stat without comm: %.60q", b)
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("bench: /proc stat with %d fields", len(f)+2)
	}
	pp, err1 := strconv.Atoi(string(f[1]))
	ut, err2 := strconv.ParseInt(string(f[11]), 10, 64)
	st, err3 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, fmt.Errorf("bench: /proc stat: bad fields %q", b)
	}
	return ut + st, pp, nil
}

// childPIDs lists the processes whose parent is pid.
func childPIDs(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == pid {
			continue
		}
		if _, pp, err := statTicks(p); err == nil && pp == pid {
			out = append(out, p)
		}
	}
	return out
}

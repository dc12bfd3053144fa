package workload

import (
	"net"
	"strconv"
	"strings"
)

// AdminAddr is where a sidecar listening at addr serves its own /metrics
// with --admin-listen left at its default: 127.0.0.1 at the main port +
// 1000 (cmd/sidecar's adminAddress). addr as given when it has no port.
func AdminAddr(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	n, err := strconv.Atoi(p)
	if err != nil || n <= 0 || n+1000 > 65535 {
		return addr
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n+1000))
}

// AdminURL is AdminAddr for a base URL ("http://host:port").
func AdminURL(base string) string {
	rest, ok := strings.CutPrefix(base, "http://")
	if !ok {
		return base
	}
	host, _, _ := strings.Cut(rest, "/")
	return "http://" + AdminAddr(host)
}

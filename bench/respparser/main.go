// Command respparser is the yardstick that decided respstore's request
// parser: a RESP server on github.com/tidwall/redcon (the library the
// project would otherwise use) keeping values in a map, measured by
// `sidecar bench resp --extra redcon=ADDR` beside redis-server and the
// sidecar (make bench-resp runs it). It keeps redcon out of the sidecar's
// go.mod.
//
// redcon reads a whole command into a buffer it doubles as bytes arrive,
// copies the command once more (Command.Raw), and keeps the grown buffer
// with the connection; a SET's value must be copied again out of it, and
// a GET's value is copied into the reply buffer. It bounds no bulk
// length. INFO answers this process's resident set (vm_rss), to show what
// the connections keep.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/tidwall/redcon"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:6390", "address to serve")
	flag.Parse()
	var (
		mu   sync.RWMutex
		data = map[string][]byte{}
	)
	err := redcon.ListenAndServe(*listen, func(c redcon.Conn, cmd redcon.Command) {
		switch strings.ToUpper(string(cmd.Args[0])) {
		case "AUTH", "SELECT":
			c.WriteString("OK")
		case "PING":
			c.WriteString("PONG")
		case "SET":
			if len(cmd.Args) != 3 {
				c.WriteError("ERR wrong number of arguments for 'set' command")
				return
			}
			v := append([]byte(nil), cmd.Args[2]...) // the args alias redcon's buffer
			mu.Lock()
			data[string(cmd.Args[1])] = v
			mu.Unlock()
			c.WriteString("OK")
		case "GET":
			if len(cmd.Args) != 2 {
				c.WriteError("ERR wrong number of arguments for 'get' command")
				return
			}
			mu.RLock()
			v, ok := data[string(cmd.Args[1])]
			mu.RUnlock()
			if !ok {
				c.WriteNull()
				return
			}
			c.WriteBulk(v)
		case "FLUSHALL":
			mu.Lock()
			clear(data)
			mu.Unlock()
			c.WriteString("OK")
		case "INFO":
			c.WriteBulkString(fmt.Sprintf("# Memory\r\nvm_rss:%s\r\n", rss()))
		default:
			c.WriteError("ERR unknown command '" + string(cmd.Args[0]) + "'")
		}
	}, nil, nil)
	if err != nil {
		log.Fatal(err)
	}
}

// rss is this process's resident set, as /proc says it.
func rss() string {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:"))
		}
	}
	return "?"
}

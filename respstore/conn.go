package respstore

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// maxArgs bounds an authenticated client's command (MGET, DEL and EXISTS
// of many keys).
const maxArgs = 1 << 16

// numDBs is how many databases SELECT accepts, as Redis's default.
const numDBs = 16

// anonymous is the tenant of clients that never AUTH, with
// Options.AllowAnonymous.
const anonymous = "anonymous"

// conn is one client connection, served by one goroutine: commands are
// read, run and answered in order, and replies are flushed when no more
// pipelined input is waiting.
type conn struct {
	s      *Server
	nc     net.Conn
	r      *reader
	w      writer
	id     int64
	tenant *tenant // nil until AUTH (or anonymous)
	db     int
	name   string
	lib    string // CLIENT SETINFO LIB-NAME and LIB-VER
}

func (s *Server) handle(nc net.Conn) {
	defer s.untrack(nc)
	defer nc.Close()
	n := s.conns.Add(1)
	defer s.conns.Add(-1)
	c := &conn{s: s, nc: nc, id: s.nextID.Add(1)}
	c.w = writer{conn: nc, timeout: s.opts.WriteTimeout}
	if n > int64(s.opts.MaxConns) {
		s.refusedConns.Add(1)
		c.w.error("ERR max number of clients reached")
		c.w.flush()
		return
	}
	c.r = newReader(nc, nc)
	c.r.readTimeout = s.opts.ReadTimeout
	c.r.acquire = func(n int64) error { return s.inflight.Acquire(s.ctx, n) }
	c.r.release = func(n int64) { s.inflight.Release(n) }
	if s.opts.AllowAnonymous {
		c.tenant = s.ix.tenant(anonymous)
	}
	for {
		lim := limits{maxArgs: maxArgs, maxBulk: s.opts.MaxValueBytes}
		if c.tenant == nil {
			lim = limits{maxArgs: preAuthMaxArgs, maxBulk: preAuthMaxBulk}
		}
		req, err := c.r.next(lim)
		if err != nil {
			var pe *errProto
			if errors.As(err, &pe) {
				s.protoErrors.Add(1)
				c.w.error("ERR " + pe.Error())
				c.w.flush()
			}
			return
		}
		quit := false
		if len(req.args) > 0 {
			quit = c.exec(req.args)
		}
		if req.big > 0 {
			s.inflight.Release(req.big)
		}
		if quit {
			c.w.flush()
			return
		}
		if c.r.br.Buffered() == 0 || len(c.w.buf) >= 64<<10 {
			if err := c.w.flush(); err != nil {
				return
			}
		}
	}
}

// exec runs one command and buffers its reply; it reports whether the
// connection ends (QUIT) or must (a reply could not be written).
func (c *conn) exec(args [][]byte) (quit bool) {
	name := upper(args[0])
	cmd, known := commands[name]
	if !known {
		c.s.count("unknown")
		c.w.error(unknownCommand(args))
		return false
	}
	c.s.count(name)
	if c.tenant == nil && !cmd.noAuth {
		c.w.error("NOAUTH Authentication required.")
		return false
	}
	if len(args) < cmd.minArgs || (cmd.maxArgs > 0 && len(args) > cmd.maxArgs) {
		c.w.error("ERR wrong number of arguments for '" + strings.ToLower(name) + "' command")
		return false
	}
	return cmd.run(c, args)
}

type command struct {
	minArgs, maxArgs int // with the name; maxArgs 0: any
	noAuth           bool
	run              func(c *conn, args [][]byte) (quit bool)
}

// commands is the subset the listener speaks: what LMCache's clients send
// (its native resp connector: AUTH, SET, GET, EXISTS, DEL; redis://:
// SET, GET, EXISTS, DEL; valkey://: SET with EX, GET, EXISTS), what
// redis-py, go-redis, GLIDE, redis-cli and redis-benchmark send around
// them, and a few for people (DBSIZE, TTL, FLUSHDB). Everything else is
// answered "-ERR unknown command".
var commands map[string]command

func init() {
	commands = map[string]command{
		"AUTH":     {minArgs: 2, maxArgs: 3, noAuth: true, run: (*conn).auth},
		"HELLO":    {minArgs: 1, maxArgs: 7, noAuth: true, run: (*conn).hello},
		"QUIT":     {minArgs: 1, noAuth: true, run: func(c *conn, _ [][]byte) bool { c.w.simple("OK"); return true }},
		"RESET":    {minArgs: 1, maxArgs: 1, noAuth: true, run: (*conn).reset},
		"PING":     {minArgs: 1, maxArgs: 2, run: (*conn).ping},
		"ECHO":     {minArgs: 2, maxArgs: 2, run: func(c *conn, a [][]byte) bool { return c.bulk(a[1]) }},
		"SELECT":   {minArgs: 2, maxArgs: 2, run: (*conn).selectDB},
		"CLIENT":   {minArgs: 2, run: (*conn).client},
		"INFO":     {minArgs: 1, run: (*conn).info},
		"CONFIG":   {minArgs: 2, run: (*conn).config},
		"COMMAND":  {minArgs: 1, run: func(c *conn, _ [][]byte) bool { c.w.array(0); return false }},
		"SET":      {minArgs: 3, run: (*conn).set},
		"GET":      {minArgs: 2, maxArgs: 2, run: (*conn).get},
		"MGET":     {minArgs: 2, run: (*conn).mget},
		"EXISTS":   {minArgs: 2, run: (*conn).exists},
		"DEL":      {minArgs: 2, run: (*conn).del},
		"UNLINK":   {minArgs: 2, run: (*conn).del},
		"TTL":      {minArgs: 2, maxArgs: 2, run: func(c *conn, a [][]byte) bool { return c.ttl(a, time.Second) }},
		"PTTL":     {minArgs: 2, maxArgs: 2, run: func(c *conn, a [][]byte) bool { return c.ttl(a, time.Millisecond) }},
		"DBSIZE":   {minArgs: 1, maxArgs: 1, run: (*conn).dbsize},
		"FLUSHDB":  {minArgs: 1, maxArgs: 2, run: (*conn).flushdb},
		"FLUSHALL": {minArgs: 1, maxArgs: 2, run: (*conn).flushall},
	}
}

// unknownCommand is Redis's message for a command it does not know.
func unknownCommand(args [][]byte) string {
	var b strings.Builder
	b.WriteString("ERR unknown command '")
	b.WriteString(clip(args[0], 128))
	b.WriteString("', with args beginning with: ")
	for _, a := range args[1:min(len(args), 4)] {
		b.WriteString("'")
		b.WriteString(clip(a, 128))
		b.WriteString("' ")
	}
	return b.String()
}

func clip(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	return string(b)
}

func upper(b []byte) string {
	for _, c := range b {
		if 'a' <= c && c <= 'z' {
			return string(bytes.ToUpper(b))
		}
	}
	return string(b)
}

// bulk writes b, flushing it straight from the value when it is large. A
// write that fails ends the connection.
func (c *conn) bulk(b []byte) bool {
	return c.w.bulk(b) != nil
}

func (c *conn) auth(args [][]byte) bool {
	var name, pass []byte
	if len(args) == 2 {
		pass = args[1]
	} else {
		name, pass = args[1], args[2]
	}
	t, ok := c.s.acc.authenticate(name, pass)
	if !ok {
		c.s.authFailures.Add(1)
		c.w.error("WRONGPASS invalid username-password pair or user is disabled.")
		return false
	}
	c.tenant = c.s.ix.tenant(t)
	c.w.simple("OK")
	return false
}

// hello is HELLO [protover [AUTH username password] [SETNAME clientname]].
func (c *conn) hello(args [][]byte) bool {
	resp3 := c.w.resp3
	if len(args) >= 2 {
		v, err := strconv.Atoi(string(args[1]))
		if err != nil {
			c.w.error("ERR Protocol version is not an integer or out of range")
			return false
		}
		if v != 2 && v != 3 {
			c.w.error("NOPROTO unsupported protocol version")
			return false
		}
		resp3 = v == 3
	}
	var auth, setname []byte
	var user []byte
	for i := 2; i < len(args); i++ {
		switch opt := upper(args[i]); {
		case opt == "AUTH" && i+2 < len(args):
			user, auth = args[i+1], args[i+2]
			i += 2
		case opt == "SETNAME" && i+1 < len(args):
			setname = args[i+1]
			i++
		default:
			c.w.error("ERR Syntax error in HELLO option '" + clip(args[i], 128) + "'")
			return false
		}
	}
	if auth != nil {
		t, ok := c.s.acc.authenticate(user, auth)
		if !ok {
			c.s.authFailures.Add(1)
			c.w.error("WRONGPASS invalid username-password pair or user is disabled.")
			return false
		}
		c.tenant = c.s.ix.tenant(t)
	}
	if c.tenant == nil {
		c.w.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")
		return false
	}
	if setname != nil {
		c.name = string(setname)
	}
	c.w.resp3 = resp3
	proto := int64(2)
	if resp3 {
		proto = 3
	}
	c.w.mapHeader(7)
	c.w.bulkString("server")
	c.w.bulkString("redis")
	c.w.bulkString("version")
	c.w.bulkString(redisVersion)
	c.w.bulkString("proto")
	c.w.int(proto)
	c.w.bulkString("id")
	c.w.int(c.id)
	c.w.bulkString("mode")
	c.w.bulkString("standalone")
	c.w.bulkString("role")
	c.w.bulkString("master")
	c.w.bulkString("modules")
	c.w.array(0)
	return false
}

// redisVersion is the Redis version the listener answers as: clients gate
// features on it, and it speaks that version's commands it knows.
const redisVersion = "7.2.0"

func (c *conn) reset(_ [][]byte) bool {
	c.w.resp3 = false
	c.db = 0
	c.name = ""
	c.tenant = nil
	if c.s.opts.AllowAnonymous {
		c.tenant = c.s.ix.tenant(anonymous)
	}
	c.w.simple("RESET")
	return false
}

func (c *conn) ping(args [][]byte) bool {
	if len(args) == 2 {
		return c.bulk(args[1])
	}
	c.w.simple("PONG")
	return false
}

func (c *conn) selectDB(args [][]byte) bool {
	n, err := strconv.Atoi(string(args[1]))
	if err != nil {
		c.w.error("ERR value is not an integer or out of range")
		return false
	}
	if n < 0 || n >= numDBs {
		c.w.error("ERR DB index is out of range")
		return false
	}
	c.db = n
	c.w.simple("OK")
	return false
}

func (c *conn) client(args [][]byte) bool {
	switch sub := upper(args[1]); sub {
	case "SETINFO":
		if len(args) != 4 {
			c.w.error("ERR wrong number of arguments for 'client|setinfo' command")
			return false
		}
		switch attr := upper(args[2]); attr {
		case "LIB-NAME", "LIB-VER":
			if bytes.ContainsAny(args[3], " \r\n") {
				c.w.error("ERR " + attr + " cannot contain spaces, newlines or special characters.")
				return false
			}
			c.lib = strings.TrimSpace(c.lib + " " + string(args[3]))
			c.w.simple("OK")
		default:
			c.w.error("ERR Unrecognized option '" + clip(args[2], 128) + "'")
		}
	case "SETNAME":
		if len(args) != 3 {
			c.w.error("ERR wrong number of arguments for 'client|setname' command")
			return false
		}
		if bytes.ContainsAny(args[2], " \r\n") {
			c.w.error("ERR Client names cannot contain spaces, newlines or special characters.")
			return false
		}
		c.name = string(args[2])
		c.w.simple("OK")
	case "GETNAME":
		if c.name == "" {
			c.w.null()
			return false
		}
		c.w.bulkString(c.name)
	case "ID":
		c.w.int(c.id)
	case "INFO":
		return c.bulk([]byte(fmt.Sprintf("id=%d addr=%s laddr=%s name=%s db=%d resp=%d lib=%s\n",
			c.id, c.nc.RemoteAddr(), c.nc.LocalAddr(), c.name, c.db, c.proto(), c.lib)))
	default:
		c.w.error("ERR unknown subcommand '" + clip(args[1], 128) + "'. Try CLIENT HELP.")
	}
	return false
}

func (c *conn) proto() int {
	if c.w.resp3 {
		return 3
	}
	return 2
}

// info answers INFO with this tenant's figures only: no tenant learns
// another's keys or bytes.
func (c *conn) info(args [][]byte) bool {
	keys, bytes, _ := c.s.ix.usage(c.tenant)
	var b strings.Builder
	section := func(name string) bool {
		if len(args) == 1 {
			return true
		}
		for _, a := range args[1:] {
			s := strings.ToLower(string(a))
			if s == name || s == "all" || s == "everything" || s == "default" {
				return true
			}
		}
		return false
	}
	if section("server") {
		fmt.Fprintf(&b, "# Server\r\nredis_version:%s\r\nredis_mode:standalone\r\nos:%s\r\narch_bits:64\r\nprocess_id:%d\r\nuptime_in_seconds:%d\r\nkvsidecar_version:%s\r\n\r\n",
			redisVersion, runtime.GOOS, syscall.Getpid(), int64(c.s.opts.Clock.Now().Sub(c.s.started).Seconds()), c.s.opts.Version)
	}
	if section("clients") {
		fmt.Fprintf(&b, "# Clients\r\nconnected_clients:%d\r\nmaxclients:%d\r\n\r\n", c.s.conns.Load(), c.s.opts.MaxConns)
	}
	if section("memory") {
		fmt.Fprintf(&b, "# Memory\r\nused_memory:%d\r\nmaxmemory:%d\r\nmaxmemory_policy:allkeys-lru\r\n\r\n", bytes, c.s.ix.quota(c.tenant.name))
	}
	if section("persistence") {
		fmt.Fprintf(&b, "# Persistence\r\nloading:0\r\naof_enabled:0\r\nrdb_bgsave_in_progress:0\r\nkvsidecar_fsync:%s\r\nkvsidecar_unsynced_bytes:%d\r\n\r\n", c.s.opts.Fsync, c.s.st.unsynced())
	}
	if section("replication") {
		b.WriteString("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\r\n")
	}
	if section("keyspace") {
		b.WriteString("# Keyspace\r\n")
		if keys > 0 {
			for db := range numDBs {
				if n, exp := c.s.ix.count(c.tenant, db); n > 0 {
					fmt.Fprintf(&b, "db%d:keys=%d,expires=%d,avg_ttl=0\r\n", db, n, exp)
				}
			}
		}
	}
	return c.bulk([]byte(strings.TrimRight(b.String(), "\r\n") + "\r\n"))
}

// config answers CONFIG GET for the few parameters clients read
// (redis-benchmark reads save and appendonly); CONFIG SET and the rest are
// refused: the listener is configured by the sidecar's flags.
func (c *conn) config(args [][]byte) bool {
	if upper(args[1]) != "GET" || len(args) < 3 {
		c.w.error("ERR CONFIG " + clip(args[1], 32) + " is not supported: the listener is configured by the sidecar's flags")
		return false
	}
	values := map[string]string{
		"save": "", "appendonly": "no", "maxmemory-policy": "allkeys-lru",
		"maxmemory": strconv.FormatInt(c.s.ix.quota(c.tenant.name), 10),
		"databases": strconv.Itoa(numDBs),
	}
	var pairs []string
	for _, a := range args[2:] {
		k := strings.ToLower(string(a))
		if v, ok := values[k]; ok {
			pairs = append(pairs, k, v)
		}
	}
	c.w.mapHeader(len(pairs) / 2)
	for _, p := range pairs {
		c.w.bulkString(p)
	}
	return false
}

// set is SET key value [NX | XX] [EX s | PX ms | EXAT ts | PXAT ms-ts | KEEPTTL].
func (c *conn) set(args [][]byte) bool {
	key, value := args[1], args[2]
	if len(key) > MaxKeyLen {
		c.w.error(fmt.Sprintf("ERR key of %d bytes, at most %d", len(key), MaxKeyLen))
		return false
	}
	var nx, xx, keepTTL bool
	var expiryMs int64
	now := c.s.opts.Clock.Now().UnixMilli()
	for i := 3; i < len(args); i++ {
		opt := upper(args[i])
		switch opt {
		case "NX":
			nx = true
		case "XX":
			xx = true
		case "KEEPTTL":
			keepTTL = true
		case "EX", "PX", "EXAT", "PXAT":
			if i+1 >= len(args) || expiryMs != 0 {
				c.w.error("ERR syntax error")
				return false
			}
			n, err := strconv.ParseInt(string(args[i+1]), 10, 64)
			if err != nil {
				c.w.error("ERR value is not an integer or out of range")
				return false
			}
			i++
			if n <= 0 || n > 1<<46 {
				c.w.error("ERR invalid expire time in 'set' command")
				return false
			}
			switch opt {
			case "EX":
				expiryMs = now + n*1000
			case "PX":
				expiryMs = now + n
			case "EXAT":
				expiryMs = n * 1000
			case "PXAT":
				expiryMs = n
			}
		default:
			c.w.error("ERR syntax error")
			return false
		}
	}
	if (nx && xx) || (keepTTL && expiryMs != 0) {
		c.w.error("ERR syntax error")
		return false
	}
	if nx || xx || keepTTL {
		exp, exists := c.s.st.ttl(c.tenant, c.db, key)
		if (nx && exists) || (xx && !exists) {
			c.w.null()
			return false
		}
		if keepTTL {
			expiryMs = exp
		}
	}
	if len(value) <= smallArg {
		value = bytes.Clone(value) // the reader's arena is reused; large values are the command's own
		if value == nil {
			value = []byte{}
		}
	}
	if err := c.s.st.set(c.tenant, c.db, key, value, expiryMs); err != nil {
		c.w.error(storeError(err))
		return false
	}
	c.w.simple("OK")
	return false
}

// storeError is the reply to a failure of the store.
func storeError(err error) string {
	if errors.Is(err, ErrQuota) {
		return "OOM " + strings.TrimPrefix(err.Error(), "respstore: ")
	}
	return "ERR " + err.Error()
}

// get answers GET. A value decoded from the Archive keeps its reader
// slot until it is written: the slots bound that memory.
func (c *conn) get(args [][]byte) bool {
	return c.getOne(args[1], false)
}

func (c *conn) getOne(key []byte, inArray bool) (quit bool) {
	c.s.st.acquireReader()
	v, tier, err := c.s.st.get(c.tenant, c.db, key)
	if v == nil || !ownBuffer(tier) {
		c.s.st.releaseReader()
	} else {
		defer c.s.st.releaseReader()
	}
	switch {
	case err != nil && inArray:
		c.w.null() // MGET answers nil for what it cannot read
	case err != nil:
		c.w.error(storeError(err))
	case v == nil:
		c.w.null()
	default:
		return c.bulk(v)
	}
	return false
}

func (c *conn) mget(args [][]byte) bool {
	c.w.array(len(args) - 1)
	for _, k := range args[1:] {
		if c.getOne(k, true) {
			return true
		}
	}
	return false
}

func (c *conn) exists(args [][]byte) bool {
	var n int64
	for _, k := range args[1:] {
		if c.s.st.exists(c.tenant, c.db, k) {
			n++
		}
	}
	c.w.int(n)
	return false
}

func (c *conn) del(args [][]byte) bool {
	var n int64
	for _, k := range args[1:] {
		found, err := c.s.st.del(c.tenant, c.db, k)
		if err != nil {
			c.w.error(storeError(err))
			return false
		}
		if found {
			n++
		}
	}
	c.w.int(n)
	return false
}

func (c *conn) ttl(args [][]byte, unit time.Duration) bool {
	exp, ok := c.s.st.ttl(c.tenant, c.db, args[1])
	switch {
	case !ok:
		c.w.int(-2)
	case exp == 0:
		c.w.int(-1)
	default:
		left := time.Duration(exp-c.s.opts.Clock.Now().UnixMilli()) * time.Millisecond
		c.w.int(int64((left + unit/2) / unit))
	}
	return false
}

func (c *conn) dbsize(_ [][]byte) bool {
	n, _ := c.s.ix.count(c.tenant, c.db)
	c.w.int(int64(n))
	return false
}

func (c *conn) flushdb(args [][]byte) bool {
	if len(args) == 2 && upper(args[1]) != "ASYNC" && upper(args[1]) != "SYNC" {
		c.w.error("ERR syntax error")
		return false
	}
	if err := c.s.st.flush(c.tenant, c.db); err != nil {
		c.w.error(storeError(err))
		return false
	}
	c.w.simple("OK")
	return false
}

func (c *conn) flushall(args [][]byte) bool {
	if len(args) == 2 && upper(args[1]) != "ASYNC" && upper(args[1]) != "SYNC" {
		c.w.error("ERR syntax error")
		return false
	}
	for db := range numDBs {
		if err := c.s.st.flush(c.tenant, db); err != nil {
			c.w.error(storeError(err))
			return false
		}
	}
	c.w.simple("OK")
	return false
}

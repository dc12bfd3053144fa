package respstore

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"time"
)

// The wire format is RESP (the Redis serialization protocol): requests are
// arrays of bulk strings ("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n") or, for
// people at a terminal, inline lines ("GET k\r\n"); replies are RESP2
// unless the connection switched to RESP3 with HELLO 3.
//
// A request's arguments are read in one of two ways. Small ones (at most
// smallArg bytes) are copied into the connection's arena, reused for every
// command. A large one (a value) is read straight from the socket into a
// slice of exactly its size, allocated only once the server's in-flight
// budget (Options.MaxInflightBytes) grants its bytes: however many
// connections announce big values at once, the memory they hold waiting
// is bounded, and a value is copied from the kernel once. That slice
// becomes the stored value (kv.PutBlobOptions.Owned).

const (
	// smallArg is the largest argument read into the connection's arena.
	smallArg = 64 << 10
	// maxArena bounds the small arguments of one command together.
	maxArena = 4 << 20
	// maxInline bounds an inline command's line, as Redis does.
	maxInline = 64 << 10
	// readChunk is how much of a large argument is read per read deadline:
	// a client must send at least this much per Options.ReadTimeout.
	readChunk = 16 << 20
	// bigReply is the size from which a bulk reply is written from the
	// value itself (writev) instead of being copied into the write buffer.
	bigReply = 32 << 10
)

// Limits of a client that has not authenticated: Redis 7 allows it
// commands of at most 10 arguments of at most 16 KiB each, so it cannot
// make the server buffer anything large.
const (
	preAuthMaxArgs = 10
	preAuthMaxBulk = 16 << 10
)

// errProto is a malformed request: the reply is "-ERR Protocol error: …"
// and the connection is closed, since what follows cannot be framed.
type errProto struct{ msg string }

func (e *errProto) Error() string { return "Protocol error: " + e.msg }

func protoErr(msg string) error { return &errProto{msg} }

// limits bound what a request may hold.
type limits struct {
	maxArgs int   // arguments in one command
	maxBulk int64 // bytes in one argument
}

// request is one parsed command. args alias the reader's arena (small
// arguments) or slices of their own (large ones, listed in owned); both
// are valid until the next read.
type request struct {
	args [][]byte
	// big is the total size of the arguments read into slices of their
	// own, which the caller releases from the in-flight budget after the
	// command ran.
	big int64
}

// reader parses requests from one connection.
type reader struct {
	br    *bufio.Reader
	conn  net.Conn // for read deadlines; nil in tests of the parser alone
	arena []byte
	args  [][]byte
	// acquire reserves n bytes of the in-flight budget before a large
	// argument is allocated, and release gives them back when the command
	// fails to arrive whole; nil means no budget (tests).
	acquire func(n int64) error
	release func(n int64)
	// readTimeout bounds each readChunk of a command once its first byte
	// arrived; zero means none.
	readTimeout time.Duration
}

func newReader(r io.Reader, conn net.Conn) *reader {
	return &reader{br: bufio.NewReaderSize(r, 64<<10), conn: conn}
}

func (r *reader) deadline() {
	if r.conn != nil && r.readTimeout > 0 {
		r.conn.SetReadDeadline(time.Now().Add(r.readTimeout))
	}
}

// next reads one command. It waits without a deadline for the command's
// first byte (an idle connection may stay open), then bounds the rest.
// An empty request (a blank inline line) has no arguments. Errors: io.EOF
// at a clean end, *errProto for malformed input, or the read's error.
func (r *reader) next(lim limits) (req request, err error) {
	defer func() {
		if err != nil && req.big > 0 && r.release != nil {
			r.release(req.big)
		}
	}()
	if r.conn != nil && r.br.Buffered() == 0 {
		r.conn.SetReadDeadline(time.Time{})
		if _, err := r.br.Peek(1); err != nil {
			return request{}, err
		}
	}
	r.deadline()
	r.arena = r.arena[:0]
	r.args = r.args[:0]
	c, err := r.br.ReadByte()
	if err != nil {
		return request{}, err
	}
	if c != '*' {
		r.br.UnreadByte()
		return r.inline()
	}
	n, err := r.number()
	if err != nil {
		return request{}, protoErr("invalid multibulk length")
	}
	if n <= 0 {
		return request{}, nil // "*0\r\n" and "*-1\r\n" are ignored, as by Redis
	}
	if n > int64(lim.maxArgs) {
		return request{}, protoErr("invalid multibulk length")
	}
	for range n {
		c, err := r.br.ReadByte()
		if err != nil {
			return req, eofIsUnexpected(err)
		}
		if c != '$' {
			return req, protoErr("expected '$', got '" + printable(c) + "'")
		}
		size, err := r.number()
		if err != nil || size < 0 || size > lim.maxBulk {
			return req, protoErr("invalid bulk length")
		}
		arg, err := r.bulk(size, &req)
		if err != nil {
			return req, err
		}
		r.args = append(r.args, arg)
	}
	req.args = r.args
	return req, nil
}

// bulk reads a bulk string's size bytes and its CRLF.
func (r *reader) bulk(size int64, req *request) ([]byte, error) {
	var arg []byte
	if size <= smallArg {
		if len(r.arena)+int(size) > maxArena {
			return nil, protoErr("request too large")
		}
		start := len(r.arena)
		r.arena = append(r.arena, make([]byte, size)...)
		arg = r.arena[start : start+int(size) : start+int(size)]
		if _, err := io.ReadFull(r.br, arg); err != nil {
			return nil, eofIsUnexpected(err)
		}
	} else {
		if r.acquire != nil {
			if err := r.acquire(size); err != nil {
				return nil, err
			}
		}
		req.big += size
		arg = make([]byte, size)
		for off := 0; off < len(arg); off += readChunk {
			r.deadline()
			if _, err := io.ReadFull(r.br, arg[off:min(len(arg), off+readChunk)]); err != nil {
				return nil, eofIsUnexpected(err)
			}
		}
	}
	var crlf [2]byte
	if _, err := io.ReadFull(r.br, crlf[:]); err != nil {
		return nil, eofIsUnexpected(err)
	}
	if crlf != [2]byte{'\r', '\n'} {
		return nil, protoErr("invalid bulk length")
	}
	return arg, nil
}

// number reads a decimal integer up to CRLF.
func (r *reader) number() (int64, error) {
	line, err := r.br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return 0, protoErr("invalid length")
		}
		return 0, eofIsUnexpected(err)
	}
	if len(line) < 3 || line[len(line)-2] != '\r' || len(line) > 22 {
		return 0, protoErr("invalid length")
	}
	return strconv.ParseInt(string(line[:len(line)-2]), 10, 64)
}

// inline reads a line of space-separated arguments, with Redis's quoting:
// "double quoted" (escapes \n \r \t \b \a \\ \" \xHH) and 'single quoted'
// (only \' escaped).
func (r *reader) inline() (request, error) {
	line, err := r.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) || len(line) > maxInline {
		return request{}, protoErr("too big inline request")
	}
	if err != nil {
		return request{}, eofIsUnexpected(err)
	}
	line = bytes.TrimSuffix(line[:len(line)-1], []byte{'\r'})
	args, ok := splitInline(r.arena[:0], line)
	if !ok {
		return request{}, protoErr("unbalanced quotes in request")
	}
	r.args = append(r.args[:0], args...)
	return request{args: r.args}, nil
}

// splitInline splits line into arguments appended to arena (which it may
// grow); ok is false on unbalanced quotes.
func splitInline(arena, line []byte) (args [][]byte, ok bool) {
	var starts []int
	i := 0
	for {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i == len(line) {
			break
		}
		start := len(arena)
		switch line[i] {
		case '"':
			i++
			for {
				if i >= len(line) {
					return nil, false
				}
				c := line[i]
				if c == '"' {
					i++
					break
				}
				if c == '\\' && i+1 < len(line) {
					i++
					switch e := line[i]; e {
					case 'n':
						c = '\n'
					case 'r':
						c = '\r'
					case 't':
						c = '\t'
					case 'b':
						c = '\b'
					case 'a':
						c = '\a'
					case 'x':
						if i+2 < len(line) && isHex(line[i+1]) && isHex(line[i+2]) {
							c = unhex(line[i+1])<<4 | unhex(line[i+2])
							i += 2
						} else {
							c = 'x'
						}
					default:
						c = e
					}
				}
				arena = append(arena, c)
				i++
			}
		case '\'':
			i++
			for {
				if i >= len(line) {
					return nil, false
				}
				c := line[i]
				if c == '\'' {
					i++
					break
				}
				if c == '\\' && i+1 < len(line) && line[i+1] == '\'' {
					i++
					c = '\''
				}
				arena = append(arena, c)
				i++
			}
		default:
			for i < len(line) && line[i] != ' ' && line[i] != '\t' {
				arena = append(arena, line[i])
				i++
			}
		}
		// A closing quote must be followed by a space or the end.
		if i < len(line) && line[i] != ' ' && line[i] != '\t' {
			return nil, false
		}
		starts = append(starts, start, len(arena))
	}
	for j := 0; j < len(starts); j += 2 {
		args = append(args, arena[starts[j]:starts[j+1]:starts[j+1]])
	}
	return args, true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

func printable(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return string(c)
	}
	return "\\x" + strconv.FormatUint(uint64(c)>>4, 16) + strconv.FormatUint(uint64(c)&15, 16)
}

func eofIsUnexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// writer buffers one connection's replies. RESP3 changes only how nulls
// and maps are written; every other reply is the same in both versions.
type writer struct {
	conn    net.Conn
	buf     []byte
	resp3   bool
	timeout time.Duration // per write; zero means none
}

func (w *writer) simple(s string) {
	w.buf = append(w.buf, '+')
	w.buf = append(w.buf, s...)
	w.buf = append(w.buf, '\r', '\n')
}

// error writes "-msg"; msg starts with its code (ERR, NOAUTH, WRONGPASS…)
// and holds no CR or LF.
func (w *writer) error(msg string) {
	w.buf = append(w.buf, '-')
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		w.buf = append(w.buf, c)
	}
	w.buf = append(w.buf, '\r', '\n')
}

func (w *writer) int(n int64) {
	w.buf = append(w.buf, ':')
	w.buf = strconv.AppendInt(w.buf, n, 10)
	w.buf = append(w.buf, '\r', '\n')
}

func (w *writer) null() {
	if w.resp3 {
		w.buf = append(w.buf, '_', '\r', '\n')
		return
	}
	w.buf = append(w.buf, '$', '-', '1', '\r', '\n')
}

func (w *writer) array(n int) {
	w.buf = append(w.buf, '*')
	w.buf = strconv.AppendInt(w.buf, int64(n), 10)
	w.buf = append(w.buf, '\r', '\n')
}

// mapHeader starts a map of n pairs: "%n" in RESP3, an array of 2n
// elements in RESP2.
func (w *writer) mapHeader(n int) {
	if w.resp3 {
		w.buf = append(w.buf, '%')
		w.buf = strconv.AppendInt(w.buf, int64(n), 10)
		w.buf = append(w.buf, '\r', '\n')
		return
	}
	w.array(2 * n)
}

func (w *writer) bulkString(s string) {
	w.buf = append(w.buf, '$')
	w.buf = strconv.AppendInt(w.buf, int64(len(s)), 10)
	w.buf = append(w.buf, '\r', '\n')
	w.buf = append(w.buf, s...)
	w.buf = append(w.buf, '\r', '\n')
}

// bulk writes b as a bulk string. A large b is not copied: what is
// buffered, b and the final CRLF go out in one writev, so b must not
// change until bulk returns (stored values never change).
func (w *writer) bulk(b []byte) error {
	w.buf = append(w.buf, '$')
	w.buf = strconv.AppendInt(w.buf, int64(len(b)), 10)
	w.buf = append(w.buf, '\r', '\n')
	if len(b) < bigReply {
		w.buf = append(w.buf, b...)
		w.buf = append(w.buf, '\r', '\n')
		return nil
	}
	// Each writev carries at most readChunk bytes of b, with the deadline
	// renewed between them: a slow reader gets time in proportion.
	head := w.buf
	for off := 0; off < len(b); off += readChunk {
		end := min(len(b), off+readChunk)
		bufs := net.Buffers{head, b[off:end]}
		if end == len(b) {
			bufs = append(bufs, crlf)
		}
		if err := w.writeBuffers(&bufs); err != nil {
			w.buf = w.buf[:0]
			return err
		}
		head = nil
	}
	w.buf = w.buf[:0]
	return nil
}

var crlf = []byte{'\r', '\n'}

func (w *writer) writeBuffers(bufs *net.Buffers) error {
	if w.timeout > 0 {
		w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
	}
	_, err := bufs.WriteTo(w.conn)
	return err
}

// flush writes what is buffered.
func (w *writer) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	if w.timeout > 0 {
		w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
	}
	_, err := w.conn.Write(w.buf)
	if cap(w.buf) > 1<<20 {
		w.buf = nil // a pipeline of many replies grew it: let it go
	} else {
		w.buf = w.buf[:0]
	}
	return err
}

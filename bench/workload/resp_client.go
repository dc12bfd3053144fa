package workload

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// respConn is the benchmark's RESP client: what LMCache's native resp
// connector does (csrc/storage_backends/redis/connector.cpp), one
// connection per worker, each SET one writev (header, value, CRLF) and
// "+OK\r\n" read back, each GET's value read into the worker's buffer. The
// same client measures every server.
type respConn struct {
	c  net.Conn
	br *bufio.Reader
}

var errRESPMiss = errors.New("bench: resp: nil")

func dialRESP(addr, user, pass string) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	r := &respConn{c: c, br: bufio.NewReaderSize(c, 64<<10)}
	if pass != "" {
		args := []string{"AUTH", pass}
		if user != "" {
			args = []string{"AUTH", user, pass}
		}
		if _, err := r.do(args...); err != nil {
			c.Close()
			return nil, fmt.Errorf("AUTH: %w", err)
		}
	}
	return r, nil
}

func (r *respConn) Close() error { return r.c.Close() }

func encodeCmd(args ...string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return []byte(b.String())
}

// do sends a small command and returns its reply: a simple string, an
// integer's digits, or a bulk string's bytes.
func (r *respConn) do(args ...string) (string, error) {
	r.c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := r.c.Write(encodeCmd(args...)); err != nil {
		return "", err
	}
	line, err := r.br.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$', '_':
		if line == "$-1" || line == "_" {
			return "", errRESPMiss
		}
		n, _ := strconv.Atoi(line[1:])
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r.br, b); err != nil {
			return "", err
		}
		return string(b[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		for range n { // read and drop the elements (CONFIG GET, …)
			if _, err := r.readAny(); err != nil {
				return "", err
			}
		}
		return line, nil
	}
	return "", fmt.Errorf("reply %q", line)
}

func (r *respConn) readAny() (string, error) {
	line, err := r.br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if line[0] == '$' {
		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		if n >= 0 {
			b := make([]byte, n+2)
			_, err = io.ReadFull(r.br, b)
			return string(b[:n]), err
		}
	}
	return line, nil
}

// set stores value under key.
func (r *respConn) set(key string, value []byte) error {
	r.c.SetDeadline(time.Now().Add(2 * time.Minute))
	head := fmt.Appendf(nil, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n", len(key), key, len(value))
	bufs := net.Buffers{head, value, []byte("\r\n")}
	if _, err := bufs.WriteTo(r.c); err != nil {
		return err
	}
	var ok [5]byte
	if _, err := io.ReadFull(r.br, ok[:]); err != nil {
		return err
	}
	if string(ok[:]) != "+OK\r\n" {
		rest, _ := r.br.ReadString('\n')
		return fmt.Errorf("SET: %q", string(ok[:])+rest)
	}
	return nil
}

// get reads key's value into buf (grown when too small) and returns it;
// errRESPMiss when there is none.
func (r *respConn) get(key string, buf []byte) ([]byte, error) {
	r.c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := r.c.Write(encodeCmd("GET", key)); err != nil {
		return nil, err
	}
	line, err := r.br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if line == "$-1\r\n" || line == "_\r\n" {
		return nil, errRESPMiss
	}
	if line[0] != '$' {
		return nil, fmt.Errorf("GET: %q", strings.TrimSpace(line))
	}
	n, err := strconv.Atoi(line[1 : len(line)-2])
	if err != nil || n < 0 {
		return nil, fmt.Errorf("GET: header %q", line)
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r.br, buf); err != nil {
		return nil, err
	}
	var crlf [2]byte
	if _, err := io.ReadFull(r.br, crlf[:]); err != nil || crlf != [2]byte{'\r', '\n'} {
		return nil, fmt.Errorf("GET: trailer %q %v", crlf, err)
	}
	return buf, nil
}

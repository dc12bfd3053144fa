// Package jsonscan checks JSON in one pass, without recursion, and walks an
// object's top-level members (Members, read in a loop of the caller's):
// what the proxy needs of a request body or an upstream's answer before it
// forwards them.
//
// It accepts exactly what encoding/json.Valid accepts (RFC 8259 values,
// whitespace around them, nesting at most MaxDepth deep; bytes are not
// checked for UTF-8), checked against it by FuzzValid. A string's plain
// bytes are scanned eight at a time: a chat request is mostly message text
// (BenchmarkValid). A recursive checker runs out of stack on a body of
// eight million '[' (gjson.ValidBytes did: a fatal error, not a panic).
package jsonscan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"unsafe"
)

// MaxDepth is the deepest nesting accepted, encoding/json's.
const MaxDepth = 10000

// Valid reports whether data is one JSON value with optional whitespace
// around it.
func Valid(data []byte) bool {
	end, ok := Value(data, skipWS(data, 0))
	return ok && skipWS(data, end) == len(data)
}

// Members walks the top-level members of data, one JSON object with
// optional whitespace around it, in one pass that also checks it:
//
//	m := jsonscan.Members(data)
//	for m.Next() {
//		key, value := m.Key(), m.Value()
//	}
//	if !m.Valid() { // data is not one JSON object
//	}
//
// A key is as it is written (quotes and escapes included; Name reads it),
// a value its bytes, both slices of data. Next stops at the first thing
// that is not valid JSON: the members before it have been seen.
func Members(data []byte) Scanner {
	return Scanner{data: data}
}

// Scanner is Members' walk over one object. The zero Scanner holds no
// object.
type Scanner struct {
	data       []byte
	i          int // where the next member's key starts, once started
	key, value []byte
	started    bool
	done       bool
	valid      bool
}

// Next moves to the next member and reports whether there is one; once
// it reports false, Valid tells whether the object was whole and valid.
func (s *Scanner) Next() bool {
	if s.done {
		return false
	}
	data, i := s.data, s.i
	if !s.started {
		s.started = true
		i = skipWS(data, 0)
		if i >= len(data) || data[i] != '{' {
			return s.end(false)
		}
		i = skipWS(data, i+1)
		if i < len(data) && data[i] == '}' {
			return s.end(skipWS(data, i+1) == len(data))
		}
	} else {
		i = skipWS(data, i)
		if i >= len(data) {
			return s.end(false)
		}
		switch data[i] {
		case ',':
			i = skipWS(data, i+1)
		case '}':
			return s.end(skipWS(data, i+1) == len(data))
		default:
			return s.end(false)
		}
	}
	if i >= len(data) || data[i] != '"' {
		return s.end(false)
	}
	k := i
	end, ok := str(data, i+1)
	if !ok {
		return s.end(false)
	}
	s.key = data[k:end]
	i = skipWS(data, end)
	if i >= len(data) || data[i] != ':' {
		return s.end(false)
	}
	i = skipWS(data, i+1)
	v := i
	if i, ok = Value(data, i); !ok {
		return s.end(false)
	}
	s.value, s.i = data[v:i:i], i
	return true
}

// end finishes the walk: valid is whether data was one valid object.
func (s *Scanner) end(valid bool) bool {
	s.done, s.valid, s.key, s.value = true, valid, nil, nil
	return false
}

// Key is the current member's key, as written (quotes and escapes included).
func (s *Scanner) Key() []byte { return s.key }

// Value is the current member's value, its bytes.
func (s *Scanner) Value() []byte { return s.value }

// Valid reports, once Next reported false, whether data was one JSON
// object, whole and valid.
func (s *Scanner) Valid() bool { return s.done && s.valid }

// Name is the text of key, a JSON string as Members hands it over (quotes
// and escapes included), as encoding/json reads it. Without escapes, the
// common case, it is a view of key's bytes (no copy: it lives as long as
// they do).
func Name(key []byte) string {
	if len(key) < 2 {
		return ""
	}
	if bytes.IndexByte(key, '\\') < 0 {
		return unsafe.String(unsafe.SliceData(key[1:]), len(key)-2)
	}
	var s string
	_ = json.Unmarshal(key, &s)
	return s
}

// Value checks the JSON value that starts at data[i] (no whitespace before
// it) and returns where it ends.
func Value(data []byte, i int) (end int, ok bool) {
	var kinds [MaxDepth/64 + 1]uint64 // bit d set: the container at depth d is an object
	depth := 0
	for {
		// A value starts at i.
		if i >= len(data) {
			return i, false
		}
		switch c := data[i]; {
		case c == '{' || c == '[':
			if depth == MaxDepth {
				return i, false
			}
			if c == '{' {
				kinds[depth/64] |= 1 << (depth % 64)
			} else {
				kinds[depth/64] &^= 1 << (depth % 64)
			}
			depth++
			i = skipWS(data, i+1)
			if i < len(data) && (c == '{' && data[i] == '}' || c == '[' && data[i] == ']') {
				depth--
				i++
				break // an empty container: a value that ended
			}
			if c == '{' {
				if i, ok = member(data, i); !ok {
					return i, false
				}
			}
			continue
		case c == '"':
			if i, ok = str(data, i+1); !ok {
				return i, false
			}
		case c == '-' || '0' <= c && c <= '9':
			if i, ok = number(data, i); !ok {
				return i, false
			}
		case c == 't':
			if i, ok = literal(data, i, "true"); !ok {
				return i, false
			}
		case c == 'f':
			if i, ok = literal(data, i, "false"); !ok {
				return i, false
			}
		case c == 'n':
			if i, ok = literal(data, i, "null"); !ok {
				return i, false
			}
		default:
			return i, false
		}
		// A value ended at i: close containers, or go on to the next.
		for {
			if depth == 0 {
				return i, true
			}
			i = skipWS(data, i)
			if i >= len(data) {
				return i, false
			}
			object := kinds[(depth-1)/64]&(1<<((depth-1)%64)) != 0
			c := data[i]
			if c == ',' {
				i = skipWS(data, i+1)
				if object {
					if i, ok = member(data, i); !ok {
						return i, false
					}
				}
				break // the next value starts at i
			}
			if object && c == '}' || !object && c == ']' {
				depth--
				i++
				continue
			}
			return i, false
		}
	}
}

// member checks a member's key and colon at data[i] and returns where its
// value starts.
func member(data []byte, i int) (int, bool) {
	if i >= len(data) || data[i] != '"' {
		return i, false
	}
	i, ok := str(data, i+1)
	if !ok {
		return i, false
	}
	i = skipWS(data, i)
	if i >= len(data) || data[i] != ':' {
		return i, false
	}
	return skipWS(data, i+1), true
}

func skipWS(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// special marks, in the high bit of each of the eight bytes of w, the
// quotes, backslashes and control bytes. A borrow may mark a byte above a
// marked one, never one below: the lowest mark is always right.
func special(w uint64) uint64 {
	zero := func(v uint64) uint64 { return (v - ones) & ^v & highs }
	return (w-ones*0x20)&^w&highs | zero(w^(ones*'"')) | zero(w^(ones*'\\'))
}

// str checks the rest of a string whose opening quote is at i-1 and
// returns where it ends, after its closing quote.
func str(data []byte, i int) (int, bool) {
	for {
		for i+8 <= len(data) {
			if m := special(binary.LittleEndian.Uint64(data[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3 // the first byte to look at
				break
			}
			i += 8
		}
		if i >= len(data) {
			return i, false
		}
		switch c := data[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			i++
			if i >= len(data) {
				return i, false
			}
			switch data[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if i+4 >= len(data) || !hex(data[i+1]) || !hex(data[i+2]) || !hex(data[i+3]) || !hex(data[i+4]) {
					return i, false
				}
				i += 5
			default:
				return i, false
			}
		case c < 0x20:
			return i, false
		default:
			i++
		}
	}
}

func hex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func digit(data []byte, i int) bool { return i < len(data) && '0' <= data[i] && data[i] <= '9' }

// number checks the number at data[i] and returns where it ends.
func number(data []byte, i int) (int, bool) {
	if data[i] == '-' {
		i++
	}
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case digit(data, i):
		for digit(data, i) {
			i++
		}
	default:
		return i, false
	}
	if i < len(data) && data[i] == '.' {
		i++
		if !digit(data, i) {
			return i, false
		}
		for digit(data, i) {
			i++
		}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if !digit(data, i) {
			return i, false
		}
		for digit(data, i) {
			i++
		}
	}
	return i, true
}

func literal(data []byte, i int, lit string) (int, bool) {
	if len(data)-i < len(lit) || unsafe.String(unsafe.SliceData(data[i:]), len(lit)) != lit {
		return i, false
	}
	return i + len(lit), true
}

package frontdoor

import "bytes"

// Chunked decodes a chunked body (RFC 9112 §7.1): the one decoder of the
// front door, for a client's request and for an upstream's answer to the
// event loop.
//
// A request's body is decoded strictly, as nginx's ngx_http_parse_chunked
// does: hex sizes (leading zeros allowed, a size that overflows refused),
// chunk extensions skipped (a control character in one refused), CRLF or
// a bare LF after a size and after data, each size and trailer line
// bounded, the trailer section checked and dropped — trailer fields never
// become header fields.
//
// An answer's body is decoded leniently (Lenient), as the event loop has
// read upstreams since it was built (TestEventLoopMatchesFasthttp holds it
// to the forward path's client on the answers it knows): a size line ends
// at its LF whatever comes between the size and it, trailer lines are
// skipped unread, no line is bounded — an upstream is not a client, and
// refusing its answer only turns it into a 502. The size, the data's line
// end and the body's end are read as strictly as a request's.
//
// The zero value decodes a request; Reset readies it for another body of
// the same kind.
type Chunked struct {
	// Lenient decodes an upstream's answer (above).
	Lenient bool

	st     uint8
	digits uint8
	size   int64 // the chunk's size, then what is left of its data
	line   int   // bytes of the current size or trailer line
	colon  bool  // the trailer line's colon came
	total  int64 // data bytes decoded
}

const (
	ckSize = iota
	ckSizeCR
	ckExt
	ckData
	ckDataCR
	ckDataLF
	ckTrailer     // the start of a trailer line, or the final CRLF
	ckTrailerLine // within a trailer line
	ckTrailerCR
	ckFinalLF
)

// Reset readies d for another body of the same kind.
func (d *Chunked) Reset() { *d = Chunked{Lenient: d.Lenient} }

// Feed decodes b, appending the data to *out (out nil: the data is
// skipped) within maxBody (0: no bound) and bounding each size and trailer
// line by maxLine (0: DefaultMaxLine; Lenient: none). It returns how many
// bytes of b it consumed, whether the body ended (then the bytes after n
// belong to the next request or answer), or an *Error.
func (d *Chunked) Feed(b []byte, out *[]byte, maxBody int64, maxLine int) (n int, done bool, err error) {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	i := 0
	for i < len(b) {
		ch := b[i]
		switch d.st {
		case ckSize:
			v, ok := unhex(ch)
			switch {
			case ok:
				if d.digits >= 15 {
					return i, false, errBadRequest("a chunk size is too large")
				}
				d.size = d.size<<4 | int64(v)
				d.digits++
			case d.digits == 0:
				return i, false, errBadRequest("a chunk size is not hexadecimal")
			case d.Lenient && (ch == '\r' || ch == '\n' || ch == ';' || ch == ' ' || ch == '\t'):
				d.st = ckExt // the size line ends at its LF
				continue
			case ch == '\r':
				d.st = ckSizeCR
			case ch == '\n':
				d.endSize()
			case ch == ';' || ch == ' ' || ch == '\t':
				d.st = ckExt
			default:
				return i, false, errBadRequest("a chunk size is not hexadecimal")
			}
			i++
			d.line++
		case ckExt:
			if d.Lenient {
				j := bytes.IndexByte(b[i:], '\n')
				if j < 0 {
					return len(b), false, nil
				}
				i += j + 1
				d.endSize()
				continue
			}
			j := bytes.IndexAny(b[i:], "\r\n")
			if j < 0 {
				j = len(b) - i
			}
			for _, c := range b[i : i+j] {
				if c < ' ' && c != '\t' || c == 0x7f {
					return i, false, errBadRequest("a chunk extension holds a control character")
				}
			}
			i += j
			d.line += j
			if i < len(b) {
				if b[i] == '\r' {
					d.st = ckSizeCR
				} else {
					d.endSize()
				}
				i++
			}
		case ckSizeCR:
			if ch != '\n' {
				return i, false, errBadRequest("a CR in a chunked body is not followed by LF")
			}
			d.endSize()
			i++
		case ckData:
			k := int(min(int64(len(b)-i), d.size))
			if maxBody > 0 && d.total+int64(k) > maxBody {
				return i, false, errTooLarge(maxBody)
			}
			if out != nil {
				*out = append(*out, b[i:i+k]...)
			}
			i += k
			d.size -= int64(k)
			d.total += int64(k)
			if d.size == 0 {
				d.st = ckDataCR
			}
		case ckDataCR:
			switch ch {
			case '\r':
				d.st = ckDataLF
			case '\n':
				d.st = ckSize
			default:
				return i, false, errBadRequest("a chunk's data is longer than its size")
			}
			i++
		case ckDataLF:
			if ch != '\n' {
				return i, false, errBadRequest("a CR in a chunked body is not followed by LF")
			}
			d.st = ckSize
			i++
		case ckTrailer:
			switch ch {
			case '\r':
				d.st = ckFinalLF
			case '\n':
				return i + 1, true, nil
			case ' ', '\t':
				if !d.Lenient {
					return i, false, errBadRequest("a trailer line continues the one before it (obs-fold)")
				}
				d.st = ckTrailerLine
				d.line = 0
				continue
			default:
				d.st = ckTrailerLine
				d.line = 0
				continue
			}
			i++
		case ckTrailerLine:
			if d.Lenient { // skipped unread
				j := bytes.IndexByte(b[i:], '\n')
				if j < 0 {
					return len(b), false, nil
				}
				i += j + 1
				d.st = ckTrailer
				continue
			}
			// A trailer field is checked as a header field would be
			// (a token, a colon, a value without control characters),
			// and dropped.
			switch {
			case ch == '\r' || ch == '\n':
				if !d.colon {
					return i, false, errBadRequest("a trailer line is not a field")
				}
				d.colon = false
				d.st = ckTrailer
				if ch == '\r' {
					d.st = ckTrailerCR
				}
			case !d.colon && ch == ':' && d.line > 0:
				d.colon = true
			case !d.colon && !tokenChar[ch]:
				return i, false, errBadRequest("a trailer name is not a token")
			case d.colon && (ch < ' ' && ch != '\t' || ch == 0x7f):
				return i, false, errBadRequest("a trailer value holds a control character")
			}
			i++
			d.line++
		case ckTrailerCR:
			if ch != '\n' {
				return i, false, errBadRequest("a CR in a chunked body is not followed by LF")
			}
			d.st = ckTrailer
			i++
		case ckFinalLF:
			if ch != '\n' {
				return i, false, errBadRequest("a CR in a chunked body is not followed by LF")
			}
			return i + 1, true, nil
		}
		if d.line > maxLine && !d.Lenient {
			return i, false, errBadRequest("a chunk size or trailer line is too long")
		}
	}
	return i, false, nil
}

// endSize ends a size line: data follows, or the trailer after the last
// chunk.
func (d *Chunked) endSize() {
	d.digits, d.line = 0, 0
	if d.size == 0 {
		d.st = ckTrailer
	} else {
		d.st = ckData
	}
}

// PeekChunk reads the whole chunk p starts with, without decoding it: its
// data size and where the next chunk starts. ok is false when p does not
// hold the chunk whole, and when the chunk is not plainly framed: a size of
// at most 8 hex digits, then CRLF, or extensions after ';' or blanks up to
// the CR; the data, then CRLF; the last chunk with no trailers. Plain on
// purpose: its callers ask whether reading on would wait (the proxy's
// upstream body, read by fasthttp), and "no" is always a safe answer;
// Chunked decodes.
func PeekChunk(p []byte) (size, next int, ok bool) {
	i := 0
	for ; i < len(p) && i < 8; i++ { // 8 hex digits: up to 4 GiB, past any buffer
		h, isHex := unhex(p[i])
		if !isHex {
			break
		}
		size = size<<4 | int(h)
	}
	if i == 0 || i == len(p) {
		return 0, 0, false
	}
	if _, isHex := unhex(p[i]); i == 8 && isHex {
		return 0, 0, false
	}
	if p[i] != '\r' {
		if p[i] != ';' && p[i] != ' ' && p[i] != '\t' {
			return 0, 0, false
		}
		j := bytes.IndexByte(p[i:], '\r')
		if j < 0 {
			return 0, 0, false
		}
		i += j
	}
	if i+1 >= len(p) || p[i+1] != '\n' {
		return 0, 0, false
	}
	data := i + 2 // the chunk's first byte
	if size == 0 {
		return 0, data + 2, len(p) >= data+2 && p[data] == '\r' && p[data+1] == '\n'
	}
	return size, data + size + 2, len(p) >= data+size+2
}

// WholeChunks reports whether p starts with a whole chunked body: whole
// chunks (PeekChunk) up to the last one, which has no trailers.
func WholeChunks(p []byte) bool {
	for len(p) > 0 {
		size, next, ok := PeekChunk(p)
		if !ok {
			return false
		}
		if size == 0 {
			return true
		}
		p = p[next:]
	}
	return false
}

func unhex(ch byte) (byte, bool) {
	switch {
	case '0' <= ch && ch <= '9':
		return ch - '0', true
	case 'a' <= ch && ch <= 'f':
		return ch - 'a' + 10, true
	case 'A' <= ch && ch <= 'F':
		return ch - 'A' + 10, true
	}
	return 0, false
}

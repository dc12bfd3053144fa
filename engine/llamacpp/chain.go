package llamacpp

import (
	"crypto/sha256"
	"encoding/binary"
	"hash/maphash"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/kvsidecar/kvsidecar/internal/jsonscan"
)

// chain describes a request's prompt cut at its natural boundaries: after
// each chat message, or every promptChunk bytes of a completions prompt.
// hashes[i] names the prompt up to and including piece i, chained from a
// seed that binds what else decides the engine's tokens (the model
// fingerprint, the tenant, the tools and template arguments); bytes[i] is
// the size of that prefix. Two requests whose chains share hashes[i] render
// the same tokens up to that point, so a state saved for one is a prefix
// hit for the other: llama.cpp then reuses the tokens it matches.
//
// Hashes are the first 8 bytes of SHA-256, stable across processes (they
// are stored with the states). A collision costs a useless restore, never a
// wrong answer: the engine reuses KV only for the tokens it matches.
type chain struct {
	hashes []uint64
	bytes  []int64
	// pieces[i] hashes piece i alone (unchained), so pieces one prompt
	// moved to another place in the next are recognised (shift.go). Made
	// for requests only, never stored with a state; nil past maxChainLen
	// pieces.
	pieces []uint64
}

// promptChunk is the boundary step of a completions prompt: small enough
// that a shared document is found, large enough that a 1 MB prompt costs
// 4,096 hashes.
const promptChunk = 256

// maxChainLen bounds the pieces kept of one prompt (and stored with a
// state): beyond it, the prompt's tail is one piece. A state's metadata
// then stays under the archive's 64 KiB header limit.
const maxChainLen = 2048

func (c chain) len() int { return len(c.hashes) }

// last returns the hash of the whole prompt, 0 for an empty chain.
func (c chain) last() uint64 {
	if len(c.hashes) == 0 {
		return 0
	}
	return c.hashes[len(c.hashes)-1]
}

// extends reports whether c starts with p: every piece of p, in order.
func (c chain) extends(p chain) bool {
	n := p.len()
	return n > 0 && n <= c.len() && c.hashes[n-1] == p.hashes[n-1]
}

type chainBuilder struct {
	prev uint64
	size int64
	c    chain
	buf  []byte
}

// pieceSeed hashes pieces (chain.pieces): process-local, never stored.
var pieceSeed = maphash.MakeSeed()

func newChainBuilder(seed uint64) *chainBuilder { return &chainBuilder{prev: seed} }

// add appends one piece made of parts (each length-prefixed, so piece
// boundaries cannot shift between parts).
func (b *chainBuilder) add(parts ...[]byte) {
	b.buf = binary.BigEndian.AppendUint64(b.buf[:0], b.prev)
	for _, p := range parts {
		b.buf = binary.AppendUvarint(b.buf, uint64(len(p)))
		b.buf = append(b.buf, p...)
		b.size += int64(len(p))
	}
	sum := sha256.Sum256(b.buf)
	b.prev = binary.BigEndian.Uint64(sum[:8])
	if n := len(b.c.hashes); n == maxChainLen {
		// Fold the tail into the last piece.
		b.c.hashes[n-1], b.c.bytes[n-1] = b.prev, b.size
		b.c.pieces = nil
		return
	}
	b.c.hashes = append(b.c.hashes, b.prev)
	b.c.bytes = append(b.c.bytes, b.size)
	b.c.pieces = append(b.c.pieces, maphash.Bytes(pieceSeed, b.buf[8:]))
}

// chainSeed binds a chain to what decides how the engine tokenizes it
// besides the prompt itself.
func chainSeed(parts ...string) uint64 {
	h := sha256.New()
	for _, p := range parts {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		h.Write([]byte(p))
	}
	return binary.BigEndian.Uint64(h.Sum(nil)[:8])
}

// requestChain returns the chain of a chat or completions request body
// under seed: one piece per chat message (role, name, content, tool calls,
// tool call id), or promptChunk-byte pieces of a string prompt. The tools
// and chat_template_kwargs members, which change how the server renders
// the messages, go into the first piece. A body of another shape gives an
// empty chain (nothing to reuse). Work is linear in the body's size.
func requestChain(seed uint64, body []byte) chain {
	if !jsonscan.Valid(body) {
		return chain{}
	}
	root := gjson.ParseBytes(body)
	b := newChainBuilder(seed)
	if msgs := root.Get("messages"); msgs.IsArray() {
		tools, kwargs := root.Get("tools").Raw, root.Get("chat_template_kwargs").Raw
		first := true
		msgs.ForEach(func(_, m gjson.Result) bool {
			content := m.Get("content")
			cb := []byte(content.Raw)
			if content.Type == gjson.String {
				cb = []byte(content.Str)
			}
			parts := [][]byte{[]byte(m.Get("role").Str), []byte(m.Get("name").Str), cb,
				[]byte(m.Get("tool_calls").Raw), []byte(m.Get("tool_call_id").Str)}
			if first {
				parts = append(parts, []byte(tools), []byte(kwargs))
				first = false
			}
			b.add(parts...)
			return true
		})
		return b.c
	}
	p := root.Get("prompt")
	switch {
	case p.Type == gjson.String:
		s := []byte(p.Str)
		for len(s) > 0 {
			n := min(len(s), promptChunk)
			b.add(s[:n])
			s = s[n:]
		}
	case p.Exists() && p.Raw != "":
		b.add([]byte(p.Raw))
	}
	return b.c
}

// hashStrings renders chain hashes for a engine.SharedStates.
func hashStrings(h []uint64) []string {
	out := make([]string, len(h))
	for i, v := range h {
		out[i] = strconv.FormatUint(v, 16)
	}
	return out
}

package llamacpp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// stateMeta describes one saved engine state: a llama.cpp slot file kept
// as a blob in the kv.Cache under id, with this metadata in the blob's
// Aux, so a restarted connector lists its states without reading them.
type stateMeta struct {
	id string
	// sess is the session key that saved it ("~…" for a stateless request).
	sess string
	// fp is the model fingerprint of the server that wrote it; layout the
	// KV layout read from the file (layers, types, transposition).
	fp, layout string
	// tokens and size are the file's token count and byte size.
	tokens int
	size   int64
	// created orders states; used is the last time one was restored.
	created, used time.Time
	// chain is a prefix of what the state covers.
	chain chain
}

// tokensAt estimates the tokens the state covers up to piece i of its
// chain, in proportion to the bytes.
func (m *stateMeta) tokensAt(i int) int {
	total := m.chain.bytes[m.chain.len()-1]
	if total <= 0 {
		return 0
	}
	return int(int64(m.tokens) * m.chain.bytes[i] / total)
}

const stateMetaVersion = 1

func appendStateMeta(dst []byte, m *stateMeta) []byte {
	str := func(s string) {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	dst = append(dst, stateMetaVersion)
	str(m.sess)
	str(m.fp)
	str(m.layout)
	dst = binary.AppendUvarint(dst, uint64(m.tokens))
	dst = binary.AppendVarint(dst, m.created.UnixNano())
	dst = binary.AppendUvarint(dst, uint64(m.chain.len()))
	for i := range m.chain.hashes {
		dst = binary.BigEndian.AppendUint64(dst, m.chain.hashes[i])
		dst = binary.AppendUvarint(dst, uint64(m.chain.bytes[i]))
	}
	return dst
}

var errStateMeta = errors.New("engine: state metadata malformed")

func parseStateMeta(b []byte) (*stateMeta, error) {
	if len(b) == 0 || b[0] != stateMetaVersion {
		return nil, errStateMeta
	}
	b = b[1:]
	uv := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	str := func() (string, bool) {
		n, ok := uv()
		if !ok || n > uint64(len(b)) {
			return "", false
		}
		s := string(b[:n])
		b = b[n:]
		return s, true
	}
	m := &stateMeta{}
	var ok1, ok2, ok3 bool
	m.sess, ok1 = str()
	m.fp, ok2 = str()
	m.layout, ok3 = str()
	tokens, ok4 := uv()
	created, n := binary.Varint(b)
	if !ok1 || !ok2 || !ok3 || !ok4 || n <= 0 || tokens > 1<<31 {
		return nil, errStateMeta
	}
	b = b[n:]
	count, ok := uv()
	if !ok || count == 0 || count > maxChainLen || count > uint64(len(b))/9 {
		return nil, errStateMeta
	}
	m.tokens, m.created = int(tokens), time.Unix(0, created)
	m.used = m.created
	for range count {
		if len(b) < 8 {
			return nil, errStateMeta
		}
		m.chain.hashes = append(m.chain.hashes, binary.BigEndian.Uint64(b))
		b = b[8:]
		v, ok := uv()
		if !ok {
			return nil, errStateMeta
		}
		m.chain.bytes = append(m.chain.bytes, int64(v))
	}
	if len(b) != 0 {
		return nil, errStateMeta
	}
	return m, nil
}

// maxPerHash bounds the states remembered under one prefix hash (a system
// prompt shared by many sessions): the newest are kept, which are the
// likeliest to be warm.
const maxPerHash = 8

// catalog indexes saved states by the hashes of their chains, so a request
// finds the state sharing its longest prefix in one map lookup per piece.
// Safe for concurrent use.
type catalog struct {
	// mu protects the fields below.
	mu     sync.Mutex
	states map[string]*stateMeta
	byHash map[uint64][]*stateMeta // newest last
	bySess map[string][]*stateMeta // oldest first
	bytes  int64
}

func newCatalog() *catalog {
	return &catalog{states: map[string]*stateMeta{}, byHash: map[uint64][]*stateMeta{}, bySess: map[string][]*stateMeta{}}
}

// add indexes m and returns the states it supersedes: the same session's
// states whose chains m's extends, which it covers entirely, and the
// session's oldest beyond keep. The caller deletes their blobs.
func (c *catalog) add(m *stateMeta, keep int) []*stateMeta {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.states[m.id]; ok {
		c.removeLocked(old)
	}
	c.states[m.id] = m
	c.bytes += m.size
	for _, h := range m.chain.hashes {
		l := append(c.byHash[h], m)
		if len(l) > maxPerHash {
			l = slices.Delete(l, 0, len(l)-maxPerHash)
		}
		c.byHash[h] = l
	}
	var drop []*stateMeta
	for _, o := range c.bySess[m.sess] {
		if m.chain.extends(o.chain) && m.fp == o.fp {
			drop = append(drop, o)
		}
	}
	for _, o := range drop {
		c.removeLocked(o)
	}
	c.bySess[m.sess] = append(c.bySess[m.sess], m)
	if l := c.bySess[m.sess]; len(l) > keep {
		for _, o := range l[:len(l)-keep] {
			drop = append(drop, o)
			c.removeLocked(o)
		}
	}
	return drop
}

func (c *catalog) removeLocked(m *stateMeta) {
	if c.states[m.id] != m {
		return
	}
	delete(c.states, m.id)
	c.bytes -= m.size
	for _, h := range m.chain.hashes {
		l := slices.DeleteFunc(c.byHash[h], func(o *stateMeta) bool { return o == m })
		if len(l) == 0 {
			delete(c.byHash, h)
		} else {
			c.byHash[h] = l
		}
	}
	l := slices.DeleteFunc(c.bySess[m.sess], func(o *stateMeta) bool { return o == m })
	if len(l) == 0 {
		delete(c.bySess, m.sess)
	} else {
		c.bySess[m.sess] = l
	}
}

// remove drops a state from the index.
func (c *catalog) remove(id string) *stateMeta {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.states[id]
	if m != nil {
		c.removeLocked(m)
	}
	return m
}

// session returns the states of a session.
func (c *catalog) session(sess string) []*stateMeta {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.bySess[sess])
}

// lookup returns the state with fingerprint fp sharing the longest prefix
// with ch, the index of the last shared piece, and whether there is one.
func (c *catalog) lookup(fp string, ch chain) (*stateMeta, int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := ch.len() - 1; i >= 0; i-- {
		l := c.byHash[ch.hashes[i]]
		for j := len(l) - 1; j >= 0; j-- {
			m := l[j]
			if m.fp == fp && i < m.chain.len() && m.chain.hashes[i] == ch.hashes[i] {
				return m, i, true
			}
		}
	}
	return nil, 0, false
}

// oldest returns the least recently used state, for a count or byte cap.
func (c *catalog) oldest() *stateMeta {
	c.mu.Lock()
	defer c.mu.Unlock()
	var o *stateMeta
	for _, m := range c.states {
		if o == nil || m.used.Before(o.used) {
			o = m
		}
	}
	return o
}

func (c *catalog) touch(m *stateMeta, now time.Time) {
	c.mu.Lock()
	m.used = now
	c.mu.Unlock()
}

// sizeOf returns the bytes of state id, 0 when it is not indexed.
func (c *catalog) sizeOf(id string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.states[id]; m != nil {
		return m.size
	}
	return 0
}

// size returns the number of states and their bytes.
func (c *catalog) size() (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.states), c.bytes
}

func (m *stateMeta) String() string {
	return fmt.Sprintf("state %s (%d tokens, %d pieces)", m.id, m.tokens, m.chain.len())
}

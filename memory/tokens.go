package memory

import (
	"context"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// Encoding is a tiktoken encoding.
type Encoding uint8

const (
	CL100K Encoding = iota // cl100k_base: gpt-4, gpt-3.5, and the default
	O200K                  // o200k_base: gpt-4o, gpt-4.1, gpt-4.5, gpt-5, o-series
	P50K                   // p50k_base
	R50K                   // r50k_base
	numEncodings
)

var encodingNames = [numEncodings]string{"cl100k_base", "o200k_base", "p50k_base", "r50k_base"}

func (e Encoding) String() string {
	if e < numEncodings {
		return encodingNames[e]
	}
	return "unknown"
}

func encodingByName(name string) (Encoding, bool) {
	for i, n := range encodingNames {
		if n == name {
			return Encoding(i), true
		}
	}
	return 0, false
}

// MessageFraming is the chat-template cost of one message on top of its
// content tokens.
const MessageFraming = 4

// NonTextPartTokens is what one non-text content part (image, audio, file)
// is charged; its real cost depends on the server, which we cannot see.
const NonTextPartTokens = 85

// o200kPrefixes select o200k_base by model name (after any "org/" prefix).
var o200kPrefixes = []string{"gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "gpt-oss", "o1", "o3", "o4"}

// EncodingForModel picks the encoding for a model name: o200k_base for
// gpt-4o / gpt-4.1 / gpt-4.5 / gpt-5 / gpt-oss / o1 / o3 / o4 style names,
// cl100k_base for everything else (including local models, whose real
// tokenizers we do not have; cl100k is a reasonable stand-in).
func EncodingForModel(model string) Encoding {
	m := strings.ToLower(model)
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:]
	}
	for _, p := range o200kPrefixes {
		if !strings.HasPrefix(m, p) {
			continue
		}
		// "o1", "o3-mini": the o-series names must end or continue with a
		// separator; "gpt-4o-mini", "gpt-5.1" may continue with anything.
		if p[0] != 'o' || len(m) == len(p) || !isAlnum(m[len(p)]) {
			return O200K
		}
	}
	return CL100K
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}

var setLoaderOnce sync.Once

// Tokenizer counts tokens with tiktoken-go and caches counts per text hash.
// Encodings load lazily (o200k_base takes about a second) from the BPE files
// embedded by tiktoken-go-loader, so nothing is downloaded. Safe for
// concurrent use; the zero value is not usable, use NewTokenizer.
type Tokenizer struct {
	cache *countCache
}

// encodings are loaded once per process and shared: they are immutable,
// and building one (o200k_base: 200k ranks, sorted) costs tens of ms.
var encodings [numEncodings]struct {
	once sync.Once
	tk   *tiktoken.Tiktoken
	err  error
}

// NewTokenizer returns a Tokenizer whose cache holds about cacheEntries
// counts (0: no cache).
func NewTokenizer(cacheEntries int) *Tokenizer {
	setLoaderOnce.Do(func() { tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader()) })
	t := &Tokenizer{}
	if cacheEntries > 0 {
		t.cache = newCountCache(cacheEntries)
	}
	return t
}

// Load loads an encoding now, so its cost and errors surface at start-up.
func (t *Tokenizer) Load(e Encoding) error {
	_, err := t.encoding(e)
	return err
}

func (t *Tokenizer) encoding(e Encoding) (*tiktoken.Tiktoken, error) {
	if e >= numEncodings {
		e = CL100K
	}
	le := &encodings[e]
	le.once.Do(func() { le.tk, le.err = tiktoken.GetEncoding(encodingNames[e]) })
	return le.tk, le.err
}

var countSeed = maphash.MakeSeed()

// Count returns the number of tokens of text (special tokens are counted as
// ordinary text). Its cost is linear in len(text) for any input (see
// CountContext). If the encoding cannot load, which the embedded files
// make impossible short of memory exhaustion, it falls back to one token
// per byte, an over-count that keeps the window within its limit.
func (t *Tokenizer) Count(e Encoding, text string) int {
	n, _ := t.CountContext(context.Background(), e, text)
	return n
}

// CountContext is Count that stops when ctx is done (checked about every
// 16 KiB), returning ctx's error.
//
// tiktoken's byte-pair merge is quadratic in the length of one
// pre-tokenizer piece, and a piece is one run of letters, digits, spaces or
// punctuation: 'a'×100 KB or CJK text without spaces is a single piece
// (12.5 s for 100 KB, 151 s for 400 KB). So the text is counted in
// segments:
//
//   - at a space that follows a non-space character, every encoding's
//     pre-tokenizer starts a new piece, so cutting there changes nothing:
//     ordinary text is cut into segments of about 16 KiB (bounding the
//     tokenizer's per-call memory) and counted exactly;
//   - a run of one character class (letters and marks, digits, white
//     space, other) longer than 128 bytes is cut every 128 bytes, and text
//     with no space for 64 KiB is cut at the next class change: the count
//     of such text is the sum of its segments' counts, an estimate that may
//     differ from tiktoken's by about one token per cut.
//
// Each segment costs at most what 128 bytes of a pathological run cost, so
// the whole is linear: 'a'×400 KB counts in tens of milliseconds, as fast
// per byte as prose (BenchmarkCountPathological).
func (t *Tokenizer) CountContext(ctx context.Context, e Encoding, text string) (int, error) {
	n, _, err := t.countUpTo(ctx, e, text, math.MaxInt)
	return n, err
}

// countUpTo is CountContext that stops once the count passes max: over is
// then true and n (> max) is a lower bound, not cached.
func (t *Tokenizer) countUpTo(ctx context.Context, e Encoding, text string, max int) (n int, over bool, err error) {
	if text == "" {
		return 0, false, nil
	}
	var key uint64
	if t.cache != nil {
		key = maphash.String(countSeed, text) ^ uint64(e)*0x9E3779B97F4A7C15
		if n, ok := t.cache.get(key); ok {
			return n, n > max, nil
		}
	}
	tk, err := t.encoding(e)
	if err != nil {
		return len(text), len(text) > max, nil
	}
	n, over, err = countSegments(ctx, tk, text, max)
	if err != nil {
		return 0, false, err
	}
	if t.cache != nil && !over {
		t.cache.put(key, n)
	}
	return n, over, nil
}

// Segmentation bounds (see CountContext).
const (
	maxRunBytes     = 128      // longest run of one character class counted whole
	segmentBytes    = 16 << 10 // target segment size at exact cuts
	maxSegmentBytes = 64 << 10 // forced cut at a class change beyond this
)

// countSegments counts text segment by segment, checking ctx between
// segments every segmentBytes or so, and stops once the count passes max.
func countSegments(ctx context.Context, tk *tiktoken.Tiktoken, text string, max int) (n int, over bool, err error) {
	since := 0
	forSegments(text, func(seg string) bool {
		if testHookSegment != nil {
			testHookSegment()
		}
		if since >= segmentBytes {
			since = 0
			if err = ctx.Err(); err != nil {
				return false
			}
		}
		n += len(tk.EncodeOrdinary(seg))
		since += len(seg)
		over = n > max
		return !over
	})
	return n, over, err
}

// testHookSegment, when set by a test, runs before each segment is counted.
var testHookSegment func()

// Character classes of the pre-tokenizers' pieces.
const (
	classOther uint8 = iota
	classLetter
	classNumber
	classSpace
)

var asciiClass = func() (c [utf8.RuneSelf]uint8) {
	for i := range c {
		r := rune(i)
		switch {
		case unicode.IsLetter(r):
			c[i] = classLetter
		case unicode.IsNumber(r):
			c[i] = classNumber
		case unicode.IsSpace(r):
			c[i] = classSpace
		}
	}
	return c
}()

func runeClass(r rune) uint8 {
	switch {
	case r < utf8.RuneSelf:
		return asciiClass[r]
	case unicode.IsLetter(r) || unicode.IsMark(r):
		return classLetter
	case unicode.IsNumber(r):
		return classNumber
	case unicode.IsSpace(r):
		return classSpace
	}
	return classOther
}

// forSegments calls yield with consecutive segments that concatenate to
// text, cut as CountContext describes, until yield returns false.
func forSegments(text string, yield func(string) bool) {
	if len(text) <= maxRunBytes {
		yield(text)
		return
	}
	start, runStart := 0, 0
	prev := uint8(255)
	for i := 0; i < len(text); {
		var c uint8
		size := 1
		if b := text[i]; b < utf8.RuneSelf {
			c = asciiClass[b]
		} else {
			var r rune
			r, size = utf8.DecodeRuneInString(text[i:])
			c = runeClass(r)
		}
		cut := false
		if c != prev {
			switch {
			case text[i] == ' ' && prev != classSpace && i-start >= segmentBytes:
				cut = true // exact: a piece starts here in every encoding
			case i-start >= maxSegmentBytes:
				cut = true
			}
			prev, runStart = c, i
		} else if i-runStart >= maxRunBytes {
			cut, runStart = true, i
		}
		if cut && i > start {
			if !yield(text[start:i]) {
				return
			}
			start = i
		}
		i += size
	}
	yield(text[start:])
}

// MessageTokens is the cost of a message in the window: its text, name and
// tool-call tokens, NonTextPartTokens per non-text part, plus MessageFraming.
func (t *Tokenizer) MessageTokens(e Encoding, m *Message) int {
	n, _ := t.MessageTokensContext(context.Background(), e, m)
	return n
}

// MessageTokensContext is MessageTokens that stops when ctx is done.
func (t *Tokenizer) MessageTokensContext(ctx context.Context, e Encoding, m *Message) (int, error) {
	n, _, err := t.messageUpTo(ctx, e, m, math.MaxInt)
	return n, err
}

// messageUpTo is MessageTokensContext that stops once the cost passes max
// (over: n is then a lower bound).
func (t *Tokenizer) messageUpTo(ctx context.Context, e Encoding, m *Message, max int) (n int, over bool, err error) {
	n = MessageFraming + m.nonText*NonTextPartTokens
	for _, s := range [...]string{m.Content, m.Name, m.toolText} {
		c, over, err := t.countUpTo(ctx, e, s, max-n)
		if err != nil {
			return 0, false, err
		}
		n += c
		if over {
			return n, true, nil
		}
	}
	return n, n > max, nil
}

// precounted is a message's cost under one encoding.
type precounted struct {
	enc Encoding
	n   int32
	ok  bool
}

// countCache is a bounded map of text hash → token count: sharded, each
// shard two generations; when the young one fills, the old one is dropped
// and the young one becomes old. Hits in the old one are promoted. This
// keeps recently used counts at O(1) cost without per-entry bookkeeping.
type countCache struct {
	shards   [16]countShard
	perShard int // generation size
}

type countShard struct {
	// mu protects the fields below.
	mu       sync.Mutex
	cur, old map[uint64]int32
}

func newCountCache(entries int) *countCache {
	c := &countCache{perShard: max(1, entries/len(countCache{}.shards)/2)}
	for i := range c.shards {
		c.shards[i].cur = make(map[uint64]int32)
	}
	return c
}

func (c *countCache) get(k uint64) (int, bool) {
	s := &c.shards[k%uint64(len(c.shards))]
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.cur[k]; ok {
		return int(v), true
	}
	if v, ok := s.old[k]; ok {
		s.putLocked(k, v, c.perShard)
		return int(v), true
	}
	return 0, false
}

func (c *countCache) put(k uint64, n int) {
	s := &c.shards[k%uint64(len(c.shards))]
	s.mu.Lock()
	s.putLocked(k, int32(min(n, 1<<31-1)), c.perShard)
	s.mu.Unlock()
}

func (s *countShard) putLocked(k uint64, v int32, gen int) {
	if len(s.cur) >= gen {
		s.old, s.cur = s.cur, make(map[uint64]int32, gen)
	}
	s.cur[k] = v
}

// len reports the number of cached counts (both generations).
func (c *countCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.cur) + len(s.old)
		s.mu.Unlock()
	}
	return n
}

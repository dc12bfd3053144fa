package memory

import (
	"bytes"
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvsidecar/kvsidecar/index"
	"github.com/kvsidecar/kvsidecar/internal/durable"
	"github.com/kvsidecar/kvsidecar/memory/internal/journal"
	"github.com/kvsidecar/kvsidecar/memory/internal/knowledge"
)

// entry is one stored message.
type entry struct {
	seq     uint64
	msg     Message
	key     uint64
	at      time.Time
	partial bool
	dropped bool // left the window (it then has a msg-<seq> unit)
	// indexed: while in the window, its document (msg-<seq>, the id its
	// unit gets when it leaves) is in the session's index in its current
	// text (ragindex.go).
	indexed bool
	tokens  [numEncodings]int32

	// block is the recall block sent right before this message (a user
	// message that began a turn), kept in the transcript where it was
	// sent so that the next prompt extends this one byte for byte; nil
	// when none. blockHashes are the textHash of each memory it shows:
	// what later recall need not show again while it is in the window.
	block       *entry
	blockHashes []uint64

	// chash is the hash of the text (textHash), 0 until first use.
	chash uint64

	// Scoring features, built on first use.
	scored bool
	bow    *bow
	emph   float64
	strct  float64
}

func newEntry(seq uint64, m Message, at time.Time) *entry {
	e := &entry{seq: seq, msg: m, key: m.matchKey(), at: at}
	for i := range e.tokens {
		e.tokens[i] = -1
	}
	if m.pre.ok {
		e.tokens[m.pre.enc] = m.pre.n
	}
	return e
}

func (e *entry) cost(t *Tokenizer, enc Encoding) int {
	if v := e.tokens[enc]; v >= 0 {
		return int(v)
	}
	n := t.MessageTokens(enc, &e.msg)
	e.tokens[enc] = int32(min(n, 1<<31-1))
	return n
}

func (e *entry) features() {
	if !e.scored {
		e.scored = true
		e.bow = makeBow(e.msg.Content + " " + e.msg.toolText)
		e.emph = emphasis(&e.msg)
		e.strct = structure(&e.msg)
	}
}

// contentHash is textHash(e.text()), cached.
func (e *entry) contentHash() uint64 {
	if e.chash == 0 {
		e.chash = textHash(e.text())
	}
	return e.chash
}

// text is what a unit made from the entry holds.
func (e *entry) text() string {
	if e.msg.Content == "" {
		return e.msg.toolText
	}
	if e.msg.toolText != "" {
		return e.msg.Content + "\n" + e.msg.toolText
	}
	return e.msg.Content
}

// record is one log record's payload (JSON). Kinds:
//
//	meta  first record: format version, tenant, session id
//	sys   the client's system messages (replace the previous ones)
//	msg   one history message
//	trunc history cut to Keep messages (the rest become archive units)
//	undo  history cut to Keep messages, the rest discarded: the messages of
//	      a turn whose upstream answer failed (Turn.Fail)
//	blk   the recall block Msg (with the hashes H of what it shows) was sent
//	      right before message Seq (the last one for a message wins)
//	unit  a memory unit's full state (upsert, last one wins)
//	acc   access counts of units
//	del   a unit deleted (ID)
//	xseq  facts were extracted up to message Seq
//	eseq  episodes cover the messages up to Seq
//	decay the decay pass ran at T
//	drop  message Seq left the window without a unit (its content was one)
type record struct {
	K       string                  `json:"k"`
	V       int                     `json:"v,omitempty"`
	Tenant  string                  `json:"tenant,omitempty"`
	Session string                  `json:"session,omitempty"`
	User    string                  `json:"user,omitempty"`
	T       int64                   `json:"t,omitempty"`
	Seq     uint64                  `json:"seq,omitempty"`
	Msg     json.RawMessage         `json:"msg,omitempty"`
	Msgs    []json.RawMessage       `json:"msgs,omitempty"`
	Enc     string                  `json:"enc,omitempty"`
	Tok     []int                   `json:"tok,omitempty"`
	Keep    *int                    `json:"keep,omitempty"`
	Partial bool                    `json:"partial,omitempty"`
	Unit    *Unit                   `json:"unit,omitempty"`
	Acc     []accessRecord          `json:"acc,omitempty"`
	ID      string                  `json:"id,omitempty"`
	Triple  *knowledge.TripleRecord `json:"triple,omitempty"`
	H       []uint64                `json:"h,omitempty"`
}

type accessRecord struct {
	ID    string `json:"id"`
	Count int    `json:"n"`
	Last  int64  `json:"t"`
	Tier  Place  `json:"tier,omitempty"`
}

const logVersion = 1

// session is one (tenant, session id) conversation.
type session struct {
	tenant, id string
	key        string
	path       string
	hash       string // hex hash naming the log, and the session's documents in its user's index

	loadOnce sync.Once
	loadErr  error
	queued   atomic.Bool // in the worker queue
	gone     atomic.Bool // deleted or dropped from memory: look it up again

	// lru is the session's place in the registry's list of loaded sessions
	// and lastUse its last lookup (protected by the registry's mu; lru nil:
	// not resident); size is its estimated resident bytes (resident.go).
	lru     *list.Element
	lastUse time.Time
	size    atomic.Int64
	refs    atomic.Int32 // lookups not yet unpinned (registry.session)

	// mu protects the fields below.
	mu          sync.Mutex
	log         *journal.Log // nil until the first append
	exists      bool         // has a log on disk
	user        string       // the user scope (the meta record's; "" is the tenant's default user)
	nextSeq     uint64
	sys         []*entry
	hist        []*entry
	units       map[string]*Unit
	created     time.Time
	updated     time.Time
	lastModel   string
	lastEnc     Encoding
	pending     chan struct{} // closed when the open turn finishes
	prevPrompt  []json.RawMessage
	prevCosts   []int
	summarizing bool
	coveredSeq  uint64 // highest message seq covered by a summary
	accessDirty map[string]bool
	syncing     bool // the worker is syncing it (worker.go)

	// Unit indexes for the request path, rebuilt when unitsVer moves.
	unitsVer uint64
	idxVer   uint64
	sums     []*Unit // summaries by id (oldest first)
	cands    []*Unit // working-tier non-summary units: keyword recall candidates
	pinned   []*Unit // system and core memories by id: always injected
	// sticky is the stable block of the last window, kept byte for byte
	// while no history leaves the window (see stableBlock).
	sticky cachedBlock

	// What the user's cross-session index holds of this session: document
	// id → textHash; uSeq is the last message seq and uUnitsVer the units
	// version synced (see syncUserDocs). uidx is nil until the first sync.
	uidx      map[string]uint64
	uGen      uint64 // the userMem.gen of the copy of the user's index the marks describe
	uSeq      uint64
	uUnitsVer uint64
	uKbVer    uint64   // kb.ver of the links last given to the user's graph
	userDel   []string // documents of deleted units, to remove
	// uSync serialises syncUserDocs for this session (the worker, a user
	// index loading and the shared log's sync may each run one): taken
	// before sess.mu, never while holding it.
	uSync sync.Mutex

	dedup      dedupIndex      // units by content (dedupe.go)
	drops      []uint64        // evicted without a unit, not yet written
	deleted    map[string]bool // ids of deleted units (never recreated)
	delDirty   []string        // deletions not yet written
	lastDecay  time.Time       // last decay pass (zero: none since load)
	lastRecall string          // "full", "reuse" or "" for the last window

	// RAG index (see ragindex.go); ixVer counts changes, ixSaved is the
	// version last written.
	ix         *index.Index
	ixVer      uint64
	ixSaved    uint64
	ixLastSave time.Time

	wm workingMemory

	// Extraction (see extract.go).
	factSeq    uint64 // facts extracted up to this message seq
	episodeSeq uint64 // episodes cover messages up to this seq
	extracting bool   // a job of this session is queued or running
	// turns counts the session's finished client turns since load;
	// extractTurn and summaryTurn are its value when the last extraction
	// job and summary started (at most one of each per turn).
	turns, extractTurn, summaryTurn uint64
	seqDirty                        bool // factSeq or episodeSeq not yet written
	decayDirty                      bool // lastDecay not yet written

	rv sessReview  // the memory reviewer's state (review.go)
	tc sessToolCtx // tool-result context (toolctx.go)

	// sharedN is the length of the shared log (Options.SharedLog) that the
	// state reflects; -1 when unknown (loaded from disk, or new here).
	// sharedLast is recordHash of the record at sharedN-1 (0: none): a
	// tail read checks it, so a list replaced since (a delete elsewhere,
	// then a new session of the id longer than this copy) is rebuilt,
	// never read as this copy's tail. Set both with setShared.
	sharedN    int64
	sharedLast uint64

	kb knowledge.KB      // triples (triples.go)
	l4 knowledge.L4State // L4 compression (l4.go)
}

// unitsChanged invalidates the unit indexes and the cached block.
func (s *session) unitsChanged() { s.unitsVer++ }

// refreshIndex rebuilds sums and cands if units changed.
func (s *session) refreshIndex() {
	if s.idxVer == s.unitsVer && (s.sums != nil || s.cands != nil || s.pinned != nil || len(s.units) == 0) {
		return
	}
	s.idxVer = s.unitsVer
	s.sums, s.cands, s.pinned = s.sums[:0], s.cands[:0], s.pinned[:0]
	for _, u := range s.units {
		switch {
		case u.Type == UnitSummary:
			s.sums = append(s.sums, u)
		case u.Category.Pinned():
			s.pinned = append(s.pinned, u)
		case u.Tier == PlaceWorking:
			s.cands = append(s.cands, u)
		}
	}
	slices.SortFunc(s.sums, func(a, b *Unit) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(s.cands, func(a, b *Unit) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(s.pinned, func(a, b *Unit) int { return strings.Compare(a.ID, b.ID) })
}

// plan is what a request adds to its session, worked out before anything
// is written.
type plan struct {
	mode       Mode
	match      string
	sysChanged bool
	sys        []*entry // the session's system messages after the request
	keep       int      // stored history messages kept (the rest is cut)
	add        []*entry // new history messages
	// dropPartial: the request retries the stored turn whose reply the
	// upstream broke off (a partial reply): that reply is discarded and
	// the stored messages are the turn (see retryOfPartial).
	dropPartial bool
	// sysCost and turnCost are what the system messages and the current
	// turn cost in enc; fits is checkFits' answer for them, the tools and
	// the limit.
	sysCost, turnCost int
	fits              bool
}

// plan relates the request to the stored history and costs what the
// window cannot leave out (in enc, against limit). Called with sess.mu
// held.
func (sess *session) plan(req *TurnRequest, now time.Time, tk *Tokenizer, enc Encoding, limit int) plan {
	msgs := req.Messages
	nsys := 0
	for nsys < len(msgs) && isSystem(msgs[nsys].Role) {
		nsys++
	}
	reqSys, rest := msgs[:nsys], msgs[nsys:]
	var p plan
	var tail []Message
	p.mode, p.keep, tail, p.match = matchRequest(sess, rest, req.Mode)
	if p.mode == ModeAppend && retryOfPartial(sess.hist[:p.keep], tail) {
		p.dropPartial, p.keep, tail, p.match = true, p.keep-1, nil, "retry"
	}
	p.sysChanged = !sameMessages(reqSys, sess.sys)
	if p.mode == ModeAppend && nsys == 0 {
		p.sysChanged = false // an append without system messages keeps the stored ones
	}
	seq := sess.nextSeq
	p.sys = sess.sys
	if p.sysChanged {
		p.sys = make([]*entry, 0, len(reqSys))
		for _, m := range reqSys {
			p.sys = append(p.sys, newEntry(seq, m, now))
			seq++
		}
	}
	p.add = make([]*entry, 0, len(tail))
	for _, m := range tail {
		p.add = append(p.add, newEntry(seq, m, now))
		seq++
	}
	for _, e := range p.sys {
		p.sysCost += e.cost(tk, enc)
	}
	_, p.turnCost = currentTurn(sess.hist[:p.keep], p.add, tk, enc)
	p.fits = checkFits(p.sysCost, p.turnCost, req.ToolsTokens, limit) == nil
	return p
}

// matchRequest relates a request's non-system messages to the stored
// history. It returns the mode taken, how many stored messages to keep,
// the request's messages to append, and the kind of match.
//
// ModeAppend appends everything. Otherwise, in this order:
//   - no stored history: "new", everything is appended;
//   - the request extends the stored history: "extend";
//   - (ModeAuto only) the request holds no assistant message: new input
//     from a client that sends only its newest message: "append";
//   - the request starts inside the stored history and runs to its end
//     (the client trimmed its oldest turns): "trimmed";
//   - the request shares a start with the stored history, or starts inside
//     it and then differs (edit, regenerate, branch): "diverged", the
//     stored history is cut after the shared part (the cut messages become
//     archive units, nothing is lost);
//   - nothing shared: "diverged" at the start (a reused session id).
func matchRequest(sess *session, req []Message, mode Mode) (Mode, int, []Message, string) {
	hist := sess.hist
	if mode == ModeAppend {
		return ModeAppend, len(hist), req, "append"
	}
	if len(hist) == 0 && len(sess.sys) == 0 {
		return ModeFull, 0, req, "new"
	}
	// Equal raw bytes imply equal keys; hash only what differs (typically
	// assistant messages the client re-serialized).
	same := func(e *entry, m *Message) bool {
		return bytes.Equal(e.msg.Raw, m.Raw) || e.key == m.matchKey()
	}
	k := 0
	for k < len(hist) && k < len(req) && same(hist[k], &req[k]) {
		k++
	}
	if k == len(hist) {
		return ModeFull, k, req[k:], "extend"
	}
	if mode == ModeAuto && !slices.ContainsFunc(req, func(m Message) bool { return m.Role == "assistant" }) {
		return ModeAppend, len(hist), req, "append"
	}
	if k > 0 {
		return ModeFull, k, req[k:], "diverged"
	}
	if len(req) == 0 {
		return ModeFull, 0, req, "diverged"
	}
	// The request starts inside the stored history: a trimmed client when
	// it runs to the end from some alignment of its first message, else an
	// edit after the longest (latest on ties) alignment.
	k0 := req[0].matchKey()
	bestP, bestJ := 0, 0
	for p := 1; p < len(hist); p++ {
		if hist[p].key != k0 {
			continue
		}
		j := 1
		for p+j < len(hist) && j < len(req) && same(hist[p+j], &req[j]) {
			j++
		}
		if p+j == len(hist) {
			return ModeFull, len(hist), req[j:], "trimmed"
		}
		if j >= bestJ {
			bestP, bestJ = p, j
		}
	}
	if bestJ > 0 {
		return ModeFull, bestP + bestJ, req[bestJ:], "diverged"
	}
	return ModeFull, 0, req, "diverged"
}

func sameMessages(msgs []Message, es []*entry) bool {
	if len(msgs) != len(es) {
		return false
	}
	for i := range msgs {
		if msgs[i].matchKey() != es[i].key {
			return false
		}
	}
	return true
}

// retryOfPartial reports whether tail, the new messages of an append,
// repeats the turn that ends hist with a partial reply: a client whose
// stream broke retries the same message, which is then stored once.
func retryOfPartial(hist []*entry, tail []Message) bool {
	n := len(hist)
	if len(tail) == 0 || n < len(tail)+1 || tail[len(tail)-1].Role != "user" {
		return false
	}
	if last := hist[n-1]; last.msg.Role != "assistant" || !last.partial {
		return false
	}
	for i := range tail {
		if hist[n-1-len(tail)+i].key != tail[i].matchKey() {
			return false
		}
	}
	return true
}

// currentTurn returns where the current turn starts in hist+add (the newest
// user message; everything after it belongs to the turn too) and its cost.
func currentTurn(hist, add []*entry, tk *Tokenizer, enc Encoding) (start, cost int) {
	n := len(hist) + len(add)
	at := func(i int) *entry {
		if i < len(hist) {
			return hist[i]
		}
		return add[i-len(hist)]
	}
	start = n
	for i := n - 1; i >= 0; i-- {
		cost += at(i).cost(tk, enc)
		if at(i).msg.Role == "user" {
			return i, cost
		}
	}
	return n, 0 // no user message: nothing is mandatory
}

// checkFits is the one context-limit check (MEM-001): the client's system
// messages, the current turn and the tools must fit the limit with nothing
// else. It runs before anything is written.
func checkFits(sysCost, turnCost, tools, limit int) error {
	if sysCost+turnCost+tools > limit {
		return fmt.Errorf("%w: system %d + current turn %d + tools %d tokens > limit %d",
			ErrContextTooLarge, sysCost, turnCost, tools, limit)
	}
	return nil
}

func sessionKey(tenant, id string) string { return tenant + "\x00" + id }

// sessionHash names a session's log (and its documents in its user's
// index) by a hash of tenant and id.
func sessionHash(tenant, id string) string {
	sh := sha256.Sum256([]byte("session\x00" + tenant + "\x00" + id))
	return hex.EncodeToString(sh[:16])
}

// sessionPath derives the log path from hashes only.
func sessionPath(root, tenant, id string) string {
	h := sessionHash(tenant, id)
	return filepath.Join(tenantDir(root, tenant), h[:2], h+".log")
}

func newSession(root, tenant, id string) *session {
	return &session{
		tenant: tenant, id: id, key: sessionKey(tenant, id),
		path: sessionPath(root, tenant, id), hash: sessionHash(tenant, id),
		nextSeq: 1,
		units:   map[string]*Unit{},
		sharedN: -1,
	}
}

// histIndex returns the index in hist of the entry with seq, or -1.
func (s *session) histIndex(seq uint64) int {
	i := sort.Search(len(s.hist), func(i int) bool { return s.hist[i].seq >= seq })
	if i < len(s.hist) && s.hist[i].seq == seq {
		return i
	}
	return -1
}

// noteUnit updates derived state for a unit that was added.
func (s *session) noteUnit(u *Unit) {
	switch u.Type {
	case UnitSummary:
		if u.ToSeq > s.coveredSeq {
			s.coveredSeq = u.ToSeq
		}
	case UnitEpisode:
		s.episodeSeq = max(s.episodeSeq, u.ToSeq)
	case UnitTask, UnitContext:
		if u.FromSeq == u.ToSeq && u.ID == msgUnitID(u.FromSeq) {
			if i := s.histIndex(u.FromSeq); i >= 0 {
				s.hist[i].dropped = true
			}
		}
	}
}

func unitFromEntry(e *entry, tk *Tokenizer, enc Encoding, importance float64, now time.Time) *Unit {
	typ := UnitContext
	if e.msg.Role == "user" {
		typ = UnitTask
	}
	return &Unit{
		ID: msgUnitID(e.seq), Type: typ, Tier: PlaceWorking, Role: e.msg.Role,
		Content: e.text(), Importance: importance, Tokens: e.cost(tk, enc),
		CreatedAt: now, UpdatedAt: now, LastAccess: e.at, At: e.at,
		FromSeq: e.seq, ToSeq: e.seq,
	}
}

// encodeRecord appends r framed to dst: package durable's framing (length,
// payload CRC-32C, header CRC-32C; durable.AppendRecord). The log files that
// hold records are package journal's.
func encodeRecord(dst []byte, r *record) ([]byte, error) {
	p, err := json.Marshal(r)
	if err != nil {
		return dst, fmt.Errorf("memory: encode record: %w", err)
	}
	return durable.AppendRecord(dst, p), nil
}

// sortedUnits returns the units sorted by id.
func (s *session) sortedUnits() []*Unit {
	us := make([]*Unit, 0, len(s.units))
	for _, u := range s.units {
		us = append(us, u)
	}
	sort.Slice(us, func(i, j int) bool { return us[i].ID < us[j].ID })
	return us
}

func (sess *session) hasUnpersisted() bool {
	if len(sess.accessDirty) > 0 || len(sess.delDirty) > 0 || len(sess.drops) > 0 || sess.extracting || sess.decayDirty || sess.seqDirty {
		return true
	}
	for _, u := range sess.units {
		if !u.persisted {
			return true
		}
	}
	return false
}

func (sess *session) reset() {
	sess.nextSeq = 1
	sess.sys, sess.hist = nil, nil
	sess.units = map[string]*Unit{}
	sess.coveredSeq = 0
	sess.prevPrompt, sess.prevCosts = nil, nil
	sess.deleted, sess.delDirty, sess.lastDecay, sess.lastRecall = nil, nil, time.Time{}, ""
	sess.drops, sess.dedup = nil, dedupIndex{}
	sess.ix, sess.ixVer, sess.ixSaved = nil, 0, 0
	sess.uidx, sess.uSeq, sess.uUnitsVer, sess.uKbVer, sess.uGen = nil, 0, 0, 0, 0
	sess.sticky = cachedBlock{}
	sess.wm.reset()
	sess.kb = knowledge.KB{}
	sess.factSeq, sess.episodeSeq = 0, 0
	sess.sharedN, sess.sharedLast = -1, 0
	sess.unitsChanged()
}

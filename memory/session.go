package memory

import (
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

// apply applies a record to the state. msgs, when non-nil, are the parsed
// messages of the record (saving a parse on the live path).
func (s *session) apply(r *record, msgs []Message, tk *Tokenizer) error {
	at := time.Unix(0, r.T)
	if r.T != 0 && at.After(s.updated) {
		s.updated = at
	}
	enc, encOK := encodingByName(r.Enc)
	parse := func(i int, raw json.RawMessage) (Message, error) {
		if msgs != nil {
			return msgs[i], nil
		}
		var m Message
		if err := json.Unmarshal(raw, &m); err != nil {
			return m, err
		}
		return m, nil
	}
	mkEntry := func(seq uint64, m Message, i int) *entry {
		e := newEntry(seq, m, at)
		if encOK && i < len(r.Tok) && r.Tok[i] >= 0 {
			e.tokens[enc] = int32(min(r.Tok[i], 1<<31-1))
		}
		if seq >= s.nextSeq {
			s.nextSeq = seq + 1
		}
		return e
	}
	switch r.K {
	case "meta":
		if r.Tenant != s.tenant || r.Session != s.id {
			return fmt.Errorf("memory: log %s belongs to another session: %w", filepath.Base(s.path), errCorrupt)
		}
		s.created = at
		s.user = r.User
	case "sys":
		sys := make([]*entry, 0, len(r.Msgs))
		for i, raw := range r.Msgs {
			m, err := parse(i, raw)
			if err != nil {
				return err
			}
			sys = append(sys, mkEntry(r.Seq+uint64(i), m, i))
		}
		s.sys = sys
	case "msg":
		m, err := parse(0, r.Msg)
		if err != nil {
			return err
		}
		e := mkEntry(r.Seq, m, 0)
		e.partial = r.Partial
		s.hist = append(s.hist, e)
	case "trunc":
		if r.Keep == nil || *r.Keep < 0 || *r.Keep > len(s.hist) {
			return fmt.Errorf("memory: bad trunc record: %w", errCorrupt)
		}
		for _, e := range s.hist[*r.Keep:] {
			if s.deleted[msgUnitID(e.seq)] {
				s.forgetEntryDoc(e)
				continue
			}
			u := s.units[msgUnitID(e.seq)]
			if u == nil {
				if s.redundant(e) {
					s.forgetEntryDoc(e)
					continue
				}
				u = unitFromEntry(e, tk, s.lastEnc, 0, at)
				u.persisted = true // derived from this record on every replay
				s.putUnit(u)
			}
			u.Tier = PlaceArchive
			u.UpdatedAt = at
		}
		clear(s.hist[*r.Keep:])
		s.hist = s.hist[:*r.Keep]
		s.unitsChanged()
	case "undo":
		if r.Keep == nil || *r.Keep < 0 || *r.Keep > len(s.hist) {
			return fmt.Errorf("memory: bad undo record: %w", errCorrupt)
		}
		for _, e := range s.hist[*r.Keep:] {
			s.forgetEntryDoc(e)
		}
		clear(s.hist[*r.Keep:])
		s.hist = s.hist[:*r.Keep]
	case "blk":
		i := s.histIndex(r.Seq)
		if i < 0 {
			return nil // its message was cut since
		}
		m, err := parse(0, r.Msg)
		if err != nil {
			return err
		}
		s.hist[i].block = mkEntry(0, m, 0)
		s.hist[i].blockHashes = r.H
	case "unit":
		if r.Unit == nil || r.Unit.ID == "" {
			return fmt.Errorf("memory: bad unit record: %w", errCorrupt)
		}
		u := *r.Unit
		normalizeUnit(&u)
		u.persisted = true
		if u.ToSeq >= s.nextSeq {
			s.nextSeq = u.ToSeq + 1
		}
		s.units[u.ID] = &u
		s.noteUnit(&u)
		s.unitsChanged()
	case "acc":
		for _, a := range r.Acc {
			if u := s.units[a.ID]; u != nil {
				u.AccessCount = a.Count
				u.LastAccess = time.Unix(0, a.Last)
				if u.Category != "" {
					touch(u, u.LastAccess)
				}
				if a.Tier != "" && a.Tier != u.Tier {
					u.Tier = a.Tier
					s.unitsChanged()
				}
			}
		}
	case "del":
		if _, ok := s.units[r.ID]; ok {
			delete(s.units, r.ID)
			s.unitsChanged()
		}
		if s.deleted == nil {
			s.deleted = map[string]bool{}
		}
		s.deleted[r.ID] = true
		s.kb.UnitDeleted(r.ID)
	case "triple", "tdel":
		return s.applyTripleRecord(r)
	case "drop":
		// An evicted message whose content a unit already held (dedupe.go).
		if i := s.histIndex(r.Seq); i >= 0 {
			s.hist[i].dropped = true
			s.forgetEntryDoc(s.hist[i])
		}
	case "xseq":
		s.factSeq = max(s.factSeq, r.Seq)
	case "eseq":
		s.episodeSeq = max(s.episodeSeq, r.Seq)
	case "decay":
		if at.After(s.lastDecay) {
			s.lastDecay = at
		}
	case "l4":
		// Clusters whose L4 merge was refused (l4.go).
		for _, fp := range r.H {
			s.l4.Refuse(fp, false)
		}
	default:
		// Unknown kinds come from newer versions; skip them.
	}
	return nil
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

package session

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/internal/keyspace"
)

// Key layout of the Tracker (all values start with formatVersion):
//
//	HWMPrefix + ID(16)  → version(1) | HWM u64 LE | lastTS i64 LE | flags(1)   (18 bytes)
//	ClockKey            → version(1) | WAL clock i64 LE                      (9 bytes)
//
// ClockKey lives inside HWMPrefix but is 7 bytes long where every HWM key is 18,
// so scans tell them apart by length.
const (
	HWMPrefix = keyspace.HWMRow
	ClockKey  = keyspace.HWMClock

	formatVersion = 1
	hwmKeyLen     = len(HWMPrefix) + len(ID{})
	hwmValLen     = 1 + 8 + 8 + 1
	clockValLen   = 1 + 8
	flagClosed    = 1 << 0
)

// Decision is the Tracker's verdict on one event.
type Decision uint8

const (
	// Apply: seq == HWM+1 (or seq == 1 for an unknown session). Apply the event,
	// then Advance.
	Apply Decision = iota + 1
	// Duplicate: seq <= HWM. Already applied; skip it.
	Duplicate
	// Gap: seq > HWM+1. Events are missing; the caller must refuse the batch and
	// never apply past the hole.
	Gap
	// Closed: the session was closed and seq > HWM. Nothing more applies; skip.
	Closed
	// TooOld: the session is unknown (never seen, collected or expired) and the
	// event's timestamp is older than WAL clock − horizon, so it may belong to a
	// collected session; skip it rather than apply it as new.
	TooOld
)

func (d Decision) String() string {
	switch d {
	case Apply:
		return "apply"
	case Duplicate:
		return "duplicate"
	case Gap:
		return "gap"
	case Closed:
		return "closed"
	case TooOld:
		return "too-old"
	}
	return fmt.Sprintf("decision(%d)", uint8(d))
}

var (
	// ErrZeroSeq: SeqNo 0 means "no seqno"; such events bypass the Tracker.
	ErrZeroSeq = errors.New("session: SeqNo 0 carries no sequence number")
	// ErrNotNext: Advance with a SeqNo other than HWM+1.
	ErrNotNext = errors.New("session: advance is not HWM+1")
	// ErrSessionClosed: an event for a closed session (its OpClose applied
	// or logged): Advance refuses it here, and the leader's log refuses to
	// log it (leader.LedgerLog), since followers would skip it.
	ErrSessionClosed = errors.New("session: session is closed")
	// ErrUnknownSession: MarkClosed on a session that is unknown or expired.
	ErrUnknownSession = errors.New("session: unknown session")
	// ErrTooOld: Advance of seq 1 for an unknown session whose timestamp is
	// older than WAL clock − horizon (Check says TooOld).
	ErrTooOld = errors.New("session: event older than the retention horizon")
	// ErrCorrupt: a stored record does not decode. It matches corruption.Err.
	ErrCorrupt = corruption.Mark(errors.New("session: corrupt record"))
	// ErrTxDone: the tx was already committed or aborted.
	ErrTxDone = errors.New("session: transaction already finished")
	// ErrNilBatch: Begin was given a nil batch.
	ErrNilBatch = errors.New("session: nil batch")
	// ErrNilDB: Open/New was given a nil *pebble.DB.
	ErrNilDB = errors.New("session: nil pebble.DB")
)

// Defaults of TrackerOptions.
const (
	DefaultCacheSize        = 1 << 20
	DefaultRetentionHorizon = 24 * time.Hour
	DefaultLogBatches       = 256
	DefaultLogSessions      = 1 << 17
)

// TrackerOptions configures a Tracker.
type TrackerOptions struct {
	// CacheSize bounds the in-memory HWM cache (sessions). Default 1<<20.
	// A miss costs one Pebble point read.
	CacheSize int
	// RetentionHorizon: a session whose last activity is older than
	// WAL clock − RetentionHorizon is expired (treated as unknown) and its row
	// is collected. It MUST exceed the longest delay, in WAL-clock time, with
	// which an already applied event can be redelivered; otherwise the event
	// of a collected session would be taken for a new session. Default 24h.
	RetentionHorizon time.Duration
	// LogBatches: Flush writes a batch's HWM changes as one delta of the HWM
	// log; a session whose latest entry is LogBatches deltas old is logged
	// again in the current delta (carried forward, at most twice without a
	// change) or else its row is rewritten (checkpointed) — a session that
	// changes again meanwhile costs neither. Reopening replays at most about
	// LogBatches deltas. Default 256; negative: no log, Flush writes one row
	// per changed session (and checkpoints whatever an earlier run logged).
	LogBatches int
	// LogSessions bounds the sessions whose latest change is only in the
	// log: they are pinned in memory beside the CacheSize clean ones, and
	// Flush checkpoints the oldest beyond the bound (nothing is carried
	// while over it). Default 1<<17.
	LogSessions int
}

// ErrBadOptions: OpenTracker was given invalid TrackerOptions (every
// problem is listed in the joined error).
var ErrBadOptions = errors.New("session: bad tracker options")

// EnsureDefaults fills zero fields with their defaults and returns o (a
// fresh value when o is nil). A negative LogBatches stays: it turns the log
// off; other negative values are left for Validate to refuse.
func (o *TrackerOptions) EnsureDefaults() *TrackerOptions {
	if o == nil {
		o = &TrackerOptions{}
	}
	if o.CacheSize == 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.RetentionHorizon == 0 {
		o.RetentionHorizon = DefaultRetentionHorizon
	}
	if o.LogBatches == 0 {
		o.LogBatches = DefaultLogBatches
	}
	if o.LogSessions == 0 {
		o.LogSessions = DefaultLogSessions
	}
	return o
}

// Validate reports every invalid field in one error wrapping ErrBadOptions.
func (o *TrackerOptions) Validate() error {
	var errs []error
	if o.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("CacheSize %d is negative", o.CacheSize))
	}
	if o.RetentionHorizon < 0 {
		errs = append(errs, fmt.Errorf("RetentionHorizon %v is negative", o.RetentionHorizon))
	}
	if o.LogSessions < 0 {
		errs = append(errs, fmt.Errorf("LogSessions %d is negative", o.LogSessions))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
}

// HWM is one session's state as a decision reads it (TrackerTx.Load): its
// high-water mark, last activity and closed flag, and whether the tracker
// holds a row for it at all. Decide, Advance and Close are the Tracker's
// rules over it as plain values, so a caller that loaded a batch's HWMs
// first (the store's receiver) decides the batch without the tracker.
type HWM struct {
	Seq    SeqNo
	LastTS int64
	Closed bool
	Known  bool // false: never seen, or collected
}

// Cutoff is WAL clock − horizon, saturating instead of wrapping: a session
// whose last activity is older is expired (treated as unknown).
func Cutoff(clock int64, horizon time.Duration) int64 {
	if clock < math.MinInt64+int64(horizon) {
		return math.MinInt64
	}
	return clock - int64(horizon)
}

// Live reports whether the session is known and not expired at cutoff.
// Expiry is decided on the WAL clock alone, whether or not GC already
// deleted the row, so every follower decides the same regardless of when it
// runs CollectGarbage.
func (h HWM) Live(cutoff int64) bool { return h.Known && h.LastTS >= cutoff }

// Decide is TrackerTx.Check over plain values: what to do with the event
// (seq, ts) of a session in state h, with the WAL clock's cutoff. seq must
// not be 0.
//
// A closed session answers Duplicate for seq <= HWM (it was applied) and
// Closed above; both mean "skip".
func Decide(h HWM, seq SeqNo, ts, cutoff int64) Decision {
	if !h.Live(cutoff) {
		switch {
		case ts < cutoff:
			return TooOld
		case seq == 1:
			return Apply
		default:
			return Gap
		}
	}
	switch {
	case seq <= h.Seq:
		return Duplicate
	case h.Closed:
		return Closed
	case seq == h.Seq+1 && seq <= MaxSeqNo:
		return Apply
	default:
		return Gap
	}
}

// Advance is TrackerTx.Advance over plain values: h after the event (seq,
// ts) Decide answered Apply for. An unknown or expired session starts over
// at seq 1.
func (h HWM) Advance(seq SeqNo, ts, cutoff int64) HWM {
	if !h.Live(cutoff) {
		return HWM{Seq: seq, LastTS: ts, Known: true}
	}
	h.Seq, h.LastTS = seq, max(h.LastTS, ts)
	return h
}

// Close is TrackerTx.MarkClosed over plain values (for a live session).
func (h HWM) Close(ts int64) HWM {
	h.Closed, h.LastTS = true, max(h.LastTS, ts)
	return h
}

// record is the persisted (and cached) state of one session.
type record struct {
	hwm    SeqNo
	lastTS int64 // max timestamp of any event advanced or closed in the session
	closed bool
}

// Tracker keeps the per-session high-water marks on a follower. See doc.go.
//
// Get and Clock are safe for concurrent use with one open TrackerTx. TrackerTxs
// themselves must be serialized: Begin the next one only after the previous one
// was committed or aborted, because a tx reads the committed view.
type Tracker struct {
	db    *pebble.DB
	opts  TrackerOptions
	cache *hwmCache
	clock atomic.Int64

	mu       sync.Mutex
	gcCursor []byte // next HWM key to examine; nil = start of the prefix

	// The committed delta log: deltas logFirst..logNext-1 may exist (only
	// the tx goroutine reads or changes these).
	logFirst, logNext uint64

	// spare holds the buffers of the last finished tx, cleared, so the next
	// tx does not regrow a map of batch size (txs are serialized; one spare is
	// enough).
	spare atomic.Pointer[txBuf]
}

// OpenTracker opens the Tracker on db, restoring the WAL clock and replaying
// the HWM log: the sessions whose latest change is only logged are pinned in
// the cache. Other HWMs are read lazily on first use.
func OpenTracker(db *pebble.DB, opts *TrackerOptions) (*Tracker, error) {
	if db == nil {
		return nil, ErrNilDB
	}
	var o TrackerOptions
	if opts != nil {
		o = *opts
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	t := &Tracker{db: db, opts: o, cache: newHWMCache(o.CacheSize)}
	val, closer, err := db.Get([]byte(ClockKey))
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		c, derr := decodeClock(val)
		closer.Close()
		if derr != nil {
			return nil, derr
		}
		t.clock.Store(c)
	}
	logged, first, next, err := replayLog(db)
	if err != nil {
		return nil, err
	}
	t.logFirst, t.logNext = first, next
	for _, l := range sortedLogged(logged, true) {
		if l.exists {
			t.cache.putDirty(&l.id, l.rec, l.seq, 0)
		}
	}
	return t, nil
}

// Options returns the effective options.
func (t *Tracker) Options() TrackerOptions { return t.opts }

// Clock returns the committed WAL clock: the largest event timestamp of any
// committed Advance or MarkClosed (0 for an empty store). Persisted at ClockKey.
func (t *Tracker) Clock() int64 { return t.clock.Load() }

// CachedLen returns the number of sessions in the in-memory cache.
func (t *Tracker) CachedLen() int { return t.cache.len() }

// Get returns the committed HWM of a session and whether it is closed. found is
// false when the session has no row (never seen or collected). Get does not
// apply expiry and does not fill the cache (a concurrent commit could otherwise
// be overwritten with the older value Get read).
func (t *Tracker) Get(id ID) (hwm SeqNo, closed bool, found bool, err error) {
	if r, ok := t.cache.get(&id); ok {
		return r.hwm, r.closed, true, nil
	}
	r, ok, err := t.read(id)
	if err != nil || !ok {
		return 0, false, false, err
	}
	return r.hwm, r.closed, true, nil
}

// Expired reports whether the session has a committed row whose last activity
// is older than the retention horizon as of WAL time at (the tracker's clock
// raised to at). Followers treat such a session as unknown, so its next SeqNo
// (> 1) would be a gap forever: a leader must not log another event for it
// (session/doc.go, invariant 6). The check is at least as strict as any
// follower's, whose clock for the event is at most max(Clock(), at).
func (t *Tracker) Expired(id ID, at int64) (bool, error) {
	r, ok := t.cache.get(&id)
	if !ok {
		var err error
		if r, ok, err = t.read(id); err != nil || !ok {
			return false, err
		}
	}
	return t.ExpiredSince(r.lastTS, at), nil
}

// ExpiredSince is Expired for a session whose last activity is at lastTS:
// a leader asks it about a session whose last batch is logged but not yet
// committed here, which the committed row does not show yet.
func (t *Tracker) ExpiredSince(lastTS, at int64) bool {
	return lastTS < t.cutoff(max(t.Clock(), at))
}

func (t *Tracker) read(id ID) (record, bool, error) {
	var kb [hwmKeyLen]byte
	val, closer, err := t.db.Get(hwmKey(&kb, id))
	if errors.Is(err, pebble.ErrNotFound) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, err
	}
	r, err := decodeRecord(val)
	closer.Close()
	if err != nil {
		return record{}, false, err
	}
	return r, true, nil
}

func (t *Tracker) cutoff(clock int64) int64 { return Cutoff(clock, t.opts.RetentionHorizon) }

// Begin starts the tracker side of one Pebble batch. Writes go into b; the
// in-memory view changes only at Commit.
func (t *Tracker) Begin(b *pebble.Batch) *TrackerTx {
	tx := &TrackerTx{t: t, b: b, clock: t.clock.Load(),
		logFirst: t.logFirst, logNext: t.logNext, logBegin: t.logNext, ckptAt: ckptNotStarted}
	if buf := t.spare.Swap(nil); buf != nil {
		tx.txBuf = *buf
	}
	return tx
}

// maxKeptIdx is the most sessions a tx's index may have held for release to
// clear and keep it for the next tx.
const maxKeptIdx = 1 << 13

// release hands the tx's buffers back for reuse; the tx cannot touch them
// again because every method checks done first.
func (tx *TrackerTx) release() {
	if tx.idx != nil || tx.found != nil {
		idx := tx.idx
		if len(idx) > maxKeptIdx {
			// Clearing a Go map costs the capacity it grew to; after one
			// huge batch every later tx would pay it. Let the next tx
			// grow a map of its own size.
			idx = nil
		} else {
			clear(idx)
		}
		buf := &txBuf{idx: idx, ents: tx.ents[:0], dirty: tx.dirty[:0], ckpt: tx.ckpt[:0], lbuf: tx.lbuf[:0], found: tx.found[:0]}
		tx.t.spare.Store(buf)
	}
	tx.txBuf = txBuf{}
}

// entry states inside a tx.
const (
	entClean   uint8 = iota // loaded from the committed view, unchanged
	entDirty                // changed, not yet written to the batch
	entWritten              // changed and written (Set or Delete) to the batch
)

type txEntry struct {
	id     ID
	rec    record
	exists bool // a row exists in the tx's view (false: never seen or collected in this tx)
	state  uint8

	// carries: how often rec was logged again unchanged (carried forward)
	// since it last changed; 0 once the tx changes it.
	carries uint8

	// What Commit publishes: the state last written to the batch.
	written    bool
	pubExists  bool   // false: the row was deleted (garbage collection)
	pubRow     bool   // written as the session's row; else logged in delta pubSeq
	pubSeq     uint64 //
	pubCarries uint8  //
	pub        record
}

// wrote records that e's current state went into the batch: as its row, or
// in delta seq.
func (e *txEntry) wrote(row bool, seq uint64) {
	e.state, e.written = entWritten, true
	e.pubExists, e.pubRow, e.pubSeq, e.pubCarries, e.pub = e.exists, row, seq, e.carries, e.rec
}

// TrackerTx is the Tracker's view of one Pebble batch. Not safe for concurrent
// use. Protocol:
//
//	tx := tracker.Begin(b)
//	for each event: d, err := tx.Check(...); if d == Apply { apply; tx.Advance(...) }
//	tx.Flush()            // writes the changed sessions (+ the clock) into b
//	err := b.Commit(...)  // the caller's commit
//	if err == nil { tx.Commit() } else { tx.Abort() }
//
// Flush is required before b commits: Advance and MarkClosed only record
// pending state, so that a session advanced many times in one batch is
// written once. Flush may be called more than once; each call writes what
// changed since the previous one. If Commit finds changes that were never
// flushed, it does not publish them: memory keeps the last state written to
// the batch (or the committed one), so it never claims more than the disk
// holds.
type TrackerTx struct {
	t *Tracker
	b *pebble.Batch
	txBuf

	clock        int64 // pending WAL clock: committed clock and this tx's events
	flushedClock int64 // clock value written to b (0: none)

	gcCursor []byte
	gcMoved  bool

	// The delta log as this tx leaves it: deltas logFirst..logNext-1 exist
	// once b commits; the tx's own deltas start at logBegin.
	logFirst, logNext, logBegin uint64
	ckptAt                      int32 // next committed dirty entry to consider checkpointing

	done bool
	kbuf [hwmKeyLen]byte
	vbuf [hwmValLen]byte
}

// txBuf is the tx's view of the sessions it touched: idx maps an ID to its
// entry in ents (a map of indexes plus a slice keeps each event to one map
// lookup; Advance, Flush and Commit then work by index), dirty lists the
// entries changed since the last Flush.
type txBuf struct {
	idx   map[ID]int32
	ents  []txEntry
	dirty []int32
	ckpt  []ID    // committed dirty sessions this tx checkpointed into rows
	lbuf  []byte  // delta value being built
	found []int32 // PeekAll's cache indexes
}

// ckptNotStarted: Flush has not walked the cache's dirty list yet.
const ckptNotStarted = -2

// Clock returns the tx's pending WAL clock (committed clock raised by the
// timestamps this tx advanced).
func (tx *TrackerTx) Clock() int64 { return tx.clock }

// lookup returns the session as this tx sees it: pending changes first, then
// the cache, then Pebble (filling the cache with the committed record, which is
// safe because txs are serialized). A lookup does not refresh recency (see
// hwmCache); Commit does, for the sessions it writes.
func (tx *TrackerTx) lookup(id ID) (int32, error) {
	if i, ok := tx.idx[id]; ok {
		return i, nil
	}
	e := txEntry{id: id}
	c := tx.t.cache
	if ci := c.find(&id); ci != nilIdx {
		e.rec, e.exists = c.at(ci), true
		c.prefetchLog(ci) // for the Commit of an advance (see prefetch)
	} else {
		r, ok, err := tx.t.read(id)
		if err != nil {
			return -1, err
		}
		if ok {
			c.mu.Lock()
			c.put(&id, r)
			c.mu.Unlock()
			e.rec, e.exists = r, true
		}
	}
	return tx.add(e), nil
}

func (tx *TrackerTx) add(e txEntry) int32 {
	if tx.idx == nil {
		tx.idx = make(map[ID]int32, 16)
	}
	i := int32(len(tx.ents))
	tx.ents = append(tx.ents, e)
	tx.idx[e.id] = i
	return i
}

// live reports whether the session is known and not expired (HWM.Live).
func (tx *TrackerTx) live(e *txEntry) bool {
	return e.exists && e.rec.lastTS >= tx.t.cutoff(tx.clock)
}

// hwm is e as a decision reads it.
func (e *txEntry) hwm() HWM { return e.rec.state(e.exists) }

// state is r as a decision reads it, known or not.
func (r record) state(known bool) HWM {
	return HWM{Seq: r.hwm, LastTS: r.lastTS, Closed: r.closed, Known: known}
}

func (tx *TrackerTx) usable(seq SeqNo) error {
	if tx.done {
		return ErrTxDone
	}
	if tx.b == nil {
		return ErrNilBatch
	}
	if seq == 0 {
		return ErrZeroSeq
	}
	return nil
}

func (tx *TrackerTx) check(id ID, seq SeqNo) (*txEntry, error) {
	if err := tx.usable(seq); err != nil {
		return nil, err
	}
	i, err := tx.lookup(id)
	if err != nil {
		return nil, err
	}
	return &tx.ents[i], nil
}

// view is lookup for Check: a session found only in the cache is not added
// to the tx, because most checked events are duplicates that never reach
// Advance, and indexing them was a fifth of the duplicate path's cost. It
// returns the HWM alone, not a copy of the whole txEntry (104 bytes).
func (tx *TrackerTx) view(id ID) (HWM, error) {
	if i, ok := tx.idx[id]; ok {
		return tx.ents[i].hwm(), nil
	}
	if r, ok := tx.t.cache.peek(&id); ok {
		return r.state(true), nil
	}
	i, err := tx.lookup(id) // a Pebble read: keep it for the Advance that likely follows
	if err != nil {
		return HWM{}, err
	}
	return tx.ents[i].hwm(), nil
}

// Prefetch warms the cache lines a later Check, Advance or MarkClosed of id
// in this tx will read. A follower checking a whole batch calls it for every
// session of the batch first: the cache misses of independent prefetches
// overlap, where the checks that follow would take them one after another.
// It is only a hint: it changes nothing and reads no Pebble.
func (tx *TrackerTx) Prefetch(id ID) {
	tx.t.cache.prefetch(&id)
}

// Check decides what to do with event (id, seq, ts), seeing this tx's pending
// advances (Decide over the session's state). An error means I/O failure or
// misuse (seq 0: ErrZeroSeq); the decision is then 0.
func (tx *TrackerTx) Check(id ID, seq SeqNo, ts int64) (Decision, error) {
	if err := tx.usable(seq); err != nil {
		return 0, err
	}
	h, err := tx.view(id)
	if err != nil {
		return 0, err
	}
	return Decide(h, seq, ts, tx.t.cutoff(tx.clock)), nil
}

// Peek returns the session's state as this tx sees it (pending changes,
// then the cache, then Pebble): the input of Decide, for a caller that
// loads a whole batch's sessions before deciding it. Like Check it changes
// no state and, for a session found in the cache, indexes nothing (most
// peeked events are duplicates that never reach Advance); a session read
// from Pebble is kept for the Advance that likely follows. An error is an
// I/O failure.
func (tx *TrackerTx) Peek(id ID) (HWM, error) {
	if tx.done {
		return HWM{}, ErrTxDone
	}
	return tx.view(id)
}

// PeekAll is Peek for a batch of sessions: hwms[j] becomes the state of
// ids[j] (hwms must be at least as long as ids). A receiver loads a whole
// batch's sessions before deciding it, and most of a redelivered batch's
// cost was the cache misses of those lookups: PeekAll overlaps them
// itself (lrutable's FindAll), so it needs no Prefetch first. Unlike
// Prefetch it does not pull in what a Commit of the session reads (its log
// state); Load does that, for the sessions a caller may advance. An error
// is an I/O failure; hwms is then partly filled.
func (tx *TrackerTx) PeekAll(ids []ID, hwms []HWM) error {
	if tx.done {
		return ErrTxDone
	}
	hwms = hwms[:len(ids)]
	found := slices.Grow(tx.found[:0], len(ids))[:len(ids)]
	tx.found = found
	c := tx.t.cache
	c.findAll(ids, found)
	removed := c.removed()
	for j := range ids {
		if len(tx.idx) != 0 { // the tx's own view comes first, as in view
			if k, ok := tx.idx[ids[j]]; ok {
				hwms[j] = tx.ents[k].hwm()
				continue
			}
		}
		// A cache index found above is stale once a Pebble read below
		// (view, for a session not found) evicted from the cache.
		if i := found[j]; i != nilIdx && c.removed() == removed {
			hwms[j] = c.at(i).state(true)
			continue
		}
		h, err := tx.view(ids[j])
		if err != nil {
			return err
		}
		hwms[j] = h
	}
	return nil
}

// Load is Peek for a session the caller may advance: it indexes the
// session in the tx (the map insert a later Advance would make) and
// returns its slot, a small number the same for every Load of the session
// in this tx and below the number of sessions the tx indexed, which the
// caller can key its per-session state of the batch by.
func (tx *TrackerTx) Load(id ID) (h HWM, slot int32, err error) {
	if tx.done {
		return HWM{}, -1, ErrTxDone
	}
	i, err := tx.lookup(id)
	if err != nil {
		return HWM{}, -1, err
	}
	return tx.ents[i].hwm(), i, nil
}

// put marks e (a pointer into tx.ents) changed.
func (tx *TrackerTx) put(e *txEntry, ts int64) {
	if e.state != entDirty {
		tx.dirty = append(tx.dirty, tx.idx[e.id])
	}
	e.state, e.carries = entDirty, 0
	if ts > tx.clock {
		tx.clock = ts
	}
}

// Advance records HWM = seq and last activity ts for the session. seq must be
// exactly HWM+1 (1 for an unknown or expired session) — the event Check called
// Apply; anything else is refused with a typed error and no change.
func (tx *TrackerTx) Advance(id ID, seq SeqNo, ts int64) error {
	e, err := tx.check(id, seq)
	if err != nil {
		return err
	}
	return tx.advance(e, seq, ts)
}

// AdvanceLoaded is Advance of a session Load numbered slot: it finds the
// session by the slot instead of in the tx's index (a map lookup per
// advanced event saved for a caller that loaded its batch first). A slot
// that is not id's is looked up as Advance does.
func (tx *TrackerTx) AdvanceLoaded(slot int32, id ID, seq SeqNo, ts int64) error {
	if slot < 0 || int(slot) >= len(tx.ents) || tx.ents[slot].id != id {
		return tx.Advance(id, seq, ts)
	}
	if err := tx.usable(seq); err != nil {
		return err
	}
	return tx.advance(&tx.ents[slot], seq, ts)
}

// advance is Advance of e, a pointer into tx.ents.
func (tx *TrackerTx) advance(e *txEntry, seq SeqNo, ts int64) error {
	if !tx.live(e) {
		if ts < tx.t.cutoff(tx.clock) {
			return ErrTooOld
		}
		if seq != 1 {
			return ErrNotNext
		}
		e.rec = record{hwm: 1, lastTS: ts}
		e.exists = true
		tx.put(e, ts)
		return nil
	}
	if e.rec.closed {
		return ErrSessionClosed
	}
	if seq != e.rec.hwm+1 || seq > MaxSeqNo {
		return ErrNotNext
	}
	e.rec.hwm = seq
	e.rec.lastTS = max(e.rec.lastTS, ts)
	tx.put(e, ts)
	return nil
}

// MarkClosed records that the session is closed (call it after the Advance of
// its close event). Closing an already closed session is a no-op apart from
// the activity timestamp. A closed session keeps its row until it expires like
// any other: its applied events can still be redelivered until then.
func (tx *TrackerTx) MarkClosed(id ID, ts int64) error {
	if tx.done {
		return ErrTxDone
	}
	if tx.b == nil {
		return ErrNilBatch
	}
	i, err := tx.lookup(id)
	if err != nil {
		return err
	}
	e := &tx.ents[i]
	if !tx.live(e) {
		return ErrUnknownSession
	}
	e.rec.closed = true
	e.rec.lastTS = max(e.rec.lastTS, ts)
	tx.put(e, ts)
	return nil
}

// Flush writes every session changed since the last Flush and the WAL clock,
// if it moved, into the batch, and checkpoints the sessions whose logged
// change has grown old. Call it before committing the batch. On error the
// batch is unusable: Abort the tx.
//
// With the log on (LogBatches > 0), the changed sessions go into one delta
// (doc.go, "Amortised HWM persistence"); without it, one row each. Either
// way the oldest logged sessions are then rewritten as rows (checkpointed)
// while their change is LogBatches deltas old or more than LogSessions are
// logged, and the deltas nothing needs any more are deleted — all in b.
func (tx *TrackerTx) Flush() error {
	if tx.done {
		return ErrTxDone
	}
	if tx.b == nil {
		return ErrNilBatch
	}
	logging := tx.t.opts.LogBatches > 0
	v := appendLogHeader(tx.lbuf, tx.clock)
	if len(tx.dirty) > 0 {
		seq := tx.logNext
		for _, i := range tx.dirty {
			e := &tx.ents[i]
			if !logging {
				if err := tx.b.Set(hwmKey(&tx.kbuf, e.id), encodeRecord(&tx.vbuf, e.rec), nil); err != nil {
					return err
				}
				e.wrote(true, 0)
				continue
			}
			var err error
			if v, err = appendLogEntry(v, &e.id, e.rec, e.exists); err != nil {
				return err
			}
			e.wrote(false, seq)
		}
	}
	tx.dirty = tx.dirty[:0]
	// The delta is written after checkpoint, which may carry old logged
	// sessions forward into it.
	v, err := tx.checkpoint(v)
	tx.lbuf = v
	if err != nil {
		return err
	}
	if len(v) > logHeaderLen {
		if err := tx.writeDelta(v); err != nil {
			return err
		}
	}
	if tx.clock > tx.t.clock.Load() && tx.clock != tx.flushedClock {
		var cb [clockValLen]byte
		if err := tx.b.Set([]byte(ClockKey), encodeClock(&cb, tx.clock), nil); err != nil {
			return err
		}
		tx.flushedClock = tx.clock
	}
	return nil
}

// writeDelta sets v as the next delta of the log.
func (tx *TrackerTx) writeDelta(v []byte) error {
	var kb [logKeyLen]byte
	if err := tx.b.Set(logKey(&kb, tx.logNext), v, nil); err != nil {
		return err
	}
	tx.logNext++
	return nil
}

// maxCarries is how often an unchanged logged session is carried forward
// (logged again in a newer delta) before checkpoint writes its row instead.
const maxCarries = 2

// checkpoint retires the committed logged sessions whose change is
// LogBatches deltas old (all of them with the log off), oldest first, and
// more while over LogSessions, then deletes the deltas older than every
// change still needed. A session this tx wrote is skipped: the tx's own
// write supersedes its logged change.
//
// v is the delta this Flush is about to write (its version byte and this
// tx's changes; empty when it writes none). An old session is carried
// forward — its committed record appended to v, superseding its old entry —
// while it was carried fewer than maxCarries times and the log is within
// LogSessions: a few bytes in a value the batch writes anyway, where a row
// is a Pebble key of its own (insert, flush, compactions). Otherwise, or
// when this Flush writes no delta, its row is rewritten.
func (tx *TrackerTx) checkpoint(v []byte) ([]byte, error) {
	c, o := tx.t.cache, tx.t.opts
	if tx.ckptAt == ckptNotStarted {
		tx.ckptAt = c.oldestDirty()
	}
	delta := len(v) > logHeaderLen // this Flush writes delta tx.logNext
	newest := tx.logNext - 1
	if delta {
		newest = tx.logNext
	}
	for i := tx.ckptAt; i != nilIdx; i = tx.ckptAt {
		old := o.LogBatches <= 0 || c.logSeq[i]+uint64(o.LogBatches) <= newest
		over := c.dirtyLen()-len(tx.ckpt) > o.LogSessions
		if !old && !over {
			break
		}
		tx.ckptAt = c.nextDirty(i)
		id := c.idAt(i)
		if tx.superseded(&id) {
			continue
		}
		if delta && !over && c.carried(i) < maxCarries {
			j, seen := tx.idx[id]
			if !seen {
				r, _ := c.peek(&id)
				j = tx.add(txEntry{id: id, rec: r, exists: true})
			}
			// Not superseded, so the tx holds id's committed record.
			e := &tx.ents[j]
			e.carries = c.carried(i) + 1
			var err error
			if v, err = appendLogEntry(v, &id, e.rec, true); err != nil {
				return v, err
			}
			e.wrote(false, tx.logNext)
			continue
		}
		r, _ := c.peek(&id)
		if err := tx.b.Set(hwmKey(&tx.kbuf, id), encodeRecord(&tx.vbuf, r), nil); err != nil {
			return v, err
		}
		tx.ckpt = append(tx.ckpt, id)
	}
	// Every delta before the oldest change still needed can go: the
	// remaining logged sessions' (the list is in delta order), else this
	// tx's own first delta.
	keep := tx.logBegin
	for i := tx.ckptAt; i != nilIdx; i = c.nextDirty(i) {
		if id := c.idAt(i); !tx.superseded(&id) {
			keep = c.logSeq[i]
			break
		}
	}
	var kb [logKeyLen]byte
	for ; tx.logFirst < keep; tx.logFirst++ {
		if err := tx.b.Delete(logKey(&kb, tx.logFirst), nil); err != nil {
			return v, err
		}
	}
	return v, nil
}

// superseded reports whether this tx wrote a state of the session to the
// batch, which replaces any committed logged one.
func (tx *TrackerTx) superseded(id *ID) bool {
	i, ok := tx.idx[*id]
	return ok && tx.ents[i].written
}

// Commit tells the tracker the batch committed: written changes become the
// in-memory view and the WAL clock moves. Calling it twice, or after Abort, is a
// no-op.
func (tx *TrackerTx) Commit() {
	if tx.done {
		return
	}
	tx.done = true
	t := tx.t
	c := t.cache
	// The tx's deltas are published in delta order, so the cache's list of
	// logged sessions stays ordered by delta (checkpoint relies on it).
	// Within a delta, sessions carried forward (unchanged, so older) go
	// before the tx's own changes: the list then stays about ordered by
	// last activity too, which CollectGarbage's walk of it relies on.
	pub := tx.dirty[:0] // Flush emptied it; reuse as scratch
	for i := range tx.ents {
		if e := &tx.ents[i]; e.written && e.pubCarries > 0 && !e.pubRow {
			pub = append(pub, int32(i))
		}
	}
	for i := range tx.ents {
		if e := &tx.ents[i]; e.written && (e.pubCarries == 0 || e.pubRow) {
			pub = append(pub, int32(i))
		}
	}
	if tx.logNext-tx.logBegin > 1 {
		slices.SortStableFunc(pub, func(a, b int32) int { return cmp.Compare(tx.ents[a].pubSeq, tx.ents[b].pubSeq) })
	}
	c.mu.Lock()
	for i := range tx.ckpt {
		c.markClean(&tx.ckpt[i])
	}
	for _, i := range pub {
		e := &tx.ents[i]
		switch {
		case !e.pubExists:
			c.remove(&e.id) // collected
		case e.pubRow:
			c.put(&e.id, e.pub)
		default:
			c.putDirty(&e.id, e.pub, e.pubSeq, e.pubCarries)
		}
	}
	c.mu.Unlock()
	t.logFirst, t.logNext = tx.logFirst, tx.logNext
	tx.dirty = pub[:0]
	if tx.flushedClock > t.clock.Load() {
		t.clock.Store(tx.flushedClock)
	}
	if tx.gcMoved {
		t.mu.Lock()
		t.gcCursor = tx.gcCursor
		t.mu.Unlock()
	}
	tx.release()
}

// Abort tells the tracker the batch failed (or will never be committed): the
// pending changes are forgotten. Calling it twice, or after Commit, is a no-op.
func (tx *TrackerTx) Abort() {
	if tx.done {
		return
	}
	tx.done = true
	tx.release()
}

// CollectGarbage deletes, in this tx's batch, the rows of expired sessions:
// those whose last activity is older than the tx's WAL clock − horizon, closed
// or not. It examines at most limit rows (limit <= 0: all), resuming where the
// previous committed collection stopped and wrapping at the end, and returns
// how many it deleted. The deletions reach the cache at Commit.
//
// Collection never changes a decision: expired sessions already count as
// unknown to Check (see live), so GC only reclaims space. It runs inside a tx
// because a separate batch could delete a row that a concurrent tx advances.
func (tx *TrackerTx) CollectGarbage(limit int) (int, error) {
	if tx.done {
		return 0, ErrTxDone
	}
	if tx.b == nil {
		return 0, ErrNilBatch
	}
	start := tx.gcCursor
	if !tx.gcMoved {
		tx.t.mu.Lock()
		start = tx.t.gcCursor
		tx.t.mu.Unlock()
	}
	lower := []byte(HWMPrefix)
	it, err := tx.t.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(lower)})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	valid := it.First()
	if start != nil {
		valid = it.SeekGE(start)
	}
	g := gcPass{cutoff: tx.t.cutoff(tx.clock), limit: limit}
	n := 0
	var next []byte
	var collected []int32
	for ; valid; valid = it.Next() {
		if g.rowsDone() {
			next = append([]byte(nil), it.Key()...)
			break
		}
		key := it.Key()
		if len(key) != hwmKeyLen {
			continue // ClockKey
		}
		var id ID
		copy(id[:], key[len(HWMPrefix):])
		// The tx's own view wins over the committed row it may have
		// changed, and a logged change in the cache over its older row.
		var e txEntry
		i, seen := tx.idx[id]
		if seen && (tx.ents[i].state != entClean || tx.ents[i].written) {
			e = tx.ents[i]
		} else if r, ok := tx.t.cache.peek(&id); ok {
			e = txEntry{id: id, rec: r, exists: true}
		} else {
			val, err := it.ValueAndErr()
			if err != nil {
				return n, err
			}
			r, err := decodeRecord(val)
			if err != nil {
				return n, fmt.Errorf("%w: key %x", err, key)
			}
			e = txEntry{id: id, rec: r, exists: true}
		}
		if !g.row(e.hwm()) {
			continue
		}
		if err := tx.b.Delete(key, nil); err != nil {
			return n, err
		}
		if e.state == entDirty {
			tx.removeDirty(i)
		}
		if !seen {
			i = tx.add(txEntry{id: id})
		}
		tx.ents[i] = txEntry{id: id}
		tx.ents[i].wrote(true, 0)
		collected = append(collected, i)
		n++
	}
	if err := it.Error(); err != nil {
		return n, err
	}
	// A logged session's row is stale or absent, so the scan above may miss
	// it: walk the logged sessions too, oldest change first, while they are
	// expired (later changes mostly carry later timestamps).
	c := tx.t.cache
	for i := c.oldestDirty(); i != nilIdx; i = c.nextDirty(i) {
		id := c.idAt(i)
		r, _ := c.peek(&id)
		j, seen := tx.idx[id]
		own := seen && (tx.ents[j].state != entClean || tx.ents[j].written) // the tx's own view wins, as above
		var ownHWM HWM
		if own {
			ownHWM = tx.ents[j].hwm()
		}
		collect, more := g.logged(HWM{Seq: r.hwm, LastTS: r.lastTS, Closed: r.closed, Known: true}, ownHWM, own)
		if !more {
			break
		}
		if !collect {
			continue
		}
		if own && tx.ents[j].state == entDirty {
			tx.removeDirty(j)
		}
		var kb [hwmKeyLen]byte
		if err := tx.b.Delete(hwmKey(&kb, id), nil); err != nil { // its stale row, if any
			return n, err
		}
		if !seen {
			j = tx.add(txEntry{id: id})
		}
		tx.ents[j] = txEntry{id: id}
		tx.ents[j].wrote(true, 0)
		collected = append(collected, j)
		n++
	}
	// An older delta may still hold a collected session's last change:
	// a tombstone delta keeps the replay at open from bringing it back.
	if len(collected) > 0 && (tx.t.opts.LogBatches > 0 || tx.logFirst < tx.logNext) {
		v := appendLogHeader(tx.lbuf, tx.clock)
		for _, i := range collected {
			e := &tx.ents[i]
			v, _ = appendLogEntry(v, &e.id, record{}, false) // a tombstone never fails
			e.wrote(false, tx.logNext)
		}
		tx.lbuf = v
		if err := tx.writeDelta(v); err != nil {
			return n, err
		}
	}
	tx.gcCursor = next
	tx.gcMoved = true
	return n, nil
}

// gcPass is one collection's decisions (CollectGarbage) as a function of
// the sessions it looks at, in the order it looks at them: the HWM rows
// from the cursor on (row), then the logged sessions, oldest change first
// (logged). It reads and writes nothing. A session is collected when it is
// expired on the WAL clock — known and last active before cutoff, closed
// or not — as the tx sees it.
type gcPass struct {
	cutoff int64 // WAL clock − horizon
	limit  int   // rows examined, and logged sessions walked, at most (<= 0: all)
	rows   int   // rows examined so far
	walked int   // logged sessions walked so far
}

// rowsDone reports whether the pass examined limit rows: the next row is
// left for the next pass, which resumes there.
func (g *gcPass) rowsDone() bool { return g.limit > 0 && g.rows >= g.limit }

// row examines a session with an HWM row, in the state the tx sees (its own
// change, else a logged one, else the row), and reports whether to collect
// it.
func (g *gcPass) row(h HWM) bool {
	g.rows++
	return h.Known && !h.Live(g.cutoff)
}

// logged walks to the next logged session: committed is its logged state;
// own, when hasOwn, this tx's view of it, which wins. The walk stops (more
// false) at the first one whose logged state is not expired — later
// changes mostly carry later timestamps — or after limit sessions.
func (g *gcPass) logged(committed, own HWM, hasOwn bool) (collect, more bool) {
	if g.limit > 0 && g.walked >= g.limit || committed.Live(g.cutoff) {
		return false, false
	}
	g.walked++
	if hasOwn {
		return own.Known && !own.Live(g.cutoff), true
	}
	return true, true
}

func (tx *TrackerTx) removeDirty(i int32) {
	for j, d := range tx.dirty {
		if d == i {
			tx.dirty = append(tx.dirty[:j], tx.dirty[j+1:]...)
			return
		}
	}
}

func hwmKey(buf *[hwmKeyLen]byte, id ID) []byte {
	copy(buf[:], HWMPrefix)
	copy(buf[len(HWMPrefix):], id[:])
	return buf[:]
}

func encodeRecord(buf *[hwmValLen]byte, r record) []byte {
	buf[0] = formatVersion
	binary.LittleEndian.PutUint64(buf[1:], uint64(r.hwm))
	binary.LittleEndian.PutUint64(buf[9:], uint64(r.lastTS))
	buf[17] = 0
	if r.closed {
		buf[17] = flagClosed
	}
	return buf[:]
}

func decodeRecord(v []byte) (record, error) {
	if len(v) != hwmValLen || v[0] != formatVersion || v[17]&^flagClosed != 0 || SeqNo(binary.LittleEndian.Uint64(v[1:])) > MaxSeqNo {
		return record{}, ErrCorrupt
	}
	return record{
		hwm:    SeqNo(binary.LittleEndian.Uint64(v[1:])),
		lastTS: int64(binary.LittleEndian.Uint64(v[9:])),
		closed: v[17]&flagClosed != 0,
	}, nil
}

func encodeClock(buf *[clockValLen]byte, c int64) []byte {
	buf[0] = formatVersion
	binary.LittleEndian.PutUint64(buf[1:], uint64(c))
	return buf[:]
}

func decodeClock(v []byte) (int64, error) {
	if len(v) != clockValLen || v[0] != formatVersion {
		return 0, ErrCorrupt
	}
	return int64(binary.LittleEndian.Uint64(v[1:])), nil
}

// prefixEnd returns the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

package idempotency

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/internal/keyspace"
)

// Pebble keys of the ledger table. Every value starts with the format
// version byte 1, except an entry that records an action (version 2).
//
//	l/r/<scope len u8><scope><key>            entry: state, token, time, expires, fingerprint, [action,] outcome
//	l/x/<expires u64 BE, sign-flipped><scope len u8><scope><key>   expiry index (value: version byte)
//	l/clock                                   ledger WAL clock: max event time applied (i64 LE)
//	l/sweep                                   WAL-clock time of the last sweep (i64 LE)
//	l/probe                                   written by Ledger.Probe
const (
	LedgerPrefix      = keyspace.Ledger
	ledgerRowPrefix   = keyspace.LedgerRow
	ledgerIndexPrefix = keyspace.LedgerIndex
)

var (
	ledgerClockKey = []byte(keyspace.LedgerClock)
	ledgerSweepKey = []byte(keyspace.LedgerSweep)
	ledgerProbeKey = []byte(keyspace.LedgerProbe)
)

const (
	ledgerValueVersion = 1
	entryVersionAction = 2 // an entry with an action: uvarint len + action before the outcome
)

// EntryState is the state of a live ledger entry.
type EntryState uint8

// Entry states.
const (
	StateInFlight  EntryState = 1 // claimed, not settled; Expires is the lease end
	StateCompleted EntryState = 2 // succeeded; Outcome replays until Expires
	StateFailed    EntryState = 3 // failed reproducibly; Outcome replays until Expires
	// StateReleased is a tombstone: the claim was released and the key is
	// free. It keeps the released token until the claim's lease end, so a
	// redelivered claim record cannot bring the entry back to life.
	StateReleased EntryState = 4
)

// String returns in-flight|completed|failed or "state(N)".
func (s EntryState) String() string {
	switch s {
	case StateInFlight:
		return "in-flight"
	case StateCompleted:
		return "completed"
	case StateFailed:
		return "failed"
	case StateReleased:
		return "released"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Entry is one row of the ledger table.
type Entry struct {
	State       EntryState
	Token       Token
	Time        int64 // WAL time of the record that produced this state
	Expires     int64 // WAL time at which the entry stops counting (lease end or end of replay)
	Fingerprint Fingerprint
	Outcome     []byte
	// Action is what the request that claimed the key does, as its caller
	// described it (ClaimOptions.Action); it stays with the entry through
	// extensions and the outcome, so a conflict can name it.
	Action string
}

// Live reports whether e counts at WAL time now: it is not a release
// tombstone and has not expired. An entry that is not live is treated as
// absent everywhere, whether or not a sweep has deleted it yet, so answers
// never depend on when a node swept.
func (e *Entry) Live(now int64) bool { return e.State != StateReleased && now < e.Expires }

const entryFixed = 1 + 1 + 16 + 8 + 8 + 32

// encodeEntry writes version 1 (no action) or 2 (uvarint len + action after
// the fixed part), so entries without an action keep the original layout.
func encodeEntry(dst []byte, e *Entry) []byte {
	version := byte(ledgerValueVersion)
	if e.Action != "" {
		version = entryVersionAction
	}
	dst = append(dst, version, byte(e.State))
	dst = append(dst, e.Token[:]...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.Time))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.Expires))
	dst = append(dst, e.Fingerprint[:]...)
	if e.Action != "" {
		dst = binary.AppendUvarint(dst, uint64(len(e.Action)))
		dst = append(dst, e.Action...)
	}
	return append(dst, e.Outcome...)
}

func decodeEntry(v []byte) (Entry, error) {
	bad := func() (Entry, error) {
		return Entry{}, corruption.Errorf("%w: ledger entry %x", ErrBadRecord, v[:min(len(v), 8)])
	}
	if len(v) < entryFixed || (v[0] != ledgerValueVersion && v[0] != entryVersionAction) ||
		v[1] < byte(StateInFlight) || v[1] > byte(StateReleased) {
		return bad()
	}
	e := Entry{State: EntryState(v[1])}
	copy(e.Token[:], v[2:])
	e.Time = int64(binary.LittleEndian.Uint64(v[18:]))
	e.Expires = int64(binary.LittleEndian.Uint64(v[26:]))
	copy(e.Fingerprint[:], v[34:])
	rest := v[entryFixed:]
	if v[0] == entryVersionAction {
		n, w := binary.Uvarint(rest)
		if w <= 0 || n == 0 || n > MaxActionLen || n > uint64(len(rest)-w) {
			return bad()
		}
		e.Action = string(rest[w : w+int(n)])
		rest = rest[w+int(n):]
	}
	if len(rest) > 0 {
		e.Outcome = bytes.Clone(rest)
	}
	return e, nil
}

// entrySuffix is <scope len u8><scope><key>, shared by row and index keys.
func appendEntrySuffix(dst []byte, scope, key string) []byte {
	dst = append(dst, byte(len(scope)))
	dst = append(dst, scope...)
	return append(dst, key...)
}

func rowKey(scope, key string) []byte {
	return appendEntrySuffix(append(make([]byte, 0, len(ledgerRowPrefix)+1+len(scope)+len(key)), ledgerRowPrefix...), scope, key)
}

func indexKey(expires int64, suffix []byte) []byte {
	k := make([]byte, 0, len(ledgerIndexPrefix)+8+len(suffix))
	k = append(k, ledgerIndexPrefix...)
	k = binary.BigEndian.AppendUint64(k, uint64(expires)^(1<<63)) // signed order
	return append(k, suffix...)
}

// ParseRowKey splits a ledger row key into scope and request key.
func ParseRowKey(k []byte) (scope, key string, err error) {
	rest, ok := bytes.CutPrefix(k, []byte(ledgerRowPrefix))
	if !ok || len(rest) < 1 || int(rest[0]) > len(rest)-1 {
		return "", "", corruption.Errorf("%w: row key %q", ErrBadRecord, k)
	}
	n := int(rest[0])
	return string(rest[1 : 1+n]), string(rest[1+n:]), nil
}

// TableOptions configures a LedgerTable.
type TableOptions struct {
	// SweepInterval is the least WAL-clock time between two sweeps of
	// expired entries; a sweep runs inside the first transaction that
	// finishes after it is due. Default 1 minute; negative disables sweeping
	// (expired entries still count as absent).
	SweepInterval time.Duration
	// SweepLimit bounds the entries one sweep deletes. Default 1024;
	// negative is invalid.
	SweepLimit int
}

// EnsureDefaults fills unset (zero) fields with their defaults and returns o.
func (o *TableOptions) EnsureDefaults() *TableOptions {
	if o.SweepInterval == 0 {
		o.SweepInterval = time.Minute
	}
	if o.SweepLimit == 0 {
		o.SweepLimit = 1024
	}
	return o
}

// Validate reports every invalid field in one error wrapping
// ErrBadOptions.
func (o *TableOptions) Validate() error {
	var errs []error
	if o.SweepLimit < 0 {
		errs = append(errs, fmt.Errorf("SweepLimit %d is negative", o.SweepLimit))
	}
	return invalidOptions("table", errs)
}

// LedgerTable is the durable ledger: entries keyed by (scope, request key)
// in Pebble under LedgerPrefix. It is changed only by applying Records in a
// LedgerTx, on the leader (through the Ledger's log) and on every follower
// (through the replication applier) alike, so all nodes fed the same log hold
// the same live entries.
//
// The table keeps no state in memory: everything it decides is read from
// Pebble, so a transaction whose batch never commits leaves no trace.
type LedgerTable struct {
	db   *pebble.DB
	opts TableOptions

	sweeps, swept, applied, stale atomic.Uint64
	// sweepHint is the WAL time of the last sweep staged by this process.
	// It only lets Finish skip reading l/sweep while no sweep can be due; a
	// hint from a batch that never committed merely delays the next sweep.
	sweepHint atomic.Int64
}

// OpenLedgerTable returns the ledger table stored in db.
func OpenLedgerTable(db *pebble.DB, opts *TableOptions) (*LedgerTable, error) {
	if db == nil {
		return nil, errors.New("idempotency: OpenLedgerTable needs a db")
	}
	t := &LedgerTable{db: db}
	if opts != nil {
		t.opts = *opts
	}
	if err := t.opts.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	if _, err := t.Clock(); err != nil {
		return nil, err
	}
	return t, nil
}

// Options returns the effective options.
func (t *LedgerTable) Options() TableOptions { return t.opts }

// TableStats counts what the table's transactions did. Sweeps and Swept count
// sweeps staged into a batch (a batch that then fails to commit still counts).
type TableStats struct {
	Applied uint64 // records applied
	Stale   uint64 // records ignored because the entry holds a newer decision
	Sweeps  uint64 // sweeps run
	Swept   uint64 // expired entries deleted
}

// Stats returns the counters.
func (t *LedgerTable) Stats() TableStats {
	return TableStats{Applied: t.applied.Load(), Stale: t.stale.Load(), Sweeps: t.sweeps.Load(), Swept: t.swept.Load()}
}

// Get reads the entry of (scope, key) as committed, expired or not.
func (t *LedgerTable) Get(scope, key string) (Entry, bool, error) {
	return getEntry(t.db, rowKey(scope, key))
}

func getEntry(r pebble.Reader, k []byte) (Entry, bool, error) {
	v, closer, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("idempotency: reading ledger: %w", err)
	}
	defer closer.Close()
	e, err := decodeEntry(v)
	return e, err == nil, err
}

func readI64(r pebble.Reader, k []byte) (int64, error) {
	v, closer, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("idempotency: reading %s: %w", k, err)
	}
	defer closer.Close()
	if len(v) != 9 || v[0] != ledgerValueVersion {
		return 0, corruption.Errorf("%w: %s value %x", ErrBadRecord, k, v)
	}
	return int64(binary.LittleEndian.Uint64(v[1:])), nil
}

func i64Value(x int64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{ledgerValueVersion}, uint64(x))
}

// Clock returns the ledger's WAL clock: the largest event time applied.
func (t *LedgerTable) Clock() (int64, error) { return readI64(t.db, ledgerClockKey) }

// Scan calls fn for every entry row, expired or not, in key order.
func (t *LedgerTable) Scan(fn func(scope, key string, e Entry) error) error {
	it, err := t.db.NewIter(&pebble.IterOptions{LowerBound: []byte(ledgerRowPrefix), UpperBound: keyspace.UpperBound(ledgerRowPrefix)})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		scope, key, err := ParseRowKey(it.Key())
		if err != nil {
			return err
		}
		e, err := decodeEntry(it.Value())
		if err != nil {
			return err
		}
		if err := fn(scope, key, e); err != nil {
			return err
		}
	}
	return it.Error()
}

// LedgerTx applies records into one Pebble batch. Transactions of one table
// must be serialized, commits included (the receiver and the Ledger's default
// log both do), because each reads what earlier ones committed. A LedgerTx
// reads its own pending writes.
type LedgerTx struct {
	t       *LedgerTable
	b       *pebble.Batch
	pending map[string]*Entry // row key → pending entry; nil = deleted
	clock   int64
	loaded  bool
	dirty   bool
	buf     []byte
}

// Begin starts a transaction writing into b. The caller commits b after
// Finish; nothing is published anywhere else, so an uncommitted batch leaves
// no trace.
func (t *LedgerTable) Begin(b *pebble.Batch) *LedgerTx {
	return &LedgerTx{t: t, b: b}
}

func (tx *LedgerTx) load() error {
	if tx.loaded {
		return nil
	}
	c, err := readI64(tx.t.db, ledgerClockKey)
	if err != nil {
		return err
	}
	tx.clock, tx.loaded = c, true
	return nil
}

// Observe advances the transaction's WAL clock to ts (a timestamp of any
// event in the batch).
func (tx *LedgerTx) Observe(ts int64) error {
	if err := tx.load(); err != nil {
		return err
	}
	if ts > tx.clock {
		tx.clock, tx.dirty = ts, true
	}
	return nil
}

func (tx *LedgerTx) get(rk []byte) (*Entry, error) {
	if e, ok := tx.pending[string(rk)]; ok {
		return e, nil
	}
	e, found, err := getEntry(tx.t.db, rk)
	if err != nil || !found {
		return nil, err
	}
	return &e, nil
}

func (tx *LedgerTx) put(rk []byte, old, e *Entry) error {
	suffix := rk[len(ledgerRowPrefix):]
	if old != nil {
		if err := tx.b.Delete(indexKey(old.Expires, suffix), nil); err != nil {
			return err
		}
	}
	if tx.pending == nil {
		tx.pending = make(map[string]*Entry)
	}
	tx.pending[string(rk)] = e
	if e == nil {
		return tx.b.Delete(rk, nil)
	}
	tx.buf = encodeEntry(tx.buf[:0], e)
	if err := tx.b.Set(rk, tx.buf, nil); err != nil {
		return err
	}
	return tx.b.Set(indexKey(e.Expires, suffix), []byte{ledgerValueVersion}, nil)
}

// Apply applies one record to its entry. The rules make applying a log
// deterministic and re-applying a record harmless:
//
//   - a record older (by Time) than the entry's current state is ignored: a
//     leader decides each key's records in order with a strictly increasing
//     clock, so an older record can only be a stale redelivery;
//   - claim: the entry becomes in-flight with the record's token and lease,
//     unless it already holds that token (the claim was applied before);
//   - complete / fail: the entry becomes completed / failed with the outcome;
//   - release: if the entry holds the record's token it becomes a release
//     tombstone (absent for every decision) until the claim's lease end, when
//     a sweep deletes it;
//   - extend: if the entry is in flight under the record's token, its lease
//     now ends at the record's Expires; otherwise the record is ignored (the
//     claim was settled or taken over, so there is no lease to renew).
//
// Complete, fail and extend keep the action the claim recorded.
//
// Whether a record was a valid decision (the key free, the claim still
// owned) is the leader Ledger's job; the table applies what the log says.
func (tx *LedgerTx) Apply(rec *Record) error {
	if err := rec.Validate(); err != nil {
		return err
	}
	if err := tx.Observe(rec.Time); err != nil {
		return err
	}
	rk := rowKey(rec.Scope, rec.Key)
	old, err := tx.get(rk)
	if err != nil {
		return err
	}
	if old != nil && (old.Time > rec.Time || (rec.Kind == RecordClaim && old.Token == rec.Token)) {
		tx.t.stale.Add(1)
		return nil
	}
	owned := old != nil && old.Token == rec.Token
	if rec.Kind == RecordExtend && (!owned || old.State != StateInFlight) {
		tx.t.stale.Add(1)
		return nil
	}
	tx.t.applied.Add(1)
	var action string
	if owned {
		action = old.Action
	}
	switch rec.Kind {
	case RecordRelease:
		if !owned {
			return nil
		}
		return tx.put(rk, old, &Entry{State: StateReleased, Token: rec.Token, Time: rec.Time, Expires: old.Expires,
			Fingerprint: old.Fingerprint})
	case RecordClaim:
		return tx.put(rk, old, &Entry{State: StateInFlight, Token: rec.Token, Time: rec.Time, Expires: rec.Expires,
			Fingerprint: rec.Fingerprint, Action: rec.Action})
	case RecordExtend:
		e := *old
		e.Time, e.Expires = rec.Time, rec.Expires
		return tx.put(rk, old, &e)
	default:
		st := StateCompleted
		if rec.Kind == RecordFail {
			st = StateFailed
		}
		return tx.put(rk, old, &Entry{State: st, Token: rec.Token, Time: rec.Time, Expires: rec.Expires,
			Fingerprint: rec.Fingerprint, Outcome: bytes.Clone(rec.Outcome), Action: action})
	}
}

// Finish writes the clock into the batch and, when a sweep is due (its
// interval has passed on the WAL clock since the last one), deletes up to
// SweepLimit expired entries in the same batch. Call it once, after the
// last Apply/Observe and before committing.
func (tx *LedgerTx) Finish() error {
	if err := tx.load(); err != nil {
		return err
	}
	if iv := int64(tx.t.opts.SweepInterval); iv > 0 && tx.clock-tx.t.sweepHint.Load() >= iv {
		last, err := readI64(tx.t.db, ledgerSweepKey)
		if err != nil {
			return err
		}
		tx.t.sweepHint.Store(last)
		if tx.clock-last >= iv {
			tx.t.sweepHint.Store(tx.clock)
			if err := tx.sweep(); err != nil {
				return err
			}
			if err := tx.b.Set(ledgerSweepKey, i64Value(tx.clock), nil); err != nil {
				return err
			}
		}
	}
	if tx.dirty {
		tx.dirty = false
		return tx.b.Set(ledgerClockKey, i64Value(tx.clock), nil)
	}
	return nil
}

// sweep deletes entries whose expiry is at or before the clock, oldest
// first, through the expiry index.
func (tx *LedgerTx) sweep() error {
	tx.t.sweeps.Add(1)
	upper := keyspace.UpperBound(ledgerIndexPrefix) // the whole index, when the clock is at its maximum
	if v := uint64(tx.clock) ^ (1 << 63); v != math.MaxUint64 {
		upper = binary.BigEndian.AppendUint64([]byte(ledgerIndexPrefix), v+1)
	}
	it, err := tx.t.db.NewIter(&pebble.IterOptions{LowerBound: []byte(ledgerIndexPrefix), UpperBound: upper})
	if err != nil {
		return err
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid() && n < tx.t.opts.SweepLimit; it.Next() {
		ik := it.Key()
		if len(ik) < len(ledgerIndexPrefix)+8+1 {
			return corruption.Errorf("%w: index key %q", ErrBadRecord, ik)
		}
		exp := int64(binary.BigEndian.Uint64(ik[len(ledgerIndexPrefix):]) ^ (1 << 63))
		suffix := ik[len(ledgerIndexPrefix)+8:]
		rk := append([]byte(ledgerRowPrefix), suffix...)
		e, err := tx.get(rk)
		if err != nil {
			return err
		}
		if e != nil && e.Expires == exp {
			if err := tx.put(rk, e, nil); err != nil { // deletes row and this index entry
				return err
			}
			tx.t.swept.Add(1)
		} else if err := tx.b.Delete(bytes.Clone(ik), nil); err != nil { // stale index entry
			return err
		}
		n++
	}
	return it.Error()
}

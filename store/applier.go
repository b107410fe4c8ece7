package store

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/batchrepr"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Applier is the embedding database's state machine: the one boundary where
// oncewal hands decided events to user code.
//
// Apply receives, in log order, the events of one shipped batch that survived
// both dedup layers, and must add their effects to b — the same Pebble batch
// that carries the HWM advances and the applied position, so everything
// commits together or not at all. Apply must not commit b, must not write
// outside b, and must not write keys for which IsReserved is true (oncewal's
// metadata, HWMs, window journal and request ledger): behind a follower or a
// leader (RouteLedger) a batch that does is refused with ErrReservedKey.
//
// b is an indexed batch (pebble.DB.NewIndexedBatch): b.Get and b.NewIter
// read the store as it will be once b commits — the committed state plus
// everything staged in b so far, the effects of earlier events of the slice
// included — so a state machine can read-modify-write (a balance, a counter,
// a uniqueness check) with no handle on the store. The exception is an
// Applier that implements BatchReader and answers false for the batch: it
// gets a plain batch, which it must not read. Event slices alias the
// shipped batch's buffer and are only valid during the call.
//
// Request-ledger records (wal.OpClaim … wal.OpExtend) belong to oncewal's
// ledger table: the follower and a leader route them there themselves
// (RouteLedger), so an Applier given in follower.Options never sees them.
//
// Apply must keep the Applier contract (package doc, "The Applier
// contract"; invariant 9): it is deterministic, and a business-rule rejection is a
// result — refused before logging by a Validator, or recorded in b and
// answered with nil — never an error. An error (or a panic, recovered as
// ErrApplierPanic) aborts the whole batch: nothing is committed, the
// receiver's in-memory state is untouched, and Apply returns ErrApply; the
// shard stops until the Applier is fixed and the store reopened.
type Applier interface {
	Apply(b *pebble.Batch, events []wal.Event) error
}

// Validator is implemented by an Applier that refuses events before they
// are logged (path (a) of the Applier contract). A leader (LedgerLog) calls
// Validate for every append, after stamping and before writing the WAL,
// with the events Apply would get (stamped: SeqNo, WAL time, idempotency
// key; those the window suppresses and the request-ledger records left
// out), and b, a scratch indexed batch over the store as it stands after
// every batch logged before this one; b is discarded. Validate may read b
// and write into it — running Apply into b is the simplest way to judge
// later events by the effects of earlier ones — and returns nil to accept
// the append or its reason to refuse it: the caller then gets ErrRejected
// wrapping that reason, and nothing is logged (no WAL bytes, no SeqNo, no
// HWM advance). Followers never call Validate: they apply what the leader
// logged, so Apply must accept whatever Validate accepted on the same state.
type Validator interface {
	Validate(b *pebble.Batch, events []wal.Event) error
}

// ErrRejected: the Applier's Validate refused an append (a business rule,
// such as an overdraft). Nothing was logged and the session's SeqNo was not
// used; the error wraps the Validator's reason. It is an answer for the
// caller, not a failure: the shard keeps serving.
var ErrRejected = errors.New("store: rejected by the Applier's Validate (nothing was logged)")

// ErrApplierPanic: the Applier (Apply or Validate) panicked. The panic is
// recovered at the call and reported as this error, wrapped in ErrApply, so
// a bug in the state machine stops the shard instead of the process.
var ErrApplierPanic = errors.New("store: applier panicked")

// callApplier runs an Applier's Apply or Validate, turning a panic into an
// error wrapping ErrApplierPanic (invariant 9: never a crash); the stack
// goes to log, since the error keeps only the panic's value.
func callApplier(log *slog.Logger, f func(*pebble.Batch, []wal.Event) error, b *pebble.Batch, events []wal.Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			log.Error("store: applier panicked", "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("%w: %v", ErrApplierPanic, p)
		}
	}()
	return f(b, events)
}

// applyFailed is the error of a batch the Applier failed (ErrApply), with
// the remedy: the batch is in the leader's log and is delivered again, so
// only a fixed Applier gets the shard past it.
func applyFailed(h wal.Header, err error) error {
	return fmt.Errorf("%w on the batch at LSN %d-%d: %w; nothing of the batch was applied: fix the Applier "+
		"(deterministic, business-rule rejections as results: see the Applier contract in package replication) "+
		"and reopen the store, which applies the batch again", ErrApply, h.FirstLSN, h.LastLSN(), err)
}

// BatchReader is implemented by an Applier that can tell, before a batch is
// decided, whether applying it reads b. For a batch it does not read the
// receiver passes a plain batch (pebble.DB.NewBatch), and Pebble skips
// indexing every write — one skiplist insert per row, ~0.1–0.2 µs here
// (session.BenchmarkStatePut). events are all of the shipped batch's
// events, a superset of those Apply will get. An Applier without the method
// always gets an indexed batch.
type BatchReader interface {
	ReadsBatch(events []wal.Event) bool
}

// SessionApplier is the default Applier: session-scoped put / delete / add on
// keys, stored by session.State; the principal key space's kvput and
// kvdelete (package kv), each the whole row at keyspace.KV + its scoped
// key; and — when Ledger is set — the request-ledger records (wal.OpClaim …
// wal.OpExtend), applied to the node's ledger table in the same Pebble
// batch, so an operation's effect and its recorded outcome commit together
// on every node. Open and close events change no state rows (the Tracker
// records the close).
type SessionApplier struct {
	State *session.State
	// Ledger receives ledger records. nil: a ledger op fails the batch
	// (ErrApply), because skipping it would lose request outcomes.
	Ledger *idempotency.LedgerTable
}

// ReadsBatch implements BatchReader: only an Add reads (its counter's value
// so far), and on a plain batch session.StateTx remembers what it needs
// itself; the ledger table reads the store, never b, and a kvput or
// kvdelete is absolute (the leader resolved it), so it reads nothing. So a batch without Adds
// is applied write-only, and one with Adds gets an indexed batch, where Add
// reads b instead of keeping a map of every pending Put.
func (a SessionApplier) ReadsBatch(events []wal.Event) bool { return hasAdd(events) }

func hasAdd(events []wal.Event) bool {
	for i := range events {
		if events[i].Op == wal.OpAdd {
			return true
		}
	}
	return false
}

// Apply implements Applier.
func (a SessionApplier) Apply(b *pebble.Batch, events []wal.Event) error {
	if a.Ledger != nil {
		if err := applyLedger(b, a.Ledger, events); err != nil {
			return err
		}
	}
	tx := a.State.Begin(b)
	if !b.Indexed() && !hasAdd(events) {
		tx.WriteOnly()
	}
	var kvKey, row []byte // scratch: a Pebble batch copies what it is given
	for i := range events {
		ev := &events[i]
		var err error
		switch ev.Op {
		case wal.OpKVPut:
			kvKey = append(append(kvKey[:0], keyspace.KV...), ev.Key...)
			row = kv.AppendRow(row[:0], kv.Row{Value: ev.Value, Version: uint64(ev.Delta), ModLSN: ev.LSN})
			err = b.Set(kvKey, row, nil)
		case wal.OpKVDelete:
			kvKey = append(append(kvKey[:0], keyspace.KV...), ev.Key...)
			err = b.Delete(kvKey, nil)
		case wal.OpPut:
			err = tx.Put(ev.Session, ev.Key, ev.Value)
		case wal.OpDelete:
			err = tx.Delete(ev.Session, ev.Key)
		case wal.OpAdd:
			err = tx.Add(ev.Session, ev.Key, ev.Delta)
		case wal.OpOpen, wal.OpClose:
		default:
			switch {
			case !ev.Op.IsLedger():
				err = fmt.Errorf("store: session applier: unsupported op %v at LSN %d", ev.Op, ev.LSN)
			case a.Ledger == nil:
				err = fmt.Errorf("store: session applier: ledger op %v at LSN %d and no ledger table", ev.Op, ev.LSN)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// applyLedger applies the request-ledger records among events to table, in
// log order, and advances the ledger's WAL clock with every event's time.
// The ledger's keys (keyspace.Ledger) are its own, so applying its records
// before or after the other events' effects commits the same state.
func applyLedger(b *pebble.Batch, table *idempotency.LedgerTable, events []wal.Event) error {
	ltx := table.Begin(b)
	for i := range events {
		ev := &events[i]
		if ev.Op.IsLedger() {
			rec, err := ev.LedgerRecord()
			if err == nil {
				err = ltx.Apply(&rec)
			}
			if err != nil {
				return err
			}
		}
		if err := ltx.Observe(ev.Time); err != nil {
			return err
		}
	}
	return ltx.Finish()
}

// ErrReservedKey: an Applier behind RouteLedger wrote a reserved key
// (IsReserved). The batch is refused (ErrApply) before anything commits.
var ErrReservedKey = errors.New("store: applier wrote a reserved key")

// IsReserved reports whether key lies under one of the prefixes oncewal keeps
// for itself in a store (the layout in follower/doc.go), which an Applier
// must not write. The prefix registry is internal; this is the question an
// Applier's author needs answered.
func IsReserved(key []byte) bool { return keyspace.IsReserved(key) }

// RouteLedger returns the Applier a node runs for a custom state machine
// next: request-ledger records go to ledger (with the ledger's WAL clock),
// every other event, in log order, to next. follower.Open and OpenLedgerLog
// put it in front of a custom Applier, so the Applier needs neither the
// ledger table nor anything else that exists only after Open. The result
// keeps scratch space: one receiver at a time may use it.
//
// It also holds next to the Applier contract's key rule: a batch in which
// next wrote a reserved key (IsReserved) fails with ErrReservedKey, so a
// misplaced key is refused instead of overwriting oncewal's metadata, HWMs,
// journal or ledger. The check reads what next added to b once, after it
// returns.
func RouteLedger(ledger *idempotency.LedgerTable, next Applier) Applier {
	return &ledgerRouter{ledger: ledger, next: next}
}

type ledgerRouter struct {
	ledger *idempotency.LedgerTable
	next   Applier
	rest   []wal.Event // events without the ledger records, reused
}

// ReadsBatch implements BatchReader: the ledger table never reads b, so the
// answer is next's (true, an indexed batch, if next does not say).
func (r *ledgerRouter) ReadsBatch(events []wal.Event) bool {
	br, ok := r.next.(BatchReader)
	return !ok || br.ReadsBatch(events)
}

func (r *ledgerRouter) Apply(b *pebble.Batch, events []wal.Event) error {
	if err := applyLedger(b, r.ledger, events); err != nil {
		return err
	}
	rest := r.withoutLedger(events)
	from := b.Len()
	err := r.next.Apply(b, rest)
	clear(r.rest[:cap(r.rest)]) // drop references into the shipped batch
	if err != nil {
		return err
	}
	return checkUnreserved(b.Repr()[from:])
}

// Validate implements Validator: next's Validate, if it has one, on the
// events next would get (the ledger records are the router's).
func (r *ledgerRouter) Validate(b *pebble.Batch, events []wal.Event) error {
	v, ok := r.next.(Validator)
	if !ok {
		return nil
	}
	rest := r.withoutLedger(events)
	if len(rest) == 0 {
		return nil // only ledger records: nothing for next to judge
	}
	err := v.Validate(b, rest)
	clear(r.rest[:cap(r.rest)])
	return err
}

// withoutLedger returns events without the ledger records, in order; it
// copies (into r.rest) only a slice that carries any.
func (r *ledgerRouter) withoutLedger(events []wal.Event) []wal.Event {
	for i := range events {
		if events[i].Op.IsLedger() {
			rest := append(r.rest[:0], events[:i]...)
			for j := i + 1; j < len(events); j++ {
				if !events[j].Op.IsLedger() {
					rest = append(rest, events[j])
				}
			}
			r.rest = rest[:0]
			return rest
		}
	}
	return events
}

// checkUnreserved returns ErrReservedKey if a record of the batch
// representation tail repr (records only, no header) touches a reserved key.
// A range deletion counts with its whole range; a range key, whose end is
// encoded with its values, by its start key.
func checkUnreserved(repr []byte) error {
	rd := batchrepr.Reader(repr)
	for {
		kind, key, value, ok, err := rd.Next()
		if err != nil || !ok {
			return err
		}
		if kind == pebble.InternalKeyKindRangeDelete && keyspace.OverlapsReserved(key, value) ||
			keyspace.IsReserved(key) {
			return fmt.Errorf("%w: %s %q", ErrReservedKey, kind, key)
		}
	}
}

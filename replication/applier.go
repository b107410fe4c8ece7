package replication

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/idempotency"
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
// outside b, must not write keys in keyspace.Reserved (oncewal's metadata,
// HWMs, window journal and request ledger), and must make later events in the slice see the effects of
// earlier ones (b is not indexed; keep an overlay if you read back). Event
// slices alias the shipped batch's buffer and are only valid during the call.
//
// An error from Apply aborts the whole batch: nothing is committed, the
// receiver's in-memory state is untouched, and the batch may be delivered again.
type Applier interface {
	Apply(b *pebble.Batch, events []wal.Event) error
}

// SessionApplier is the default Applier: session-scoped put / delete / add on
// keys, stored by session.State, and — when Ledger is set — the request-ledger
// records (wal.OpClaim … wal.OpExtend), applied to the node's ledger table in
// the same Pebble batch, so an operation's effect and its recorded outcome
// commit together on every node. Open and close events change no state rows
// (the Tracker records the close).
type SessionApplier struct {
	State *session.State
	// Ledger receives ledger records. nil: a ledger op fails the batch
	// (ErrApply), because skipping it would lose request outcomes.
	Ledger *idempotency.LedgerTable
}

// Apply implements Applier.
func (a SessionApplier) Apply(b *pebble.Batch, events []wal.Event) error {
	tx := a.State.Begin(b)
	var ltx *idempotency.LedgerTx
	if a.Ledger != nil {
		ltx = a.Ledger.Begin(b)
	}
	for i := range events {
		ev := &events[i]
		var err error
		switch ev.Op {
		case wal.OpPut:
			err = tx.Put(ev.Session, ev.Key, ev.Value)
		case wal.OpDelete:
			err = tx.Delete(ev.Session, ev.Key)
		case wal.OpAdd:
			err = tx.Add(ev.Session, ev.Key, ev.Delta)
		case wal.OpOpen, wal.OpClose:
		default:
			if !ev.Op.IsLedger() {
				err = fmt.Errorf("replication: session applier: unsupported op %v at LSN %d", ev.Op, ev.LSN)
				break
			}
			if ltx == nil {
				return fmt.Errorf("replication: session applier: ledger op %v at LSN %d and no ledger table", ev.Op, ev.LSN)
			}
			var rec idempotency.Record
			if rec, err = ev.LedgerRecord(); err == nil {
				err = ltx.Apply(&rec)
			}
		}
		if err == nil && ltx != nil {
			err = ltx.Observe(ev.Time)
		}
		if err != nil {
			return err
		}
	}
	if ltx != nil {
		return ltx.Finish()
	}
	return nil
}

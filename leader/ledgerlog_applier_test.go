package leader_test

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// counters is a custom Applier that reads: each add is a read-modify-write
// of "c/<key>" through the batch. It records the ops it was handed.
type counters struct{ seen []wal.Op }

func (c *counters) Apply(b *pebble.Batch, events []wal.Event) error {
	for i := range events {
		ev := &events[i]
		c.seen = append(c.seen, ev.Op)
		if ev.Op != wal.OpAdd {
			continue
		}
		key := append([]byte("c/"), ev.Key...)
		var n int64
		v, closer, err := b.Get(key)
		switch {
		case err == nil:
			n = int64(binary.LittleEndian.Uint64(v))
			_ = closer.Close()
		case !errors.Is(err, pebble.ErrNotFound):
			return err
		}
		if err := b.Set(key, binary.LittleEndian.AppendUint64(nil, uint64(n+ev.Delta)), nil); err != nil {
			return err
		}
	}
	return nil
}

// TestCustomApplierReadsAndLedgerIsRouted: a custom Applier behind
// RouteLedger reads its own earlier writes in the batch and committed state,
// never sees ledger records, and the records reach the ledger table.
func TestCustomApplierReadsAndLedgerIsRouted(t *testing.T) {
	n := openNode(t, vfs.NewMem())
	defer n.db.Close()
	c := &counters{}
	r, err := store.NewReceiver(n.db, n.tracker, n.window, store.RouteLedger(n.table, c), nil)
	require.NoError(t, err)

	s := session.ID{9}
	add := func(seq session.SeqNo, d int64) wal.Event {
		return wal.Event{Op: wal.OpAdd, Session: s, Seq: seq, Time: t0, Key: []byte("x"), Delta: d}
	}
	claim := idempotency.Record{Kind: idempotency.RecordClaim, Token: idempotency.Token{1}, Time: t0,
		Expires: t0 + int64(time.Minute), Scope: "sc", Key: "req"}
	b1, err := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{add(1, 5), wal.LedgerEvent(&claim), add(2, 7)})
	require.NoError(t, err)
	b2, err := wal.AppendBatch(nil, 0, 1, 4, []wal.Event{add(3, 10)})
	require.NoError(t, err)
	for _, b := range [][]byte{b1, b2} {
		_, err := r.Apply(b)
		require.NoError(t, err)
	}

	require.Equal(t, []wal.Op{wal.OpAdd, wal.OpAdd, wal.OpAdd}, c.seen, "ledger records reached the custom Applier")
	v, closer, err := n.db.Get([]byte("c/x"))
	require.NoError(t, err)
	require.Equal(t, int64(22), int64(binary.LittleEndian.Uint64(v)), "an add did not see an earlier one")
	require.NoError(t, closer.Close())
	e, ok, err := n.table.Get("sc", "req")
	require.NoError(t, err)
	require.True(t, ok, "the claim did not reach the ledger table")
	require.Equal(t, idempotency.StateInFlight, e.State)
	clock, err := n.table.Clock()
	require.NoError(t, err)
	require.Equal(t, t0, clock, "the ledger's WAL clock did not advance")
}

// TestLeaderRoutesLedgerAroundCustomApplier: a leader (OpenLedgerLog) with a
// custom Applier applies its own ledger decisions to its table and hands the
// Applier only the other events.
func TestLeaderRoutesLedgerAroundCustomApplier(t *testing.T) {
	n := openNode(t, vfs.NewMem())
	defer n.db.Close()
	c := &counters{}
	l, err := leader.OpenLedgerLog(&leader.LedgerLogOptions{
		WALDir: "wal", Epoch: 1, DB: n.db, Tracker: n.tracker, Window: n.window, Table: n.table,
		Applier: c, Wall: testutil.NewClock().Now, FS: n.fs,
	})
	require.NoError(t, err)
	defer l.Close()
	claim, err := l.Ledger().Claim("sc", "req", []byte("payload"))
	require.NoError(t, err)
	require.NotNil(t, claim)
	_, err = l.Append(wal.Event{Op: wal.OpAdd, Session: session.ID{3}, Key: []byte("x"), Delta: 4})
	require.NoError(t, err)

	require.Equal(t, []wal.Op{wal.OpAdd}, c.seen)
	e, ok, err := n.table.Get("sc", "req")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, idempotency.StateInFlight, e.State)
}

// writer is an Applier that stages one fixed write per batch.
type writer func(b *pebble.Batch) error

func (w writer) Apply(b *pebble.Batch, _ []wal.Event) error { return w(b) }

// TestReservedKeysRefused: an Applier behind RouteLedger that writes into
// keyspace.Reserved — a point key or a range deletion across a reserved
// space — fails the batch, and nothing of it commits.
func TestReservedKeysRefused(t *testing.T) {
	for name, w := range map[string]writer{
		"set m/position": func(b *pebble.Batch) error { return b.Set([]byte("m/position"), []byte{1}, nil) },
		"delete l/clock": func(b *pebble.Batch) error { return b.Delete([]byte("l/clock"), nil) },
		"range a..z":     func(b *pebble.Batch) error { return b.DeleteRange([]byte("a"), []byte("z"), nil) },
	} {
		t.Run(name, func(t *testing.T) {
			n := openNode(t, vfs.NewMem())
			defer n.db.Close()
			batch := n.db.NewIndexedBatch()
			defer batch.Close()
			err := store.RouteLedger(n.table, w).Apply(batch, nil)
			require.ErrorIs(t, err, store.ErrReservedKey)

			r, err := store.NewReceiver(n.db, n.tracker, n.window, store.RouteLedger(n.table, w), nil)
			require.NoError(t, err)
			raw, err := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{{Op: wal.OpOpen, Session: session.ID{1}, Seq: 1, Time: t0}})
			require.NoError(t, err)
			_, err = r.Apply(raw)
			require.ErrorIs(t, err, store.ErrApply)
			lsn, _ := r.Position()
			require.Zero(t, lsn)
			_, _, ok, err := store.ReadMeta(n.db)
			require.NoError(t, err)
			require.False(t, ok, "a refused batch left metadata")
		})
	}
	// Keys outside the reserved spaces pass, a range between them too.
	n := openNode(t, vfs.NewMem())
	defer n.db.Close()
	batch := n.db.NewIndexedBatch()
	defer batch.Close()
	ok := writer(func(b *pebble.Batch) error {
		if err := b.Set([]byte("acct/1"), []byte{1}, nil); err != nil {
			return err
		}
		return b.DeleteRange([]byte("x"), []byte("y"), nil)
	})
	require.NoError(t, store.RouteLedger(n.table, ok).Apply(batch, nil))
}

// kindRecorder records whether each batch it got was indexed; reads says
// what it answers as a BatchReader.
type kindRecorder struct {
	reads   func([]wal.Event) bool
	indexed []bool
}

func (k *kindRecorder) ReadsBatch(events []wal.Event) bool { return k.reads(events) }
func (k *kindRecorder) Apply(b *pebble.Batch, _ []wal.Event) error {
	k.indexed = append(k.indexed, b.Indexed())
	return nil
}

// TestBatchReaderChoosesBatchKind: an Applier that says it does not read a
// batch gets a plain one, otherwise an indexed one — also behind
// RouteLedger; an Applier without the method always gets an indexed batch
// (TestCustomApplierReadsAndLedgerIsRouted reads through it).
func TestBatchReaderChoosesBatchKind(t *testing.T) {
	n := openNode(t, vfs.NewMem())
	defer n.db.Close()
	k := &kindRecorder{reads: func(evs []wal.Event) bool { return evs[0].Op == wal.OpAdd }}
	r, err := store.NewReceiver(n.db, n.tracker, n.window, store.RouteLedger(n.table, k), nil)
	require.NoError(t, err)
	s := session.ID{4}
	put := wal.Event{Op: wal.OpPut, Session: s, Seq: 1, Time: t0, Key: []byte("k"), Value: []byte("v")}
	add := wal.Event{Op: wal.OpAdd, Session: s, Seq: 2, Time: t0, Key: []byte("n"), Delta: 1}
	b1, err := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{put})
	require.NoError(t, err)
	b2, err := wal.AppendBatch(nil, 0, 1, 2, []wal.Event{add})
	require.NoError(t, err)
	for _, b := range [][]byte{b1, b2} {
		_, err := r.Apply(b)
		require.NoError(t, err)
	}
	require.Equal(t, []bool{false, true}, k.indexed)
}

// TestSessionApplierAddsAfterPuts: the default Applier's counters are right
// whichever batch it gets: Adds building on a Put and an Add of the same
// batch and on committed state, beside batches of Puts only (write-only).
func TestSessionApplierAddsAfterPuts(t *testing.T) {
	n := openNode(t, vfs.NewMem())
	defer n.db.Close()
	r := n.receiver()
	s := session.ID{5}
	seq := session.SeqNo(0)
	ev := func(op wal.Op, key string, v []byte, d int64) wal.Event {
		seq++
		return wal.Event{Op: op, Session: s, Seq: seq, Time: t0, Key: []byte(key), Value: v, Delta: d}
	}
	le := func(v int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(v)) }
	batches := [][]wal.Event{
		{ev(wal.OpPut, "a", le(10), 0), ev(wal.OpPut, "b", []byte("x"), 0)},                      // Puts only
		{ev(wal.OpPut, "c", le(100), 0), ev(wal.OpAdd, "c", nil, 5), ev(wal.OpAdd, "a", nil, 1)}, // on this batch's Put, on the committed one
		{ev(wal.OpAdd, "c", nil, 1), ev(wal.OpAdd, "c", nil, 1), ev(wal.OpPut, "a", le(7), 0)},
	}
	lsn := uint64(1)
	for _, evs := range batches {
		raw, err := wal.AppendBatch(nil, 0, 1, lsn, evs)
		require.NoError(t, err)
		lsn += uint64(len(evs))
		res, err := r.Apply(raw)
		require.NoError(t, err)
		require.Equal(t, len(evs), res.Applied)
	}
	for key, want := range map[string]int64{"a": 7, "c": 107} {
		got, err := n.state.Counter(s, []byte(key))
		require.NoError(t, err)
		require.Equal(t, want, got, key)
	}
	v, ok, err := n.state.Get(s, []byte("b"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []byte("x"), v)
}

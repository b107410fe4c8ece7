package leader_test

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// t0 is the WAL time the scripted events start at (where a test clock starts).
var t0 = testutil.ClockStart.UnixNano()

// TestLedgerRecordsTakeNoWindowSlots: ten one-event requests through a real
// LedgerLog leave exactly their ten operation keys in the window, on the
// leader's own store and on a follower fed its WAL. (Before ledger records
// were kept out, the same run left 30 keys: claim, complete and the add.)
func TestLedgerRecordsTakeNoWindowSlots(t *testing.T) {
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	walDir := t.TempDir()
	l, err := a.leader(walDir, 1, testutil.NewClock().Now)
	require.NoError(t, err)
	sid := session.ID{0x77}
	var want []idempotency.Key
	for i := range 10 {
		c := mustClaim(t, l, fmt.Sprint("req-", i))
		if i%3 == 0 { // a heartbeat and a waiting duplicate add records, not keys
			_, err := l.Ledger().Extend(c, 0)
			require.NoError(t, err)
		}
		_, err := l.Commit(c, []byte("ok"), wal.Event{Op: wal.OpAdd, Session: sid, Key: []byte("n"), Delta: 1})
		require.NoError(t, err)
		var op [64]byte
		ev := wal.Event{Op: wal.OpAdd, Key: []byte("n"), Delta: 1}
		want = append(want, idempotency.DeriveKey(sid, session.SeqNo(i+1), ev.AppendOpBytes(op[:0])))
	}
	rel := mustClaim(t, l, "released")
	require.NoError(t, l.Ledger().Release(rel))
	require.Equal(t, want, a.window.Keys(nil), "leader: one slot per operation")
	require.NoError(t, l.Close())

	b := openNode(t, vfs.NewMem())
	defer b.db.Close()
	shipAll(t, walDir, 1, b.receiver())
	require.Equal(t, want, b.window.Keys(nil), "follower: one slot per operation")
	require.Equal(t, a.ledgerRows(), b.ledgerRows())
}

// TestWindowKeepsLast100KOperations: after 10,000 earlier requests, 100,000
// one-event requests — each a claim, then its add and its complete in one
// batch, as LedgerLog.Commit logs them — leave exactly the last 100,000
// operation keys in a 100,000-key window, oldest first: ledger records
// occupy no slot, so the window's promise ("the last Capacity distinct
// operations") holds when the request ledger is used. Under -race (which
// makes the 330,000 Pebble applies take a minute) the same run is scaled
// to a 10,000-key window; the window code is the same.
func TestWindowKeepsLast100KOperations(t *testing.T) {
	warmup, requests := 10_000, idempotency.DefaultCapacity
	if testutil.RaceEnabled {
		warmup, requests = 1_000, 10_000
	}
	n := openNode(t, vfs.NewMem())
	defer n.db.Close()
	n.window = idempotency.NewStore(requests)
	r, err := store.NewReceiver(n.db, n.tracker, n.window,
		store.SessionApplier{State: n.state, Ledger: n.table}, &store.ReceiverOptions{NoSync: true})
	require.NoError(t, err)
	sid := session.ID{0x10, 0x0c}
	fp := idempotency.FingerprintOf([]byte("add 1"))
	var (
		evs  []wal.Event
		buf  []byte
		lsn  = uint64(1)
		want = make([]idempotency.Key, 0, requests)
	)
	flush := func() {
		if len(evs) == 0 {
			return
		}
		var err error
		buf, err = wal.AppendBatch(buf[:0], 0, 1, lsn, evs)
		require.NoError(t, err)
		_, err = r.Apply(buf)
		require.NoError(t, err)
		lsn += uint64(len(evs))
		evs = evs[:0]
	}
	var op [64]byte
	for i := range warmup + requests {
		ts := t0 + int64(i)*int64(time.Microsecond)
		var tok idempotency.Token
		binary.LittleEndian.PutUint64(tok[:], uint64(i))
		key := fmt.Sprint("req-", i)
		claim := idempotency.Record{Kind: idempotency.RecordClaim, Token: tok, Time: ts, Expires: ts + int64(time.Minute),
			Fingerprint: fp, Scope: "ops", Key: key}
		evs = append(evs, wal.LedgerEvent(&claim))
		add := wal.Event{Op: wal.OpAdd, Session: sid, Seq: session.SeqNo(i + 1), Time: ts + 1, Key: []byte("n"), Delta: 1}
		add.HasIdemKey, add.IdemKey = true, idempotency.DeriveKey(sid, add.Seq, add.AppendOpBytes(op[:0]))
		done := idempotency.Record{Kind: idempotency.RecordComplete, Token: tok, Time: ts + 1, Expires: ts + 1 + int64(24*time.Hour),
			Fingerprint: fp, Scope: "ops", Key: key, Outcome: []byte("ok")}
		evs = append(evs, add, wal.LedgerEvent(&done))
		if i >= warmup {
			want = append(want, add.IdemKey)
		}
		if len(evs) >= 1500 {
			flush()
		}
	}
	flush()
	require.Equal(t, requests, n.window.Len())
	require.Equal(t, want, n.window.Keys(nil), "the window is exactly the last %d operations, oldest first", requests)
	got, err := n.state.Counter(sid, []byte("n"))
	require.NoError(t, err)
	require.Equal(t, int64(warmup+requests), got)
	e, found, err := n.table.Get("ops", fmt.Sprint("req-", warmup+requests-1))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, idempotency.StateCompleted, e.State, "the ledger records were applied, just not windowed")
}

// TestReceiverIgnoresLedgerEventKeys: ledger events logged by leaders from
// before the change carry an idempotency key; the receiver neither records
// it nor lets it suppress the record, even when it equals an operation key
// already in the window.
func TestReceiverIgnoresLedgerEventKeys(t *testing.T) {
	n := openNode(t, vfs.NewMem())
	defer n.db.Close()
	r := n.receiver()
	sid := session.ID{5}
	var op [64]byte
	add := wal.Event{Op: wal.OpAdd, Session: sid, Seq: 1, Time: t0, Key: []byte("n"), Delta: 1}
	add.HasIdemKey, add.IdemKey = true, idempotency.DeriveKey(sid, 1, add.AppendOpBytes(op[:0]))
	claim := idempotency.Record{Kind: idempotency.RecordClaim, Token: idempotency.Token{1}, Time: t0 + 1, Expires: t0 + 1 + int64(time.Minute),
		Scope: "ops", Key: "k"}
	keyed := wal.LedgerEvent(&claim)
	keyed.HasIdemKey, keyed.IdemKey = true, add.IdemKey // the worst case: an operation's key
	other := keyed
	other.IdemKey = idempotency.Key{9}
	b1, err := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{add})
	require.NoError(t, err)
	_, err = r.Apply(b1)
	require.NoError(t, err)
	b2, err := wal.AppendBatch(nil, 0, 1, 2, []wal.Event{keyed, other})
	require.NoError(t, err)
	res, err := r.Apply(b2)
	require.NoError(t, err)
	require.Equal(t, 2, res.Applied)
	require.Equal(t, []idempotency.Key{add.IdemKey}, n.window.Keys(nil))
	e, found, err := n.table.Get("ops", "k")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, idempotency.StateInFlight, e.State)
}

// TestLedgerLogExtendReplicates: an extension is a WAL record like every
// decision: a follower fed the log holds the extended lease, re-applying
// the log changes nothing, and the stale claim record cannot shorten it.
func TestLedgerLogExtendReplicates(t *testing.T) {
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	walDir := t.TempDir()
	wall := testutil.NewClock()
	l, err := a.leader(walDir, 1, wall.Now)
	require.NoError(t, err)
	defer l.Close()
	c, err := l.Ledger().ClaimWith(t.Context(), "ops", "k", []byte("p"), idempotency.ClaimOptions{Action: "charge card"})
	require.NoError(t, err)
	wall.Advance(50 * time.Second)
	end, err := l.Ledger().Extend(c, 2*time.Minute)
	require.NoError(t, err)

	b := openNode(t, vfs.NewMem())
	defer b.db.Close()
	rb := b.receiver()
	shipAll(t, walDir, 1, rb)
	e, found, err := b.table.Get("ops", "k")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, end, e.Expires)
	require.Equal(t, int64(2*time.Minute), e.Expires-e.Time, "the lease ends 2 minutes after the extension")
	require.Greater(t, e.Expires, c.LeaseEnd)
	require.Equal(t, c.Token, e.Token)
	require.Equal(t, "charge card", e.Action)
	require.Equal(t, a.ledgerRows(), b.ledgerRows())
	// Records applied again in a later transaction (a store rebuilt from an
	// older position, say) are stale: the lease stays extended.
	rd, err := wal.OpenReader(walDir, 0)
	require.NoError(t, err)
	defer rd.Close()
	bat := b.db.NewBatch()
	tx := b.table.Begin(bat)
	for {
		_, raw, err := rd.Next()
		if err != nil {
			break
		}
		_, evs, err := wal.DecodeBatch(raw, nil)
		require.NoError(t, err)
		for _, ev := range evs {
			rec, err := ev.LedgerRecord()
			require.NoError(t, err)
			require.NoError(t, tx.Apply(&rec))
		}
	}
	require.NoError(t, tx.Finish())
	require.NoError(t, bat.Commit(pebble.Sync))
	require.Equal(t, a.ledgerRows(), b.ledgerRows())
}

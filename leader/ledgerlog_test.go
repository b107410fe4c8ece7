package leader_test

import (
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// node is a store with its layers, as follower.Open wires them.
type node struct {
	t       *testing.T
	fs      vfs.FS
	db      *pebble.DB
	tracker *session.Tracker
	window  *idempotency.Store
	state   *session.State
	table   *idempotency.LedgerTable
}

func openNode(t *testing.T, fs vfs.FS) *node {
	o := testutil.DBOptions(fs)
	o.Logger = store.FatalLogger{}
	db := testutil.OpenDBWith(t, "store", o)
	n := &node{t: t, fs: fs, db: db, window: idempotency.NewStore(1000), state: session.NewState(db)}
	var err error
	n.tracker, err = session.OpenTracker(db, nil)
	require.NoError(t, err)
	n.table, err = idempotency.OpenLedgerTable(db, nil)
	require.NoError(t, err)
	return n
}

func (n *node) receiver() *store.Receiver {
	r, err := store.NewReceiver(n.db, n.tracker, n.window,
		store.SessionApplier{State: n.state, Ledger: n.table}, nil)
	require.NoError(n.t, err)
	return r
}

func (n *node) leader(walDir string, epoch uint64, wall func() int64) (*leader.LedgerLog, error) {
	return leader.OpenLedgerLog(&leader.LedgerLogOptions{
		WALDir: walDir, Epoch: epoch, DB: n.db, Tracker: n.tracker, Window: n.window, Table: n.table, State: n.state,
		Wall: wall,
	})
}

func (n *node) ledgerRows() map[string]string {
	out := map[string]string{}
	it, err := n.db.NewIter(&pebble.IterOptions{LowerBound: []byte("l/r/"), UpperBound: []byte("l/r0")})
	require.NoError(n.t, err)
	for it.First(); it.Valid(); it.Next() {
		out[string(it.Key())] = string(it.Value())
	}
	require.NoError(n.t, it.Close())
	return out
}

// shipAll feeds every batch of walDir from LSN from on to r.
func shipAll(t *testing.T, walDir string, from uint64, r *store.Receiver) {
	rd, err := wal.OpenReader(walDir, 0)
	require.NoError(t, err)
	defer rd.Close()
	require.NoError(t, rd.Seek(from))
	for {
		_, raw, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(t, err)
		_, err = r.Apply(raw)
		require.NoError(t, err)
	}
}

func TestLedgerLogCommitReplicates(t *testing.T) {
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	walDir := t.TempDir()
	wall := testutil.NewClock()
	l, err := a.leader(walDir, 1, wall.Now)
	require.NoError(t, err)
	sid := session.ID{7}
	c, err := l.Ledger().Claim("ops", "req-1", []byte("add 5"))
	require.NoError(t, err)
	require.Equal(t, idempotency.Fresh, c.Status)
	h, err := l.Commit(c, []byte("n=5"), wal.Event{Op: wal.OpAdd, Session: sid, Key: []byte("n"), Delta: 5})
	require.NoError(t, err)
	require.Equal(t, uint64(2), h.FirstLSN, "claim at LSN 1, effect + complete at 2-3")
	require.Equal(t, uint64(3), h.LastLSN())
	n, err := a.state.Counter(sid, []byte("n"))
	require.NoError(t, err)
	require.Equal(t, int64(5), n, "the leader's store applied its own log")
	r, err := l.Ledger().Claim("ops", "req-1", []byte("add 5"))
	require.NoError(t, err)
	require.Equal(t, idempotency.Replay, r.Status)
	require.Equal(t, "n=5", string(r.Outcome))
	// Second op in the same session gets SeqNo 2; release and fail too.
	c2, err := l.Ledger().Claim("ops", "req-2", []byte("x"))
	require.NoError(t, err)
	require.NoError(t, l.Ledger().Release(c2))
	c3, err := l.Ledger().Claim("ops", "req-3", []byte("x"))
	require.NoError(t, err)
	require.NoError(t, l.Ledger().Fail(c3, []byte("nope"), 0))
	_, err = l.Commit(mustClaim(t, l, "req-4"), []byte("n=7"), wal.Event{Op: wal.OpAdd, Session: sid, Key: []byte("n"), Delta: 2})
	require.NoError(t, err)
	hwm, _, _, err := a.tracker.Get(sid)
	require.NoError(t, err)
	require.Equal(t, session.SeqNo(2), hwm)

	// A follower fed the log holds the same ledger and state.
	b := openNode(t, vfs.NewMem())
	defer b.db.Close()
	shipAll(t, walDir, 1, b.receiver())
	require.Equal(t, a.ledgerRows(), b.ledgerRows())
	nb, err := b.state.Counter(sid, []byte("n"))
	require.NoError(t, err)
	require.Equal(t, int64(7), nb)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close())
	_, err = l.Append(wal.Event{Op: wal.OpPut, Key: []byte("k")})
	require.ErrorIs(t, err, leader.ErrClosed)
	require.ErrorIs(t, err, wal.ErrClosed)
}

func mustClaim(t *testing.T, l *leader.LedgerLog, key string) *idempotency.Claim {
	c, err := l.Ledger().Claim("ops", key, []byte("p"))
	require.NoError(t, err)
	require.Equal(t, idempotency.Fresh, c.Status)
	return c
}

func TestLedgerLogRefusesWhatItMustStamp(t *testing.T) {
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	l, err := a.leader(t.TempDir(), 1, nil)
	require.NoError(t, err)
	defer l.Close()
	next := l.Writer().NextLSN()
	_, err = l.Append(wal.Event{Op: wal.OpAdd, Session: session.ID{1}, Seq: 5, Key: []byte("n"), Delta: 1})
	require.ErrorIs(t, err, leader.ErrBadEvent)
	rec := idempotency.Record{Kind: idempotency.RecordRelease, Scope: "s", Key: "k", Time: 1}
	_, err = l.Append(wal.LedgerEvent(&rec))
	require.ErrorIs(t, err, leader.ErrBadEvent)
	_, err = l.Append(wal.Event{Op: wal.OpPut, Delta: 3})
	require.ErrorIs(t, err, wal.ErrInvalidEvent)
	require.Equal(t, next, l.Writer().NextLSN(), "nothing logged")
	c := mustClaim(t, l, "k")
	_, err = l.Commit(c, nil, wal.LedgerEvent(&rec))
	require.ErrorIs(t, err, leader.ErrBadEvent)
	_, err = l.Commit(c, nil, wal.Event{Op: wal.OpAdd, Session: session.ID{1}, Key: []byte("n"), Delta: 1})
	require.NoError(t, err, "a refused commit leaves the claim usable")
	// Sequencing continued correctly after the refusals.
	_, err = l.Append(wal.Event{Op: wal.OpAdd, Session: session.ID{1}, Key: []byte("n"), Delta: 1})
	require.NoError(t, err)
	hwm, _, _, err := a.tracker.Get(session.ID{1})
	require.NoError(t, err)
	require.Equal(t, session.SeqNo(2), hwm)
}

func TestLedgerLogFencesOlderEpoch(t *testing.T) {
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	walDir := t.TempDir()
	l, err := a.leader(walDir, 3, nil)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	_, err = a.leader(walDir, 2, nil)
	require.ErrorIs(t, err, replication.ErrStaleEpoch)
	// The store refuses batches of the older epoch from now on.
	old, err := wal.AppendBatch(nil, 0, 2, 1, []wal.Event{{Op: wal.OpPut, Key: []byte("k")}})
	require.NoError(t, err)
	_, err = a.receiver().Apply(old)
	require.ErrorIs(t, err, replication.ErrStaleEpoch)
	// The same epoch reopens (a leader restarting), default epoch too.
	l, err = a.leader(walDir, 0, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(3), l.Epoch())
	require.NoError(t, l.Close())
}

// TestLedgerLogRecoversStoreFromWAL: the leader's store commits without
// fsync; after a power cut it is behind the (synced) WAL, and reopening
// re-applies the difference.
func TestLedgerLogRecoversStoreFromWAL(t *testing.T) {
	behind := 0
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 1))
		fs := vfs.NewCrashableMem()
		a := openNode(t, fs)
		walDir := t.TempDir()
		l, err := a.leader(walDir, 1, nil)
		require.NoError(t, err)
		sid := session.ID{1}
		var want int64
		for i := range 30 {
			c := mustClaim(t, l, "k"+strings.Repeat("x", i))
			d := int64(rng.IntN(10))
			want += d
			_, err := l.Commit(c, []byte("ok"), wal.Event{Op: wal.OpAdd, Session: sid, Key: []byte("n"), Delta: d})
			require.NoError(t, err)
		}
		rows := a.ledgerRows()
		end := l.Writer().NextLSN() - 1
		crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(100), RNG: rng})
		require.NoError(t, l.Close())
		require.NoError(t, a.db.Close())

		b := openNode(t, crashed)
		pre, _, _, err := store.ReadMeta(b.db)
		require.NoError(t, err)
		if pre < end {
			behind++
		}
		l2, err := b.leader(walDir, 1, nil)
		require.NoError(t, err)
		lsn, _ := l2.Position()
		require.Equal(t, end, lsn)
		got, err := b.state.Counter(sid, []byte("n"))
		require.NoError(t, err)
		require.Equal(t, want, got)
		require.Equal(t, rows, b.ledgerRows())
		r, err := l2.Ledger().Claim("ops", "k", []byte("p"))
		require.NoError(t, err)
		require.Equal(t, idempotency.Replay, r.Status)
		require.NoError(t, l2.Close())
		require.NoError(t, b.db.Close())
	}
	require.Positive(t, behind, "some crash must have left the store behind the WAL")
}

func TestLedgerLogWALClockContinues(t *testing.T) {
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	walDir := t.TempDir()
	wall := testutil.NewClock()
	l, err := a.leader(walDir, 1, wall.Now)
	require.NoError(t, err)
	c := mustClaim(t, l, "k")
	require.NoError(t, l.Close())
	// The next leader's wall clock is an hour behind: the WAL clock is not.
	wall.Advance(-time.Hour)
	l, err = a.leader(walDir, 2, wall.Now)
	require.NoError(t, err)
	defer l.Close()
	require.Greater(t, l.Now(), c.Time)
	in, err := l.Ledger().Claim("ops", "k", []byte("p"))
	require.NoError(t, err)
	require.Equal(t, idempotency.InFlight, in.Status, "the lease runs on the WAL clock, not the new leader's wall clock")
	wall.Advance(time.Hour + time.Minute)
	in, err = l.Ledger().Claim("ops", "k", []byte("p"))
	require.NoError(t, err)
	require.Equal(t, idempotency.Fresh, in.Status)
}

// TestLedgerLogRefusesExpiredSession: a session idle past the retention
// horizon is forgotten by every follower, so logging its next SeqNo would
// wedge the log (found in review: the local apply refused it as a gap, and so
// did every reopen). The log refuses the event before writing anything.
func TestLedgerLogRefusesExpiredSession(t *testing.T) {
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	walDir := t.TempDir()
	wall := testutil.NewClock()
	l, err := a.leader(walDir, 1, wall.Now)
	require.NoError(t, err)
	x, y := session.ID{0x58}, session.ID{0x59}
	put := func(id session.ID) wal.Event {
		return wal.Event{Op: wal.OpPut, Session: id, Key: []byte("k"), Value: []byte("v")}
	}
	_, err = l.Append(put(x))
	require.NoError(t, err)
	wall.Advance(25 * time.Hour) // past the default 24 h horizon
	_, err = l.Append(put(y))
	require.NoError(t, err)
	before, _ := l.Position()
	_, err = l.Append(put(x))
	require.ErrorIs(t, err, leader.ErrSessionExpired)
	after, _ := l.Position()
	require.Equal(t, before, after, "nothing logged for the expired session")
	_, err = l.Append(put(y)) // the log is not wedged
	require.NoError(t, err)
	require.NoError(t, l.Close())
	l, err = a.leader(walDir, 2, wall.Now) // and it reopens
	require.NoError(t, err)
	require.NoError(t, l.Close())
}

// TestLeaderLedgerCompleteRefuses: on a leader's ledger, Complete would log
// the outcome in a batch of its own, apart from the operation's events (the
// non-atomic Complete-then-Append of issue 25), so it refuses, naming
// Shard.Commit, logs nothing and leaves the claim owning its key.
func TestLeaderLedgerCompleteRefuses(t *testing.T) {
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	l, err := a.leader(t.TempDir(), 1, testutil.NewClock().Now)
	require.NoError(t, err)
	defer l.Close()
	c, err := l.Ledger().Claim("ops", "req-1", []byte("add 5"))
	require.NoError(t, err)
	next, rows := l.Writer().NextLSN(), a.ledgerRows()

	err = l.Ledger().Complete(c, []byte("n=5"))
	require.ErrorIs(t, err, idempotency.ErrCompleteNotAtomic)
	require.ErrorContains(t, err, "leader.Shard.Commit(claim, outcome, events...)")
	require.Equal(t, next, l.Writer().NextLSN(), "nothing logged")
	require.Equal(t, rows, a.ledgerRows(), "the claim's row is as it was")

	_, err = l.Commit(c, []byte("n=5"), wal.Event{Op: wal.OpAdd, Session: session.ID{7}, Key: []byte("n"), Delta: 5})
	require.NoError(t, err, "the claim still owns its key: Commit completes it")
	r, err := l.Ledger().Claim("ops", "req-1", []byte("add 5"))
	require.NoError(t, err)
	require.Equal(t, idempotency.Replay, r.Status)
}

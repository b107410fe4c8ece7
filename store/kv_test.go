package store_test

import (
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/internal/rawdb"
	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

func openKVStore(t *testing.T, fs vfs.FS) *store.Store {
	t.Helper()
	st, err := store.Open("/s", &store.Options{FS: fs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return st
}

// kvLeader stands for the leader: it resolves transactions against its
// store under the overlay of what it logged, stamps each event as a data
// event of the session (SeqNo, idempotency key, WAL time) and encodes the
// batch.
type kvLeader struct {
	t       *testing.T
	st      *store.Store
	pending kv.Pending
	sid     session.ID
	seq     session.SeqNo
	next    uint64
}

func (l *kvLeader) txn(txn *kv.Txn) (raw []byte, events []wal.Event, res kv.Result) {
	l.t.Helper()
	events, res, err := kv.Resolve(kv.Layer(&l.pending, l.st.KVReader()), "alice", txn, l.sid, l.next)
	require.NoError(l.t, err)
	for i := range events {
		l.seq++
		events[i].Seq, events[i].Time = l.seq, t0+int64(l.seq)
		events[i].HasIdemKey = true
		events[i].IdemKey = idempotency.DeriveKey(l.sid, l.seq, events[i].AppendOpBytes(nil))
	}
	if len(events) == 0 {
		return nil, events, res // nothing to log (a real request still logs its ledger records)
	}
	raw, err = wal.AppendBatch(nil, 0, 1, l.next, events)
	require.NoError(l.t, err)
	l.pending.Note(events)
	l.next += uint64(len(events))
	return raw, events, res
}

func (l *kvLeader) apply(raw []byte) store.Result {
	l.t.Helper()
	res, err := l.st.Apply(raw)
	require.NoError(l.t, err)
	applied, _ := l.st.Position()
	l.pending.Forget(applied)
	return res
}

func rowOf(t *testing.T, st *store.Store, key string) (kv.Row, bool) {
	t.Helper()
	row, ok, err := st.KVGet("alice", []byte(key))
	require.NoError(t, err)
	return row, ok
}

func counter(n int64) []byte { return fmt.Appendf(nil, "%c%c%c%c%c%c%c%c", n, 0, 0, 0, 0, 0, 0, 0) }

// TestKVAppliedExactlyOnce: key-space events are data events of their
// session. A batch delivered twice, an event logged again under a new LSN
// with its SeqNo (the HWM discards it), and one re-stamped with a new SeqNo
// but its idempotency key (the window suppresses it) change no row: each
// row has the version and modLSN of its one application.
func TestKVAppliedExactlyOnce(t *testing.T) {
	st := openKVStore(t, vfs.NewMem())
	defer st.Close()
	l := &kvLeader{t: t, st: st, sid: session.ID{7}, next: 1}

	raw1, ev1, res := l.txn(&kv.Txn{Then: []kv.Op{
		{Kind: kv.Put, Key: []byte("a"), Value: []byte("v1")},
		{Kind: kv.Add, Key: []byte("n"), Delta: 5},
		{Kind: kv.Put, Key: []byte("gone"), Value: []byte("x")},
		{Kind: kv.Delete, Key: []byte("gone")},
	}})
	require.Len(t, ev1, 4)
	require.Equal(t, kv.OpResult{Kind: kv.Add, Value: counter(5), Version: 1, ModLSN: 2}, res.Ops[1])
	r := l.apply(raw1)
	require.Equal(t, 4, r.Applied)
	check := func(key string, want kv.Row) {
		t.Helper()
		got, ok := rowOf(t, st, key)
		require.True(t, ok, key)
		require.Equal(t, want, got, key)
	}
	check("a", kv.Row{Value: []byte("v1"), Version: 1, ModLSN: 1})
	check("n", kv.Row{Value: counter(5), Version: 1, ModLSN: 2})
	_, ok := rowOf(t, st, "gone")
	require.False(t, ok, "put then deleted in one batch")

	// The whole batch again: a redelivery.
	r = l.apply(raw1)
	require.False(t, r.Committed)
	require.Zero(t, r.Applied)

	// The add logged again at a new LSN with its SeqNo: the HWM discards it.
	dup := ev1[1]
	dupRaw, err := wal.AppendBatch(nil, 0, 1, l.next, []wal.Event{dup})
	require.NoError(t, err)
	l.next++
	r = l.apply(dupRaw)
	require.Zero(t, r.Applied)
	require.Equal(t, 1, r.Discarded)

	// The add re-stamped with a fresh SeqNo but its idempotency key (a
	// retry logged twice): the window suppresses it, the HWM advances.
	l.seq++
	again := ev1[1]
	again.Seq = l.seq
	againRaw, err := wal.AppendBatch(nil, 0, 1, l.next, []wal.Event{again})
	require.NoError(t, err)
	l.next++
	r = l.apply(againRaw)
	require.Zero(t, r.Applied)
	require.Equal(t, 1, r.Discarded)
	hwm, _, _, err := st.Tracker().Get(l.sid)
	require.NoError(t, err)
	require.Equal(t, l.seq, hwm, "a suppressed event's fresh SeqNo still advances the HWM")

	check("a", kv.Row{Value: []byte("v1"), Version: 1, ModLSN: 1})
	check("n", kv.Row{Value: counter(5), Version: 1, ModLSN: 2})

	// A new add applies once, on top: version 2 at its LSN.
	raw2, _, res := l.txn(&kv.Txn{Then: []kv.Op{{Kind: kv.Add, Key: []byte("n"), Delta: 1}}})
	require.Equal(t, counter(6), res.Ops[0].Value)
	require.Equal(t, 1, l.apply(raw2).Applied)
	check("n", kv.Row{Value: counter(6), Version: 2, ModLSN: 7})
	require.Zero(t, l.pending.Len(), "everything logged is applied")

	// One consistent read: the rows and the position of one snapshot.
	require.NoError(t, st.KVRead(func(x *store.KVSnap) error {
		require.EqualValues(t, 7, x.AppliedLSN())
		require.EqualValues(t, 1, x.Epoch())
		row, ok, err := x.Get("alice", []byte("n"))
		require.NoError(t, err)
		require.True(t, ok)
		require.LessOrEqual(t, row.ModLSN, x.AppliedLSN())
		return nil
	}))
}

// TestKVResolvesAgainstUnapplied: the leader's overlay makes a transaction
// see an earlier one it logged but has not applied: the second "create if
// absent" fails although the store does not hold the key yet.
func TestKVResolvesAgainstUnapplied(t *testing.T) {
	st := openKVStore(t, vfs.NewMem())
	defer st.Close()
	l := &kvLeader{t: t, st: st, sid: session.ID{8}, next: 1}
	create := &kv.Txn{
		If:   []kv.Compare{{Key: []byte("name"), Target: kv.TargetExists, Result: kv.Equal, Number: 0}},
		Then: []kv.Op{{Kind: kv.Put, Key: []byte("name"), Value: []byte("first")}},
		Else: []kv.Op{{Kind: kv.Get, Key: []byte("name")}},
	}
	raw1, _, res1 := l.txn(create)
	require.True(t, res1.Succeeded)
	_, ev2, res2 := l.txn(create)
	require.False(t, res2.Succeeded)
	require.Empty(t, ev2)
	require.Equal(t, []byte("first"), res2.Ops[0].Value, "the Else branch read the unapplied put")
	_, ok := rowOf(t, st, "name")
	require.False(t, ok, "not applied yet")
	l.apply(raw1)
	require.Zero(t, l.pending.Len())
	row, ok := rowOf(t, st, "name")
	require.True(t, ok)
	require.Equal(t, kv.Row{Value: []byte("first"), Version: 1, ModLSN: 1}, row)
}

// TestKVSurvivesCrash: rows of an applied (synced) batch survive a power
// failure that keeps nothing unsynced; redelivering every batch to the
// recovered store applies nothing again.
func TestKVSurvivesCrash(t *testing.T) {
	mem := vfs.NewCrashableMem()
	st := openKVStore(t, mem)
	l := &kvLeader{t: t, st: st, sid: session.ID{9}, next: 1}
	var raws [][]byte
	for i := range 5 {
		raw, _, _ := l.txn(&kv.Txn{Then: []kv.Op{
			{Kind: kv.Add, Key: []byte("{c}n"), Delta: 1},
			{Kind: kv.Put, Key: fmt.Appendf(nil, "{c}k%d", i), Value: []byte("v")},
		}})
		l.apply(raw)
		raws = append(raws, raw)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	require.NoError(t, drill.Kill(st))

	st = openKVStore(t, crashed)
	defer st.Close()
	want := kv.Row{Value: counter(5), Version: 5, ModLSN: 9}
	row, ok := rowOf(t, st, "{c}n")
	require.True(t, ok)
	require.Equal(t, want, row)
	for _, raw := range raws {
		res, err := st.Apply(raw)
		require.NoError(t, err)
		require.Zero(t, res.Applied)
	}
	row, _ = rowOf(t, st, "{c}n")
	require.Equal(t, want, row, "a redelivery after the crash changed a row")
	pairs, more, err := st.KVRange("alice", []byte("{c}k"), 0)
	require.NoError(t, err)
	require.False(t, more)
	require.Len(t, pairs, 5)
}

// TestKVRange: a range reads one principal's keys under a prefix, in
// order, principal stripped, at most limit rows with more reporting the
// rest; another principal's keys and other prefixes stay out.
func TestKVRange(t *testing.T) {
	st := openKVStore(t, vfs.NewMem())
	defer st.Close()
	var events []wal.Event
	put := func(principal, key, value string) {
		events = append(events, wal.Event{Op: wal.OpKVPut, Session: session.ID{1}, Seq: session.SeqNo(len(events) + 1),
			Time: t0, Key: kv.Scoped(principal, []byte(key)), Value: []byte(value), Delta: 1})
	}
	put("alice", "user/1", "a1")
	put("alice", "user/3", "a3")
	put("alice", "user/2", "a2")
	put("alice", "user\xff", "after the prefix")
	put("alice", "uses", "another prefix")
	put("alicf", "user/0", "another principal")
	put("al", "iceuser/0", "a principal that is a prefix of alice")
	raw, err := wal.AppendBatch(nil, 0, 1, 1, events)
	require.NoError(t, err)
	_, err = st.Apply(raw)
	require.NoError(t, err)

	pairs, more, err := st.KVRange("alice", []byte("user/"), 0)
	require.NoError(t, err)
	require.False(t, more)
	var keys []string
	for _, p := range pairs {
		keys = append(keys, string(p.Key)+"="+string(p.Row.Value))
	}
	require.Equal(t, []string{"user/1=a1", "user/2=a2", "user/3=a3"}, keys)
	require.EqualValues(t, 2, pairs[2].Row.ModLSN, "user/3 was the second event")

	pairs, more, err = st.KVRange("alice", []byte("user/"), 2)
	require.NoError(t, err)
	require.True(t, more)
	require.Len(t, pairs, 2)

	pairs, _, err = st.KVRange("alice", nil, 0)
	require.NoError(t, err)
	require.Len(t, pairs, 5, "an empty prefix reads all of alice's keys and no one else's")

	_, _, err = st.KVRange("alice", nil, kv.MaxRangeLimit+1)
	require.ErrorIs(t, err, kv.ErrInvalidRead)
	_, _, err = st.KVGet("alice", nil)
	require.ErrorIs(t, err, kv.ErrInvalidRead)
	_, _, err = st.KVGet("", []byte("k"))
	require.ErrorIs(t, err, kv.ErrInvalidPrincipal)
}

// TestKVReadErrors: a corrupt row is a typed corruption error, and reads
// of a closed store answer ErrClosed instead of panicking in Pebble.
func TestKVReadErrors(t *testing.T) {
	st := openKVStore(t, vfs.NewMem())
	db := rawdb.Of(st)
	require.NoError(t, db.Set(append([]byte("k/"), kv.Scoped("alice", []byte("bad"))...), []byte{9, 9}, pebble.Sync))
	_, _, err := st.KVGet("alice", []byte("bad"))
	require.ErrorIs(t, err, kv.ErrCorrupt)
	require.ErrorIs(t, err, corruption.Err)
	_, _, err = st.KVRange("alice", nil, 0)
	require.ErrorIs(t, err, kv.ErrCorrupt)
	_, _, err = st.KVReader().Get(kv.Scoped("alice", []byte("bad")))
	require.ErrorIs(t, err, kv.ErrCorrupt)

	reader := st.KVReader()
	require.NoError(t, st.Close())
	_, _, err = st.KVGet("alice", []byte("k"))
	require.ErrorIs(t, err, store.ErrClosed)
	_, _, err = st.KVRange("alice", nil, 0)
	require.ErrorIs(t, err, store.ErrClosed)
	_, _, err = reader.Get(kv.Scoped("alice", []byte("k")))
	require.ErrorIs(t, err, store.ErrClosed)
}

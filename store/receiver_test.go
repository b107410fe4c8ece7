package store_test

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// t0 is the WAL time the scripted events start at (where a test clock starts).
var t0 = testutil.ClockStart.UnixNano()

type rig struct {
	t       *testing.T
	db      *pebble.DB
	tracker *session.Tracker
	window  *idempotency.Store
	state   *session.State
	recv    *store.Receiver
	applier store.Applier
	nextLSN uint64
}

func newRig(t *testing.T, applier func(*session.State) store.Applier) *rig {
	o := testutil.DBOptions(vfs.NewMem())
	o.Logger = store.FatalLogger{}
	db := testutil.OpenDBWith(t, "", o)
	t.Cleanup(func() { _ = db.Close() })
	r := &rig{t: t, db: db, nextLSN: 1}
	var err error
	r.tracker, err = session.OpenTracker(db, nil)
	require.NoError(t, err)
	r.window = idempotency.NewStore(1000)
	r.state = session.NewState(db)
	r.applier = store.SessionApplier{State: r.state}
	if applier != nil {
		r.applier = applier(r.state)
	}
	r.recv, err = store.NewReceiver(db, r.tracker, r.window, r.applier, &store.ReceiverOptions{Shard: 3})
	require.NoError(t, err)
	return r
}

// newWindowRig is newRig with a window of capacity keys.
func newWindowRig(t *testing.T, capacity int) *rig {
	r := newRig(t, nil)
	r.window = idempotency.NewStore(capacity)
	var err error
	r.recv, err = store.NewReceiver(r.db, r.tracker, r.window, r.applier, &store.ReceiverOptions{Shard: 3})
	require.NoError(t, err)
	return r
}

// reopenedWindow is the window a receiver opening r's store rebuilds from
// its journal, least recently seen key first (as Store.Keys).
func (r *rig) reopenedWindow() []idempotency.Key {
	r.t.Helper()
	w := idempotency.NewStore(r.window.Capacity())
	_, err := store.NewReceiver(r.db, r.tracker, w, r.applier, &store.ReceiverOptions{Shard: 3})
	require.NoError(r.t, err)
	return w.Keys(nil)
}

// batch encodes events as the next batch of shard 3, epoch 5.
func (r *rig) batch(events ...wal.Event) []byte {
	return r.batchAt(3, 5, events...)
}

func (r *rig) batchAt(shard uint32, epoch uint64, events ...wal.Event) []byte {
	raw, err := wal.AppendBatch(nil, shard, epoch, r.nextLSN, events)
	require.NoError(r.t, err)
	r.nextLSN += uint64(len(events))
	return raw
}

func (r *rig) snapshot() map[string]string {
	s, err := testutil.SnapshotDB(r.db)
	require.NoError(r.t, err)
	return s
}

func (r *rig) counter(id session.ID, key string) int64 {
	v, ok, err := r.state.Get(id, []byte(key))
	require.NoError(r.t, err)
	if !ok || len(v) != 8 {
		return 0
	}
	return int64(binary.LittleEndian.Uint64(v))
}

func add(id session.ID, seq session.SeqNo, delta int64, key *idempotency.Key) wal.Event {
	ev := wal.Event{Op: wal.OpAdd, Session: id, Seq: seq, Time: t0 + int64(seq), Key: []byte("n"), Delta: delta}
	if key != nil {
		ev.HasIdemKey, ev.IdemKey = true, *key
	}
	return ev
}

func TestReceiverAppliesAndDiscardsRedelivery(t *testing.T) {
	r := newRig(t, nil)
	id := session.NewID()
	b1 := r.batch(add(id, 1, 10, nil), add(id, 2, 5, nil))
	res, err := r.recv.Apply(b1)
	require.NoError(t, err)
	require.Equal(t, 2, res.Applied)
	require.Equal(t, uint64(2), res.Ack.AppliedLSN)
	require.Equal(t, int64(15), r.counter(id, "n"))

	// The same batch again (transport duplicate): discarded by position.
	before := r.snapshot()
	res, err = r.recv.Apply(b1)
	require.NoError(t, err)
	require.Equal(t, 0, res.Applied)
	require.Equal(t, 2, res.Discarded)
	require.Equal(t, before, r.snapshot())

	// The same events re-logged at new LSNs: discarded by the HWM.
	res, err = r.recv.Apply(r.batch(add(id, 1, 10, nil), add(id, 2, 5, nil), add(id, 3, 1, nil)))
	require.NoError(t, err)
	require.Equal(t, 1, res.Applied)
	require.Equal(t, int64(16), r.counter(id, "n"))
	st := r.recv.Stats()
	require.Equal(t, uint64(2), st.DiscardedPosition)
	require.Equal(t, uint64(2), st.DiscardedHWM)
	require.Equal(t, st.Events, st.Accounted())
	// Every committed batch's commit is timed, nothing else.
	require.Equal(t, st.BatchesCommitted, st.CommitLatency.Count())
	require.Positive(t, st.CommitLatency.Sum)
}

func TestReceiverWindowDiscardAdvancesHWM(t *testing.T) {
	r := newRig(t, nil)
	id := session.NewID()
	k := idempotency.Key{1, 2, 3}
	_, err := r.recv.Apply(r.batch(add(id, 1, 7, &k)))
	require.NoError(t, err)
	// A client retry: same key, fresh SeqNo 2. The window discards it, but
	// SeqNo 2 is consumed, so SeqNo 3 is not a gap.
	res, err := r.recv.Apply(r.batch(add(id, 2, 7, &k), add(id, 3, 1, nil)))
	require.NoError(t, err)
	require.Equal(t, 1, res.Applied)
	require.Equal(t, int64(8), r.counter(id, "n"))
	hwm, _, _, err := r.tracker.Get(id)
	require.NoError(t, err)
	require.Equal(t, session.SeqNo(3), hwm)
	require.Equal(t, uint64(1), r.recv.Stats().DiscardedWindow)

	// In-batch duplicates of one key: only the first applies.
	k2 := idempotency.Key{9}
	res, err = r.recv.Apply(r.batch(add(id, 4, 100, &k2), add(id, 5, 100, &k2)))
	require.NoError(t, err)
	require.Equal(t, 1, res.Applied)
	require.Equal(t, int64(108), r.counter(id, "n"))
	require.Equal(t, uint64(1), r.recv.Stats().DiscardedInBatch)
}

func TestReceiverRefusalsLeaveNoTrace(t *testing.T) {
	r := newRig(t, nil)
	id := session.NewID()
	_, err := r.recv.Apply(r.batch(add(id, 1, 1, nil)))
	require.NoError(t, err)

	good := r.batch(add(id, 2, 1, nil))
	r.nextLSN-- // the cases below reuse LSN 2

	truncated := good[:len(good)-3]
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)-2] ^= 0x40
	huge := append([]byte(nil), good...)
	cases := []struct {
		name string
		raw  []byte
		want error
	}{
		{"truncated", truncated, wal.ErrTruncated},
		{"bit flip in body", flipped, wal.ErrChecksum},
		{"empty", nil, wal.ErrTruncated},
		{"wrong shard", r.batchAt(4, 5, add(id, 2, 1, nil)), replication.ErrWrongShard},
		{"stale epoch", func() []byte { r.nextLSN = 2; return r.batchAt(3, 4, add(id, 2, 1, nil)) }(), replication.ErrStaleEpoch},
		{"seq gap", func() []byte { r.nextLSN = 2; return r.batch(add(id, 2, 1, nil), add(id, 4, 1, nil)) }(), replication.ErrSeqGap},
		{"out of order", func() []byte { r.nextLSN = 9; return r.batch(add(id, 2, 1, nil)) }(), replication.ErrOutOfOrder},
	}
	_ = huge
	before := r.snapshot()
	for _, c := range cases {
		res, err := r.recv.Apply(c.raw)
		require.ErrorIs(t, err, c.want, c.name)
		require.True(t, res.Ack.Refused, c.name)
		require.Equal(t, uint64(1), res.Ack.AppliedLSN, c.name)
		require.Equal(t, before, r.snapshot(), "%s changed the store", c.name)
		lsn, epoch := r.recv.Position()
		require.Equal(t, uint64(1), lsn)
		require.Equal(t, uint64(5), epoch)
	}
	st := r.recv.Stats()
	require.Equal(t, st.Events, st.Accounted())

	// After all that, the real next batch applies.
	_, err = r.recv.Apply(good)
	require.NoError(t, err)
	require.Equal(t, int64(2), r.counter(id, "n"))
}

type failingApplier struct {
	inner store.Applier
	fail  bool
}

func (a *failingApplier) Apply(b *pebble.Batch, events []wal.Event) error {
	if err := a.inner.Apply(b, events); err != nil {
		return err
	}
	if a.fail {
		return errors.New("disk full in the embedder's state machine")
	}
	return nil
}

func TestReceiverApplierFailureLeavesNoTrace(t *testing.T) {
	var fa *failingApplier
	r := newRig(t, func(s *session.State) store.Applier {
		fa = &failingApplier{inner: store.SessionApplier{State: s}}
		return fa
	})
	id := session.NewID()
	k := idempotency.Key{7}
	_, err := r.recv.Apply(r.batch(add(id, 1, 1, nil)))
	require.NoError(t, err)

	fa.fail = true
	raw := r.batch(add(id, 2, 10, &k), add(id, 3, 10, nil))
	before := r.snapshot()
	res, err := r.recv.Apply(raw)
	require.ErrorIs(t, err, store.ErrApply)
	require.True(t, res.Ack.Refused)
	require.Equal(t, before, r.snapshot())
	require.False(t, r.window.Contains(k), "window recorded a key of a failed batch")
	hwm, _, _, err := r.tracker.Get(id)
	require.NoError(t, err)
	require.Equal(t, session.SeqNo(1), hwm, "HWM advanced for a failed batch")

	fa.fail = false
	res, err = r.recv.Apply(raw)
	require.NoError(t, err)
	require.Equal(t, 2, res.Applied)
	require.Equal(t, int64(21), r.counter(id, "n"))
	require.True(t, r.window.Contains(k))
}

func TestReceiverEpochFencing(t *testing.T) {
	r := newRig(t, nil)
	id := session.NewID()
	_, err := r.recv.Apply(r.batchAt(3, 7, add(id, 1, 1, nil)))
	require.NoError(t, err)
	_, epoch := r.recv.Position()
	require.Equal(t, uint64(7), epoch)
	// The deposed leader (epoch 6) is refused even for a fresh batch.
	_, err = r.recv.Apply(r.batchAt(3, 6, add(id, 2, 1, nil)))
	require.ErrorIs(t, err, replication.ErrStaleEpoch)
	r.nextLSN--
	_, err = r.recv.Apply(r.batchAt(3, 8, add(id, 2, 1, nil)))
	require.NoError(t, err)
	_, epoch = r.recv.Position()
	require.Equal(t, uint64(8), epoch)
	require.Equal(t, int64(2), r.counter(id, "n"))
}

// FuzzReceiver feeds arbitrary bytes to the receiver: it must never panic,
// and whatever it refuses must leave the store unchanged.
func FuzzReceiver(f *testing.F) {
	id := session.ID{1}
	for _, evs := range [][]wal.Event{
		{add(id, 1, 1, nil)},
		{add(id, 1, 1, &idempotency.Key{1}), add(id, 2, 3, &idempotency.Key{1})},
		{{Op: wal.OpPut, Session: id, Seq: 1, Key: []byte("k"), Value: []byte("v")}, {Op: wal.OpClose, Session: id, Seq: 2}},
	} {
		raw, err := wal.AppendBatch(nil, 3, 5, 1, evs)
		require.NoError(f, err)
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := newRig(t, nil)
		before := r.snapshot()
		res, err := r.recv.Apply(data)
		if err != nil {
			require.True(t, res.Ack.Refused)
			require.Equal(t, before, r.snapshot())
			return
		}
		st := r.recv.Stats()
		require.Equal(t, st.Events, st.Accounted())
	})
}

// TestWindowJournalRestoresWindow checks that a receiver opened on the same
// store rebuilds exactly the window the previous one had — same keys, same
// recency order — and that the journal stays bounded by the capacity.
func TestWindowJournalRestoresWindow(t *testing.T) {
	r := newWindowRig(t, 8)
	id := session.NewID()
	seq := session.SeqNo(1)
	for b := 0; b < 300; b++ {
		var evs []wal.Event
		for i := 0; i <= b%3; i++ { // 1–3 keyed events per batch
			k := idempotency.Key{byte(b), byte(i), 0xee}
			if b%5 == 0 && b > 0 {
				k = idempotency.Key{byte(b - 1), 0, 0xee} // a window hit refreshes recency
			}
			evs = append(evs, add(id, seq, 1, &k))
			seq++
		}
		_, err := r.recv.Apply(r.batch(evs...))
		require.NoError(t, err)
	}
	want := r.window.Keys(nil)
	require.Len(t, want, 8)

	require.Equal(t, want, r.reopenedWindow())

	_, n, err := store.JournalWindow(r.db, 8)
	require.NoError(t, err)
	require.LessOrEqual(t, n, 2*8+3, "journal not compacted: %d key records for a window of 8", n)
}

// TestWindowJournalRepeatedKeys is the review's counterexample to pruning the
// journal by key count: window hits record a key again, so a count-pruned
// journal rebuilt a window of 1 key where the live one held 3, and a retry of
// A would have applied again after a restart.
func TestWindowJournalRepeatedKeys(t *testing.T) {
	for _, capacity := range []int{3, 4, 7} {
		r := newWindowRig(t, capacity)
		id := session.NewID()
		seq := session.SeqNo(1)
		keys := []idempotency.Key{{0xa}, {0xb}, {0xc}}
		for i := 0; i < 40; i++ {
			k := keys[min(i, 2)] // A, B, then C over and over
			if i%13 == 12 {
				k = idempotency.Key{byte(i), 0xd} // now and then a new key
			}
			_, err := r.recv.Apply(r.batch(add(id, seq, 1, &k)))
			require.NoError(t, err)
			seq++
			require.Equal(t, r.window.Keys(nil), r.reopenedWindow(), "capacity %d after batch %d", capacity, i)
		}
	}
}

// TestWindowJournalPrunesEvictedEntries: with a full window of new keys, an
// entry is deleted once the window evicted Capacity keys after it, so the
// journal holds about one window and never needs the 2×Capacity snapshot;
// every prefix of the history still reopens into the live window.
func TestWindowJournalPrunesEvictedEntries(t *testing.T) {
	const capacity, maxBatch = 8, 3
	r := newWindowRig(t, capacity)
	id := session.NewID()
	seq := session.SeqNo(1)
	for b := 0; b < 200; b++ {
		var evs []wal.Event
		for i := 0; i < 1+b%maxBatch; i++ {
			k := idempotency.Key{byte(b), byte(b >> 8), byte(i), 0x77}
			evs = append(evs, add(id, seq, 1, &k))
			seq++
		}
		_, err := r.recv.Apply(r.batch(evs...))
		require.NoError(t, err)

		require.Equal(t, r.window.Keys(nil), r.reopenedWindow(), "after batch %d", b)
		_, n, err := store.JournalWindow(r.db, capacity)
		require.NoError(t, err)
		// Kept once the window is full: the oldest entry with fewer than
		// capacity evictions after it, what followed it (< capacity keys),
		// and the batch just written. A journal left to the snapshot grows
		// to 3×capacity first.
		if b >= 4*capacity {
			require.LessOrEqual(t, n, capacity-1+2*maxBatch, "after batch %d", b)
		}
	}
}

// TestWindowJournalPruningModel drives a receiver with seeded random
// batches of new keys and window hits (hits evict nothing, so they keep old
// entries alive and exercise the snapshot fallback too) and checks after
// every batch that a reopened window equals the live one.
func TestWindowJournalPruningModel(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		capacity := 2 + rng.IntN(10)
		r := newWindowRig(t, capacity)
		id := session.NewID()
		seq := session.SeqNo(1)
		var issued []idempotency.Key
		hitPct := rng.IntN(90)
		for b := 0; b < 150; b++ {
			var evs []wal.Event
			for i := rng.IntN(5); i > 0; i-- {
				var k idempotency.Key
				if len(issued) > 0 && rng.IntN(100) < hitPct {
					k = issued[len(issued)-1-rng.IntN(min(len(issued), 2*capacity))]
				} else {
					k = idempotency.Key{byte(len(issued)), byte(len(issued) >> 8), byte(seed), 0x55}
					issued = append(issued, k)
				}
				evs = append(evs, add(id, seq, 1, &k))
				seq++
			}
			if len(evs) == 0 {
				continue
			}
			_, err := r.recv.Apply(r.batch(evs...))
			require.NoError(t, err)
			require.Equal(t, r.window.Keys(nil), r.reopenedWindow(), "seed %d capacity %d hits %d%% after batch %d", seed, capacity, hitPct, b)
			_, n, err := store.JournalWindow(r.db, capacity)
			require.NoError(t, err)
			require.LessOrEqual(t, n, 3*capacity+4, "seed %d: journal unbounded", seed)
		}
	}
}

// TestReceiverRefusesDivergedHistory is the review's promotion scenario: this
// follower applied LSN 1–2 from the epoch-5 leader; the follower promoted at
// epoch 6 had only LSN 1 and wrote its own LSN 2. Skipping LSN 2 as a
// "duplicate" would keep the deposed leader's event and lose the new one.
func TestReceiverRefusesDivergedHistory(t *testing.T) {
	r := newRig(t, nil)
	id := session.NewID()
	_, err := r.recv.Apply(r.batchAt(3, 5, add(id, 1, 1, nil), add(id, 2, 1, nil)))
	require.NoError(t, err)
	before := r.snapshot()
	r.nextLSN = 2
	res, err := r.recv.Apply(r.batchAt(3, 6, add(id, 2, 100, nil), add(id, 3, 100, nil)))
	require.ErrorIs(t, err, replication.ErrDiverged)
	require.True(t, res.Ack.Refused)
	require.Equal(t, before, r.snapshot())
	// A newer epoch that starts right after the applied position is fine.
	r.nextLSN = 3
	_, err = r.recv.Apply(r.batchAt(3, 6, add(id, 3, 1, nil)))
	require.NoError(t, err)
	st := r.recv.Stats()
	require.Equal(t, st.Events, st.Accounted())
}

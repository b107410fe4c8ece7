package session

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

const hour = int64(time.Hour)

// memDB is testutil.MemDB under the name cache_test.go calls (that file is
// being edited on another branch); call testutil.MemDB in new code.
func memDB(t testing.TB) *pebble.DB { return testutil.MemDB(t) }

func openTracker(t *testing.T, db *pebble.DB, opts *TrackerOptions) *Tracker {
	t.Helper()
	tr, err := OpenTracker(db, opts)
	require.NoError(t, err)
	return tr
}

type ev struct {
	id  ID
	seq SeqNo
	ts  int64
}

// applyBatch runs the receiver protocol over events in one batch: Apply
// decisions advance, others are returned; the batch commits unless a Gap shows
// up (then it aborts).
func applyBatch(t *testing.T, db *pebble.DB, tr *Tracker, evs ...ev) []Decision {
	t.Helper()
	b := db.NewBatch()
	defer b.Close()
	tx := tr.Begin(b)
	var ds []Decision
	for _, e := range evs {
		d, err := tx.Check(e.id, e.seq, e.ts)
		require.NoError(t, err)
		ds = append(ds, d)
		if d == Gap {
			tx.Abort()
			return ds
		}
		if d == Apply {
			require.NoError(t, tx.Advance(e.id, e.seq, e.ts))
		}
	}
	require.NoError(t, tx.Flush())
	require.NoError(t, b.Commit(pebble.Sync))
	tx.Commit()
	return ds
}

func check(t *testing.T, tr *Tracker, db *pebble.DB, id ID, seq SeqNo, ts int64) Decision {
	t.Helper()
	b := db.NewBatch()
	defer b.Close()
	tx := tr.Begin(b)
	defer tx.Abort()
	d, err := tx.Check(id, seq, ts)
	require.NoError(t, err)
	return d
}

func requireHWM(t *testing.T, tr *Tracker, id ID, hwm SeqNo, closed bool) {
	t.Helper()
	h, c, found, err := tr.Get(id)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, hwm, h)
	require.Equal(t, closed, c)
}

func requireUnknown(t *testing.T, tr *Tracker, id ID) {
	t.Helper()
	_, _, found, err := tr.Get(id)
	require.NoError(t, err)
	require.False(t, found)
}

// modes runs f with the HWM log off (one row per changed session) and on,
// checkpointing every session one delta after its change (LogBatches 1), so
// rows trail the log by one batch; base supplies the other options.
func modes(t *testing.T, base TrackerOptions, f func(t *testing.T, opts *TrackerOptions)) {
	for _, m := range []struct {
		name       string
		logBatches int
	}{{"rows", -1}, {"log", 1}} {
		t.Run(m.name, func(t *testing.T) {
			o := base
			o.LogBatches = m.logBatches
			f(t, &o)
		})
	}
}

// storedRecord reads the committed record from the store the way a restart
// sees it: the row, or its newer logged change (ScanHWMs merges them).
func storedRecord(t *testing.T, db *pebble.DB, id ID) (record, bool) {
	t.Helper()
	var r record
	found := false
	require.NoError(t, ScanHWMs(db, func(got ID, hwm SeqNo, closed bool, lastTS int64) error {
		if got == id {
			r, found = record{hwm: hwm, lastTS: lastTS, closed: closed}, true
		}
		return nil
	}))
	return r, found
}

// diskRecord reads the row straight from Pebble.
func diskRecord(t *testing.T, db *pebble.DB, id ID) (record, bool) {
	t.Helper()
	var kb [hwmKeyLen]byte
	v, c, err := db.Get(hwmKey(&kb, id))
	if errors.Is(err, pebble.ErrNotFound) {
		return record{}, false
	}
	require.NoError(t, err)
	defer c.Close()
	r, err := decodeRecord(v)
	require.NoError(t, err)
	return r, true
}

func TestDecisions(t *testing.T) {
	db := testutil.MemDB(t)
	tr := openTracker(t, db, nil)
	a := NewID()
	base := 100 * hour

	// unknown session
	require.Equal(t, Apply, check(t, tr, db, a, 1, base))
	require.Equal(t, Gap, check(t, tr, db, a, 2, base))

	require.Equal(t, []Decision{Apply, Apply, Apply}, applyBatch(t, db, tr, ev{a, 1, base}, ev{a, 2, base + 1}, ev{a, 3, base + 2}))
	requireHWM(t, tr, a, 3, false)
	require.Equal(t, base+2, tr.Clock())

	require.Equal(t, Duplicate, check(t, tr, db, a, 1, base))
	require.Equal(t, Duplicate, check(t, tr, db, a, 3, base))
	require.Equal(t, Apply, check(t, tr, db, a, 4, base+3))
	require.Equal(t, Gap, check(t, tr, db, a, 5, base+3))
	require.Equal(t, Gap, check(t, tr, db, a, 1000, base+3))

	// close
	b := db.NewBatch()
	tx := tr.Begin(b)
	require.NoError(t, tx.Advance(a, 4, base+3))
	require.NoError(t, tx.MarkClosed(a, base+3))
	d, err := tx.Check(a, 5, base+4)
	require.NoError(t, err)
	require.Equal(t, Closed, d, "tx sees its own pending close")
	require.NoError(t, tx.Flush())
	require.NoError(t, b.Commit(pebble.Sync))
	tx.Commit()
	requireHWM(t, tr, a, 4, true)
	require.Equal(t, Closed, check(t, tr, db, a, 5, base+4))
	require.Equal(t, Closed, check(t, tr, db, a, 9, base+4))
	require.Equal(t, Duplicate, check(t, tr, db, a, 4, base+3), "closed session: applied events are duplicates")
	require.Equal(t, Duplicate, check(t, tr, db, a, 1, base))

	// too old: clock is base+3, horizon 24h
	old := NewID()
	require.Equal(t, TooOld, check(t, tr, db, old, 1, base+3-25*hour))
	require.Equal(t, TooOld, check(t, tr, db, old, 7, base+3-25*hour))
	require.Equal(t, Apply, check(t, tr, db, old, 1, base+3-24*hour), "exactly at the cutoff is not too old")
	// known sessions are judged by HWM, not timestamp
	require.Equal(t, Duplicate, check(t, tr, db, a, 2, 0))

	for _, d := range []Decision{Apply, Duplicate, Gap, Closed, TooOld, 0} {
		require.NotEmpty(t, d.String())
	}
	require.Equal(t, "too-old", TooOld.String())
}

func TestBadInput(t *testing.T) {
	db := testutil.MemDB(t)
	tr := openTracker(t, db, nil)
	a := NewID()
	base := 100 * hour
	applyBatch(t, db, tr, ev{a, 1, base}, ev{a, 2, base})

	b := db.NewBatch()
	defer b.Close()
	tx := tr.Begin(b)
	_, err := tx.Check(a, 0, base)
	require.ErrorIs(t, err, ErrZeroSeq)
	require.ErrorIs(t, tx.Advance(a, 0, base), ErrZeroSeq)
	require.ErrorIs(t, tx.Advance(a, 2, base), ErrNotNext, "duplicate advance")
	require.ErrorIs(t, tx.Advance(a, 4, base), ErrNotNext, "advance past a hole")
	require.ErrorIs(t, tx.Advance(NewID(), 2, base), ErrNotNext, "unknown session must start at 1")
	require.ErrorIs(t, tx.Advance(NewID(), 1, base-25*hour), ErrTooOld)
	require.ErrorIs(t, tx.MarkClosed(NewID(), base), ErrUnknownSession)
	require.NoError(t, tx.Flush())
	require.True(t, b.Empty(), "refused input writes nothing")
	require.NoError(t, tx.MarkClosed(a, base))
	require.ErrorIs(t, tx.Advance(a, 3, base), ErrSessionClosed)
	tx.Abort()
	_, err = tx.Check(a, 3, base)
	require.ErrorIs(t, err, ErrTxDone)
	require.ErrorIs(t, tx.Advance(a, 3, base), ErrTxDone)
	require.ErrorIs(t, tx.Flush(), ErrTxDone)
	require.ErrorIs(t, tx.PeekAll([]ID{a}, make([]HWM, 1)), ErrTxDone)
	tx.Commit() // no-op after Abort
	requireHWM(t, tr, a, 2, false)

	nb := tr.Begin(nil)
	_, err = nb.Check(a, 3, base)
	require.ErrorIs(t, err, ErrNilBatch)
	require.ErrorIs(t, nb.Advance(a, 3, base), ErrNilBatch)

	_, err = OpenTracker(nil, nil)
	require.ErrorIs(t, err, ErrNilDB)
}

func TestManyEventsOfOneSessionInOneTx(t *testing.T) {
	modes(t, TrackerOptions{}, testManyEventsOfOneSessionInOneTx)
}

func testManyEventsOfOneSessionInOneTx(t *testing.T, opts *TrackerOptions) {
	db := testutil.MemDB(t)
	tr := openTracker(t, db, opts)
	a, c := NewID(), NewID()
	base := 100 * hour
	ds := applyBatch(t, db, tr,
		ev{a, 1, base}, ev{c, 1, base}, ev{a, 2, base + 1}, ev{a, 2, base + 1}, // in-batch duplicate
		ev{a, 1, base}, ev{c, 2, base + 2}, ev{a, 3, base + 3})
	require.Equal(t, []Decision{Apply, Apply, Apply, Duplicate, Duplicate, Apply, Apply}, ds)
	requireHWM(t, tr, a, 3, false)
	requireHWM(t, tr, c, 2, false)

	// in-batch gap: seq 5 after 4 pending is fine, 7 is a gap
	b := db.NewBatch()
	defer b.Close()
	tx := tr.Begin(b)
	require.NoError(t, tx.Advance(a, 4, base+4))
	d, err := tx.Check(a, 5, base+5)
	require.NoError(t, err)
	require.Equal(t, Apply, d)
	require.NoError(t, tx.Advance(a, 5, base+5))
	d, err = tx.Check(a, 7, base+5)
	require.NoError(t, err)
	require.Equal(t, Gap, d)
	require.Equal(t, base+5, tx.Clock(), "tx sees its pending clock")
	require.Equal(t, base+3, tr.Clock())

	// one Set per session per flush (+ clock); with the log one delta
	// holding a and c (c, logged one delta ago, is carried forward into it
	// instead of rewriting its row; a's logged change is superseded by this
	// tx) (+ clock) and the deletion of the delta that held them
	want := uint32(2)
	if opts.LogBatches > 0 {
		want = 3
	}
	require.NoError(t, tx.Flush())
	require.Equal(t, want, b.Count())
	require.NoError(t, tx.Flush())
	require.Equal(t, want, b.Count(), "second flush with nothing new writes nothing")
	require.NoError(t, b.Commit(pebble.Sync))
	tx.Commit()
	requireHWM(t, tr, a, 5, false)
	r, ok := storedRecord(t, db, a)
	require.True(t, ok)
	require.Equal(t, record{hwm: 5, lastTS: base + 5}, r)
}

func TestPersistenceAcrossReopen(t *testing.T) {
	for _, logBatches := range []int{-1, 0} {
		testPersistenceAcrossReopen(t, &TrackerOptions{LogBatches: logBatches})
	}
}

func testPersistenceAcrossReopen(t *testing.T, opts *TrackerOptions) {
	fs := vfs.NewMem()
	db := testutil.OpenDB(t, fs, "db")
	tr := openTracker(t, db, opts)
	a, c := NewID(), NewID()
	base := 100 * hour
	applyBatch(t, db, tr, ev{a, 1, base}, ev{a, 2, base + 1}, ev{c, 1, base + 7})
	b := db.NewBatch()
	tx := tr.Begin(b)
	require.NoError(t, tx.MarkClosed(c, base+8))
	require.NoError(t, tx.Flush())
	require.NoError(t, b.Commit(pebble.Sync))
	tx.Commit()
	require.NoError(t, db.Close())

	db = testutil.OpenDB(t, fs, "db")
	defer db.Close()
	tr = openTracker(t, db, opts)
	require.Equal(t, base+8, tr.Clock())
	if opts.LogBatches < 0 {
		require.Zero(t, tr.CachedLen(), "HWMs are read lazily")
	} else {
		require.Equal(t, 2, tr.CachedLen(), "the replayed log pins its sessions")
	}
	requireHWM(t, tr, a, 2, false)
	requireHWM(t, tr, c, 1, true)
	require.Equal(t, Duplicate, check(t, tr, db, a, 2, base))
	require.Equal(t, Apply, check(t, tr, db, a, 3, base+9))
	require.Equal(t, Closed, check(t, tr, db, c, 2, base+9))
	require.Equal(t, TooOld, check(t, tr, db, NewID(), 1, base+8-24*hour-1), "restored clock drives too-old")
}

func TestFailedBatchLeavesNoTrace(t *testing.T) {
	modes(t, TrackerOptions{}, testFailedBatchLeavesNoTrace)
}

func testFailedBatchLeavesNoTrace(t *testing.T, opts *TrackerOptions) {
	fs := vfs.NewMem()
	db := testutil.OpenDB(t, fs, "db")
	tr := openTracker(t, db, opts)
	a, n := NewID(), NewID()
	base := 100 * hour
	applyBatch(t, db, tr, ev{a, 1, base})

	for _, how := range []string{"abort", "never-committed", "gc-abort"} {
		b := db.NewBatch()
		tx := tr.Begin(b)
		require.NoError(t, tx.Advance(a, 2, base+hour))
		require.NoError(t, tx.Advance(n, 1, base+hour))
		require.NoError(t, tx.MarkClosed(n, base+hour))
		if how == "gc-abort" {
			require.NoError(t, tx.Advance(NewID(), 1, base+30*hour))
			got, err := tx.CollectGarbage(0)
			require.NoError(t, err)
			require.Equal(t, 1, got, "a is expired in the tx's view")
		}
		require.NoError(t, tx.Flush())
		// The batch is dropped (commit failed or the caller gave up).
		require.NoError(t, b.Close())
		if how != "never-committed" {
			tx.Abort()
		}
		requireHWM(t, tr, a, 1, false)
		requireUnknown(t, tr, n)
		require.Equal(t, base, tr.Clock())
		r, ok := storedRecord(t, db, a)
		require.True(t, ok)
		require.Equal(t, SeqNo(1), r.hwm)
		_, ok = storedRecord(t, db, n)
		require.False(t, ok)
		require.Equal(t, Apply, check(t, tr, db, a, 2, base+hour))
		require.Equal(t, Apply, check(t, tr, db, n, 1, base+hour))
	}

	require.NoError(t, db.Close())
	db = testutil.OpenDB(t, fs, "db")
	defer db.Close()
	tr = openTracker(t, db, opts)
	require.Equal(t, base, tr.Clock())
	requireHWM(t, tr, a, 1, false)
	requireUnknown(t, tr, n)
}

func TestCommitWithoutFlushPublishesNothingUnwritten(t *testing.T) {
	modes(t, TrackerOptions{}, testCommitWithoutFlushPublishesNothingUnwritten)
}

func testCommitWithoutFlushPublishesNothingUnwritten(t *testing.T, opts *TrackerOptions) {
	db := testutil.MemDB(t)
	tr := openTracker(t, db, opts)
	a := NewID()
	base := 100 * hour
	applyBatch(t, db, tr, ev{a, 1, base})

	b := db.NewBatch()
	defer b.Close()
	tx := tr.Begin(b)
	require.NoError(t, tx.Advance(a, 2, base+1))
	require.NoError(t, tx.Flush())
	require.NoError(t, tx.Advance(a, 3, base+2)) // misuse: never flushed
	require.NoError(t, b.Commit(pebble.Sync))
	tx.Commit()
	// memory agrees with disk: 2, not 3
	requireHWM(t, tr, a, 2, false)
	require.Equal(t, Apply, check(t, tr, db, a, 3, base+2))
	require.Equal(t, base+1, tr.Clock())
}

// TestCacheEvictionFallsBackToPebble bounds the cache with the log off (with
// it on, logged sessions are pinned beyond CacheSize; the model test covers
// tiny caches with the log).
func TestCacheEvictionFallsBackToPebble(t *testing.T) {
	db := testutil.MemDB(t)
	tr := openTracker(t, db, &TrackerOptions{CacheSize: 2, LogBatches: -1})
	base := 100 * hour
	ids := make([]ID, 10)
	for i := range ids {
		ids[i] = NewID()
		applyBatch(t, db, tr, ev{ids[i], 1, base}, ev{ids[i], 2, base})
	}
	require.Equal(t, 2, tr.CachedLen())
	for round := SeqNo(3); round < 6; round++ {
		for _, id := range ids {
			require.Equal(t, Duplicate, check(t, tr, db, id, round-1, base))
			require.Equal(t, Gap, check(t, tr, db, id, round+1, base))
			require.Equal(t, []Decision{Apply}, applyBatch(t, db, tr, ev{id, round, base}))
			requireHWM(t, tr, id, round, false)
		}
	}
	require.LessOrEqual(t, tr.CachedLen(), 2)
	// many sessions in one tx with a tiny cache: the tx's own view keeps them
	var evs []ev
	for _, id := range ids {
		evs = append(evs, ev{id, 6, base})
	}
	for _, id := range ids {
		evs = append(evs, ev{id, 7, base}, ev{id, 6, base})
	}
	ds := applyBatch(t, db, tr, evs...)
	for i, d := range ds {
		if i >= len(ids) && (i-len(ids))%2 == 1 {
			require.Equal(t, Duplicate, d)
		} else {
			require.Equal(t, Apply, d)
		}
	}
	for _, id := range ids {
		requireHWM(t, tr, id, 7, false)
	}
	// The fills of a tx evict, but only committed records: pending advances
	// stay in the tx, never in the cache, and an abort leaves none behind.
	b := db.NewBatch()
	defer b.Close()
	tx := tr.Begin(b)
	for _, id := range ids {
		require.NoError(t, tx.Advance(id, 8, base))
		_, recs := checkCache(t, tr.cache)
		for _, r := range recs {
			require.Equal(t, SeqNo(7), r.hwm, "an uncommitted advance reached the cache")
		}
	}
	for _, id := range ids {
		require.Equal(t, Duplicate, mustCheck(t, tx, id, 8, base), "the tx lost a pending advance to eviction")
	}
	tx.Abort()
	_, recs := checkCache(t, tr.cache)
	require.Len(t, recs, 2)
	for _, r := range recs {
		require.Equal(t, SeqNo(7), r.hwm)
	}
}

func mustCheck(t *testing.T, tx *TrackerTx, id ID, seq SeqNo, ts int64) Decision {
	t.Helper()
	d, err := tx.Check(id, seq, ts)
	require.NoError(t, err)
	return d
}

func TestGCOnWALClock(t *testing.T) {
	modes(t, TrackerOptions{RetentionHorizon: 10 * time.Hour}, testGCOnWALClock)
}

// testGCOnWALClock: with LogBatches 1, each batch checkpoints the previous
// one's sessions, so the rows GC examines are those of all but the last
// batch; the sessions it expects to collect have rows by then.
func testGCOnWALClock(t *testing.T, opts *TrackerOptions) {
	db := testutil.MemDB(t)
	tr := openTracker(t, db, opts)
	// Timestamps far in the past relative to the machine's clock: if GC used the
	// follower's wall clock, everything would be collected at once.
	base := int64(1000) * hour
	idle, closed, busy, closedRecent := NewID(), NewID(), NewID(), NewID()
	applyBatch(t, db, tr, ev{idle, 1, base}, ev{closed, 1, base}, ev{busy, 1, base}, ev{closedRecent, 1, base + 5*hour})
	b := db.NewBatch()
	tx := tr.Begin(b)
	require.NoError(t, tx.MarkClosed(closed, base+hour))
	require.NoError(t, tx.MarkClosed(closedRecent, base+5*hour))
	n, err := tx.CollectGarbage(0)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is idle on the WAL clock yet; the wall clock is far ahead and must not matter")
	require.NoError(t, tx.Flush())
	require.NoError(t, b.Commit(pebble.Sync))
	tx.Commit()
	b.Close()

	// WAL clock moves to base+11.5h through busy's events.
	applyBatch(t, db, tr, ev{busy, 2, base + 9*hour}, ev{busy, 3, base + 11*hour + hour/2})
	// cutoff = base+1.5h: idle (lastTS base) and closed (base+1h) expire;
	// closedRecent (base+5h) and busy stay.
	require.Equal(t, TooOld, check(t, tr, db, idle, 1, base), "expired counts as unknown even before GC")
	require.Equal(t, Gap, check(t, tr, db, idle, 2, base+11*hour), "an expired session does not resume")
	requireHWM(t, tr, idle, 1, false) // row still there

	b = db.NewBatch()
	tx = tr.Begin(b)
	n, err = tx.CollectGarbage(0)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	requireHWM(t, tr, idle, 1, false) // not before commit
	require.NoError(t, tx.Flush())
	require.NoError(t, b.Commit(pebble.Sync))
	tx.Commit()
	b.Close()
	requireUnknown(t, tr, idle)
	requireUnknown(t, tr, closed)
	requireHWM(t, tr, closedRecent, 1, true)
	requireHWM(t, tr, busy, 3, false)
	_, ok := diskRecord(t, db, idle)
	require.False(t, ok)

	// Redelivery of a collected session's events is refused as too old.
	require.Equal(t, TooOld, check(t, tr, db, idle, 1, base))
	require.Equal(t, TooOld, check(t, tr, db, closed, 1, base+hour))
	require.Equal(t, Duplicate, check(t, tr, db, closedRecent, 1, base+5*hour))
	require.Equal(t, Closed, check(t, tr, db, closedRecent, 2, base+5*hour))
	// The clock row survives GC.
	require.Equal(t, base+11*hour+hour/2, tr.Clock())
}

func TestGCLimitResumesAndWraps(t *testing.T) {
	modes(t, TrackerOptions{RetentionHorizon: time.Hour}, testGCLimitResumesAndWraps)
}

func testGCLimitResumesAndWraps(t *testing.T, opts *TrackerOptions) {
	db := testutil.MemDB(t)
	tr := openTracker(t, db, opts)
	base := 100 * hour
	var evs []ev
	for range 25 {
		evs = append(evs, ev{NewID(), 1, base})
	}
	applyBatch(t, db, tr, evs...)
	fresh := NewID()
	applyBatch(t, db, tr, ev{fresh, 1, base + 2*hour})

	total := 0
	for i := 0; i < 4; i++ {
		b := db.NewBatch()
		tx := tr.Begin(b)
		n, err := tx.CollectGarbage(7)
		require.NoError(t, err)
		require.LessOrEqual(t, n, 7)
		total += n
		require.NoError(t, tx.Flush())
		require.NoError(t, b.Commit(pebble.Sync))
		tx.Commit()
		b.Close()
	}
	require.Equal(t, 25, total)
	requireHWM(t, tr, fresh, 1, false)

	// An aborted GC does not move the cursor; a later full pass finds nothing.
	b := db.NewBatch()
	tx := tr.Begin(b)
	n, err := tx.CollectGarbage(0)
	require.NoError(t, err)
	require.Zero(t, n)
	tx.Abort()
	b.Close()
}

func TestGCInSameTxAsEvents(t *testing.T) {
	modes(t, TrackerOptions{RetentionHorizon: time.Hour}, testGCInSameTxAsEvents)
}

func testGCInSameTxAsEvents(t *testing.T, opts *TrackerOptions) {
	db := testutil.MemDB(t)
	tr := openTracker(t, db, opts)
	base := 100 * hour
	a, c := NewID(), NewID()
	applyBatch(t, db, tr, ev{a, 1, base}, ev{c, 1, base})
	b := db.NewBatch()
	defer b.Close()
	tx := tr.Begin(b)
	// c is advanced in this tx before GC; the WAL clock jumps so a expires.
	require.NoError(t, tx.Advance(c, 2, base+2*hour))
	n, err := tx.CollectGarbage(0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	d, err := tx.Check(a, 2, base+2*hour)
	require.NoError(t, err)
	require.Equal(t, Gap, d)
	d, err = tx.Check(a, 1, base)
	require.NoError(t, err)
	require.Equal(t, TooOld, d)
	// a restarts as a new session (seq 1) within the same tx
	require.NoError(t, tx.Advance(a, 1, base+2*hour))
	require.NoError(t, tx.Flush())
	require.NoError(t, b.Commit(pebble.Sync))
	tx.Commit()
	requireHWM(t, tr, a, 1, false)
	requireHWM(t, tr, c, 2, false)
	r, ok := storedRecord(t, db, a)
	require.True(t, ok)
	require.Equal(t, base+2*hour, r.lastTS)
}

func TestOptionsDefaults(t *testing.T) {
	o := (*TrackerOptions)(nil).EnsureDefaults()
	require.Equal(t, DefaultCacheSize, o.CacheSize)
	require.Equal(t, DefaultRetentionHorizon, o.RetentionHorizon)
	// Negative values are not defaulted: Validate refuses them.
	o = (&TrackerOptions{CacheSize: -1, RetentionHorizon: -time.Second}).EnsureDefaults()
	require.Equal(t, -1, o.CacheSize)
	require.ErrorIs(t, o.Validate(), ErrBadOptions)
	tr := openTracker(t, testutil.MemDB(t), &TrackerOptions{CacheSize: 5})
	require.Equal(t, 5, tr.Options().CacheSize)
	require.Equal(t, 24*time.Hour, tr.Options().RetentionHorizon)
}

func TestCorruptRecords(t *testing.T) {
	db := testutil.MemDB(t)
	a := NewID()
	var kb [hwmKeyLen]byte
	require.NoError(t, db.Set(hwmKey(&kb, a), []byte{2, 1, 2}, pebble.Sync))
	tr := openTracker(t, db, nil)
	_, _, _, err := tr.Get(a)
	require.ErrorIs(t, err, ErrCorrupt)
	b := db.NewBatch()
	defer b.Close()
	tx := tr.Begin(b)
	_, err = tx.Check(a, 1, 0)
	require.ErrorIs(t, err, ErrCorrupt)
	tx.Abort()

	require.NoError(t, db.Set([]byte(ClockKey), []byte{1, 2}, pebble.Sync))
	_, err = OpenTracker(db, nil)
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestIDs(t *testing.T) {
	a, c := NewID(), NewID()
	require.NotEqual(t, a, c)
	require.Len(t, a.String(), 32)
	p, err := ParseID(a.String())
	require.NoError(t, err)
	require.Equal(t, a, p)
	p, err = ParseID(string(bytes.ToUpper([]byte(a.String()))))
	require.NoError(t, err)
	require.Equal(t, a, p)
	for _, bad := range []string{"", "00", a.String() + "0", a.String()[:31] + "g", " " + a.String()[1:]} {
		_, err := ParseID(bad)
		require.ErrorIs(t, err, ErrBadID, bad)
	}
	require.Equal(t, "000102030405060708090a0b0c0d0e0f", ID{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}.String())
}

// An unchanged logged session is carried forward into newer deltas
// maxCarries times, then checkpointed as its row; a change resets the
// count. Every step survives a reopen (the replay sees the carried entry).
func TestLogCarriesForwardThenCheckpoints(t *testing.T) {
	fs := vfs.NewMem()
	db := testutil.OpenDB(t, fs, "db")
	opts := &TrackerOptions{LogBatches: 1}
	tr := openTracker(t, db, opts)
	x, y := NewID(), NewID()
	base := 100 * hour
	applyBatch(t, db, tr, ev{x, 1, base})
	step := func(seq SeqNo) {
		applyBatch(t, db, tr, ev{y, seq, base + int64(seq)})
	}
	for n := 1; n <= maxCarries; n++ {
		step(SeqNo(n))
		_, row := diskRecord(t, db, x)
		require.False(t, row, "carry %d: x must be carried in the log, not written as a row", n)
		r, ok := storedRecord(t, db, x)
		require.True(t, ok)
		require.Equal(t, record{hwm: 1, lastTS: base}, r)
	}
	step(maxCarries + 1)
	r, row := diskRecord(t, db, x)
	require.True(t, row, "after %d carries x's row is rewritten", maxCarries)
	require.Equal(t, record{hwm: 1, lastTS: base}, r)

	// A change resets the count: x is carried again, not rewritten.
	applyBatch(t, db, tr, ev{x, 2, base + 10})
	step(maxCarries + 2)
	r, _ = diskRecord(t, db, x)
	require.Equal(t, SeqNo(1), r.hwm, "the row is stale; the log holds x's change")
	requireHWM(t, tr, x, 2, false)

	// A reopen replays the carried entries: nothing is lost, nothing older
	// comes back, and the log holds at most LogBatches+1 deltas.
	require.NoError(t, db.Close())
	db = testutil.OpenDB(t, fs, "db")
	defer db.Close()
	tr = openTracker(t, db, opts)
	requireHWM(t, tr, x, 2, false)
	requireHWM(t, tr, y, maxCarries+2, false)
	require.LessOrEqual(t, tr.logNext-tr.logFirst, uint64(opts.LogBatches+1))
}

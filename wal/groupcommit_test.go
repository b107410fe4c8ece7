package wal

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// TestGroupCommitCrashImages: batches written by a group of appenders and
// not yet synced can reach the disk with holes — a damaged batch followed by
// an intact later one of the same group. Every such crash image reopens
// with every synced batch and a contiguous run of the group, cut at its
// first damaged batch (before MaxUnsyncedBytes, recovery refused these
// images as corrupt).
func TestGroupCommitCrashImages(t *testing.T) {
	for _, za := range crashZeroAhead {
		t.Run(fmt.Sprintf("zeroahead=%d", za), func(t *testing.T) { groupCommitCrashImages(t, za) })
	}
}

func groupCommitCrashImages(t *testing.T, zeroAhead int64) {
	holes := 0
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		mem := vfs.NewCrashableMem()
		w, err := OpenWriter(crashDir, &WriterOptions{FS: mem, ZeroAhead: zeroAhead, SegmentSize: 6 << 10})
		require.NoError(t, err)
		var all []Header
		for i := range 3 {
			h, err := w.Append(1, crashBatch(i))
			require.NoError(t, err)
			all = append(all, h)
		}
		synced := len(all)
		w.opts.SegmentSize = DefaultSegmentSize // the group's writes stay in the last segment
		for i := range 2 + rng.IntN(8) {        // one group's writes, never synced
			h, _, err := w.Write(nil, 1, crashBatch(100+i))
			require.NoError(t, err)
			all = append(all, h)
		}
		img := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 20 + rng.IntN(70), RNG: rng})
		require.NoError(t, w.Close())

		var buf []byte
		scan, err := scanLog(img, crashDir, 0, &buf)
		require.NoError(t, err, "seed %d: the image is a torn tail, not corruption", seed)
		if scan.torn && hasIntactLater(t, img, scan, all) {
			holes++
		}
		st := crashState{acked: all[:synced]}
		checkCrashImage(t, img, st, all, zeroAhead, fmt.Sprintf("seed %d", seed))
	}
	require.Positive(t, holes, "some image must have an intact batch after a damaged one")
}

// hasIntactLater reports whether the bytes cut from scan's last segment
// hold an intact batch of the log after the damaged one.
func hasIntactLater(t *testing.T, fs vfs.FS, scan logScan, all []Header) bool {
	last := scan.segs[len(scan.segs)-1]
	f, err := fs.Open(fs.PathJoin(crashDir, last.name))
	require.NoError(t, err)
	defer f.Close()
	end, err := DataEnd(f, scan.lastSize)
	require.NoError(t, err)
	b := make([]byte, max(0, end-last.size))
	_, err = f.ReadAt(b, last.size)
	require.NoError(t, err)
	for i := 1; i+HeaderSize <= len(b); i++ {
		h, err := DecodeHeader(b[i:])
		if err != nil || h.FirstLSN <= scan.next || i+h.Size() > len(b) {
			continue
		}
		if _, err := checkBody(h, b[i:]); err == nil {
			return true
		}
	}
	return false
}

// TestGroupCommitSharesSync: appenders that write while a sync is in flight
// wait for it, and the next sync covers all of them: three appends, two
// fdatasyncs; none returns before the sync that covers it.
func TestGroupCommitSharesSync(t *testing.T) {
	gate := &testutil.SyncGate{}
	w, err := OpenWriter("/wal", &WriterOptions{FS: errorfs.Wrap(vfs.NewMem(), gate)})
	require.NoError(t, err)
	syncs0 := gate.Syncs() // a fresh log's segment is created without a data sync; be exact anyway
	var done atomic.Int64
	var wg sync.WaitGroup
	appendOne := func(i int) {
		defer wg.Done()
		_, err := w.Append(1, testEvents(3, i))
		require.NoError(t, err)
		done.Add(1)
	}
	first := gate.Hold(nil)
	wg.Add(1)
	go appendOne(1)
	first.Wait() // the first append's sync is in flight
	second := gate.Hold(nil)
	wg.Add(2)
	go appendOne(2)
	go appendOne(3)
	for w.NextLSN() != 10 { // both others wrote and wait for a sync
		runtime.Gosched()
	}
	require.Zero(t, done.Load(), "nothing returns before its sync")
	first.Release() // first sync ends: covers only batch 1
	second.Wait()   // one sync for batches 2 and 3
	second.Release()
	wg.Wait()
	require.EqualValues(t, 2, gate.Syncs()-syncs0)
	require.EqualValues(t, 2, w.Syncs(), "the Writer counts the syncs the file saw")
	require.EqualValues(t, 3, w.Batches())
	require.EqualValues(t, 9, w.DurableLSN())
	require.NoError(t, w.Close())
}

// TestGroupCommitSyncFailure: a failed shared sync fails every batch it was
// to cover and every later call, with the same ErrWriterFailed error.
func TestGroupCommitSyncFailure(t *testing.T) {
	var fail atomic.Bool
	injected := errors.New("injected sync failure")
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if fail.Load() && op.Kind == errorfs.OpFileSyncData {
			return injected
		}
		return nil
	}))
	w, err := OpenWriter("/wal", &WriterOptions{FS: fs})
	require.NoError(t, err)
	h0, err := w.Append(1, testEvents(2, 1))
	require.NoError(t, err)
	fail.Store(true)
	var hs []Header
	for i := range 4 {
		h, _, err := w.Write(nil, 1, testEvents(2, 2+i))
		require.NoError(t, err)
		hs = append(hs, h)
	}
	for _, h := range hs {
		err := w.SyncTo(h.LastLSN())
		require.ErrorIs(t, err, ErrWriterFailed)
		require.ErrorIs(t, err, injected)
	}
	require.NoError(t, w.SyncTo(h0.LastLSN()), "what an earlier sync covered stays durable")
	require.Equal(t, h0.LastLSN(), w.DurableLSN())
	_, err = w.Append(1, testEvents(2, 9))
	require.ErrorIs(t, err, ErrWriterFailed)
	require.ErrorIs(t, w.Close(), ErrWriterFailed)
}

// TestWriteBoundsUnsyncedBytes: under SyncEveryBatch the Writer never lets
// unsynced batches add up past MaxUnsyncedBytes — the bound the recovery of
// a group's torn tail relies on — and syncs first instead.
func TestWriteBoundsUnsyncedBytes(t *testing.T) {
	w, err := OpenWriter("/wal", &WriterOptions{FS: vfs.NewMem()})
	require.NoError(t, err)
	big := testEvents(1, 1)
	big[0].Value = make([]byte, 300<<10)
	var written int64
	for range 10 {
		h, buf, err := w.Write(nil, 1, big)
		require.NoError(t, err)
		written += int64(len(buf))
		durableEnd := w.DurableLSN()
		unsynced := int64(h.LastLSN()-durableEnd) * int64(len(buf)) // equal batches
		require.LessOrEqual(t, unsynced, int64(MaxUnsyncedBytes), "after %d bytes", written)
	}
	require.Positive(t, w.DurableLSN(), "the bound made the Writer sync")
	require.NoError(t, w.Close())
}

// TestSyncCounts: one append at a time, each synced on its own: Syncs
// equals Batches; a segment roll syncs the old segment too.
func TestSyncCounts(t *testing.T) {
	w, err := OpenWriter("/wal", &WriterOptions{FS: vfs.NewMem()})
	require.NoError(t, err)
	for i := range 5 {
		_, err := w.Append(1, testEvents(2, i))
		require.NoError(t, err)
	}
	require.EqualValues(t, 5, w.Batches())
	require.EqualValues(t, 5, w.Syncs())
	require.NoError(t, w.Close())

	w, err = OpenWriter("/rolled", &WriterOptions{FS: vfs.NewMem(), SegmentSize: 1})
	require.NoError(t, err)
	for i := range 3 {
		_, err := w.Append(1, testEvents(2, i))
		require.NoError(t, err)
	}
	require.EqualValues(t, 3, w.Batches())
	require.EqualValues(t, 5, w.Syncs(), "3 appends and the 2 rolls before the second and third")
	require.NoError(t, w.Close())
}

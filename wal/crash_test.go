package wal

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

const crashDir = "/data/wal"

// crashBatch is batch i of the crash workload: puts with random values, so
// that no sector is zero by chance, of sizes from ~100 B to ~9 KiB, so that
// batches straddle the MemFS's 4 KiB crash blocks.
func crashBatch(i int) []Event {
	rng := rand.New(rand.NewPCG(uint64(i), 99))
	n := 1 + rng.IntN(12)
	if i%5 == 3 {
		n = 20 + rng.IntN(20)
	}
	evs := make([]Event, n)
	for j := range evs {
		v := make([]byte, 10+rng.IntN(300))
		for k := range v {
			v[k] = byte(1 + rng.IntN(255))
		}
		evs[j] = Event{Op: OpPut, Key: []byte(fmt.Sprintf("k%d-%d", i, j)), Value: v}
	}
	return evs
}

// crashState is what the workload had done when the crash hit.
type crashState struct {
	acked []Header // batches whose Append returned nil, in order
	floor uint64   // lsn of the last DeleteBelow started (0: none)
}

const crashBatches = 40

// crashZeroAhead are the WriterOptions.ZeroAhead the crash sweep runs
// with: files that grow with each append, zeros written a little ahead
// (several fills per segment) and zeros up to the segment size.
var crashZeroAhead = []int64{-1, 2 << 10, DefaultZeroAhead}

// crashWorkload appends crashBatches batches with SyncEveryBatch and small
// segments, deletes old segments every 8 batches and closes and reopens the
// Writer halfway. It stops at the first error (the injected crash). st is
// updated as it goes, so that the injector can copy it at the crash.
func crashWorkload(fs vfs.FS, zeroAhead int64, st *crashState) error {
	opts := &WriterOptions{FS: fs, SegmentSize: 6 << 10, ZeroAhead: zeroAhead}
	w, err := OpenWriter(crashDir, opts)
	if err != nil {
		return err
	}
	for i := 0; i < crashBatches; i++ {
		if i == crashBatches/2 {
			if err := w.Close(); err != nil {
				return err
			}
			if w, err = OpenWriter(crashDir, opts); err != nil {
				return err
			}
		}
		if i > 0 && i%8 == 0 {
			st.floor = st.acked[len(st.acked)-4].FirstLSN
			if _, err := w.DeleteBelow(st.floor); err != nil {
				return err
			}
		}
		h, err := w.Append(1, crashBatch(i))
		if err != nil {
			return err
		}
		st.acked = append(st.acked, h)
	}
	return w.Close()
}

// crashAt runs the workload on a fresh crashable MemFS and returns the
// filesystem as a crash before FS operation k would leave it (nil if the
// workload has fewer operations), with the workload's state at that moment.
func crashAt(k int64, zeroAhead int64, cfg vfs.CrashCloneCfg) (*vfs.MemFS, crashState) {
	var st, atCrash crashState
	fs := testutil.NewCrashFS(vfs.NewCrashableMem(), testutil.CrashOptions{At: int(k), Clone: cfg, OnCrash: func() {
		atCrash = crashState{acked: append([]Header(nil), st.acked...), floor: st.floor}
	}})
	_ = crashWorkload(fs, zeroAhead, &st)
	return fs.Image(), atCrash
}

// checkCrashImage opens the log in a crash image and checks the torn-tail
// rule: it opens; what it holds is a contiguous run of the batches the
// workload wrote (all: the uncrashed run's headers), byte-identical by
// header; it holds every acknowledged batch not below the retention floor;
// the Writer continues after the last batch it holds.
func checkCrashImage(t *testing.T, fs vfs.FS, st crashState, all []Header, zeroAhead int64, what string) (torn bool) {
	t.Helper()
	var buf []byte
	if scan, err := scanLog(fs, crashDir, 0, &buf); err == nil {
		torn = scan.torn
	}
	w, err := OpenWriter(crashDir, &WriterOptions{FS: fs, SegmentSize: 6 << 10, ZeroAhead: zeroAhead})
	require.NoError(t, err, "%s: reopen", what)
	got := readAllFS(t, fs, what)
	if len(got) > 0 {
		i := 0
		for all[i].FirstLSN != got[0].FirstLSN {
			i++
		}
		require.Equal(t, all[i:i+len(got)], got, "%s: a contiguous run of what was written", what)
		require.Equal(t, got[len(got)-1].LastLSN()+1, w.NextLSN(), what)
		require.Equal(t, got[0].FirstLSN, w.FirstLSN(), what)
	}
	for _, h := range st.acked {
		if h.LastLSN() < st.floor {
			continue
		}
		require.NotEmpty(t, got, "%s: acknowledged batch %d lost", what, h.FirstLSN)
		require.True(t, got[0].FirstLSN <= h.FirstLSN && h.LastLSN() <= got[len(got)-1].LastLSN(),
			"%s: acknowledged batch %d..%d lost (log holds %d..%d)", what, h.FirstLSN, h.LastLSN(),
			got[0].FirstLSN, got[len(got)-1].LastLSN())
	}
	// The recovered log takes appends.
	next := w.NextLSN()
	h, err := w.Append(2, crashBatch(1000))
	require.NoError(t, err, what)
	require.Equal(t, next, h.FirstLSN, what)
	require.NoError(t, w.Close(), what)
	got2 := readAllFS(t, fs, what)
	require.Equal(t, h, got2[len(got2)-1], what)
	return torn
}

// readAllFS returns the headers of every batch of shard 0's log in fs,
// bodies verified.
func readAllFS(t *testing.T, fs vfs.FS, what string) []Header {
	t.Helper()
	r, err := OpenReaderFS(fs, crashDir, 0)
	require.NoError(t, err, what)
	defer r.Close()
	var hs []Header
	for {
		h, raw, err := r.Next()
		if errors.Is(err, io.EOF) {
			return hs
		}
		require.NoError(t, err, what)
		_, _, err = DecodeBatch(raw, nil)
		require.NoError(t, err, what)
		hs = append(hs, h)
	}
}

// TestCrashSweep crashes the leader's WAL before every FS operation of an
// append workload (rolls, retention, a reopen included) with some of the
// unsynced data surviving, and checks that every crash image reopens with
// every acknowledged batch and nothing after a torn one. Every image with a
// torn tail, and every tenth other one, is crashed again at every operation
// of its own recovery (cutting the tail included).
func TestCrashSweep(t *testing.T) {
	for _, za := range crashZeroAhead {
		t.Run(fmt.Sprintf("zeroahead=%d", za), func(t *testing.T) { crashSweep(t, za) })
	}
}

func crashSweep(t *testing.T, zeroAhead int64) {
	var all []Header
	{
		var st crashState
		probe := testutil.NewCrashFS(vfs.NewCrashableMem(), testutil.CrashOptions{At: -1})
		require.NoError(t, crashWorkload(probe, zeroAhead, &st))
		all = st.acked
		require.Len(t, all, crashBatches)
		t.Logf("%d FS operations", probe.Counted())
	}
	nestedEvery, seeds := int64(10), 1
	if os.Getenv("ONCEWAL_LONG") == "1" {
		nestedEvery, seeds = 1, 8
	}
	images, nested, torn := 0, 0, 0
	for k := int64(0); ; k++ {
		for i := range 5 * seeds {
			pct := []int{0, 30, 60, 90, 100}[i%5]
			rng := rand.New(rand.NewPCG(uint64(k), uint64(i)))
			img, st := crashAt(k, zeroAhead, vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rng})
			if img == nil {
				t.Logf("%d crash images, %d crashed recoveries; %d of these had a torn tail to cut", images, nested, torn)
				require.Greater(t, images, 1000*seeds)
				return
			}
			images++
			what := fmt.Sprintf("crash before op %d, %d%% unsynced kept (seed %d)", k, pct, i)
			var buf []byte
			scan, _ := scanLog(img, crashDir, 0, &buf) // an error here (no directory yet) means no torn tail
			if scan.torn || (k%nestedEvery == 0 && pct == 60) {
				// Crash the recovery of this image at each of its operations.
				for j := int64(0); ; j++ {
					pristine := img.CrashClone(vfs.CrashCloneCfg{}) // exact copy: a clone holds only synced data
					fs := testutil.NewCrashFS(pristine, testutil.CrashOptions{At: int(j), Clone: vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng}})
					if w, err := OpenWriter(crashDir, &WriterOptions{FS: fs, SegmentSize: 6 << 10, ZeroAhead: zeroAhead}); err == nil {
						_ = w.Close()
					}
					img2 := fs.Image()
					if img2 == nil {
						break
					}
					nested++
					if checkCrashImage(t, img2, st, all, zeroAhead, fmt.Sprintf("%s, then before recovery op %d", what, j)) {
						torn++
					}
				}
			}
			if checkCrashImage(t, img, st, all, zeroAhead, what) {
				torn++
			}
		}
	}
}

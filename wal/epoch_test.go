package wal

import (
	"io"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

func TestWriterRefusesOlderEpoch(t *testing.T) {
	fs := vfs.NewMem()
	opts := &WriterOptions{FS: fs}
	w, err := OpenWriter("/wal", opts)
	require.NoError(t, err)
	require.Zero(t, w.LastEpoch())
	for _, e := range []uint64{1, 2, 2} {
		_, err := w.Append(e, testEvents(2, int(e)))
		require.NoError(t, err)
	}
	require.EqualValues(t, 2, w.LastEpoch())
	next := w.NextLSN()
	_, err = w.Append(1, testEvents(2, 9))
	require.ErrorIs(t, err, ErrEpochRegression)
	require.Equal(t, next, w.NextLSN(), "a refused batch takes no LSN")
	require.NoError(t, w.Close())

	// Recovery knows the last batch's epoch.
	w, err = OpenWriter("/wal", opts)
	require.NoError(t, err)
	require.EqualValues(t, 2, w.LastEpoch())
	_, err = w.Append(1, testEvents(2, 9))
	require.ErrorIs(t, err, ErrEpochRegression)
	_, err = w.Append(3, testEvents(2, 9))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	info, err := InspectFS(fs, "/wal", 0)
	require.NoError(t, err)
	require.Equal(t, LogInfo{FirstLSN: 1, NextLSN: next + 2, LastEpoch: 3}, info)
}

// writeRawLog writes a log bypassing the Writer's epoch check (as an older
// binary did): segs[i] lists the epochs of segment i's batches, two events
// each. It returns every batch's header in log order.
func writeRawLog(t *testing.T, fs vfs.FS, dir string, segs [][]uint64) []Header {
	t.Helper()
	require.NoError(t, MkdirAllSynced(fs, dir))
	var hs []Header
	lsn := uint64(1)
	for i, epochs := range segs {
		f, err := fs.Create(fs.PathJoin(dir, SegmentName(0, lsn)), vfs.WriteCategoryUnspecified)
		require.NoError(t, err)
		for _, e := range epochs {
			buf, h, err := appendBatch(nil, 0, e, lsn, testEvents(2, int(lsn)))
			require.NoError(t, err)
			_, err = f.Write(buf)
			require.NoError(t, err)
			hs = append(hs, h)
			lsn = h.LastLSN() + 1
		}
		if i%2 == 0 { // zeros written ahead after some segments' batches, as a Writer leaves them
			_, err = f.Write(make([]byte, 700))
			require.NoError(t, err)
		}
		require.NoError(t, f.Sync())
		require.NoError(t, f.Close())
	}
	require.NoError(t, syncDir(fs, dir))
	return hs
}

// decodeAll splits b into batches and returns their headers.
func decodeAll(t *testing.T, b []byte) []Header {
	t.Helper()
	var hs []Header
	for len(b) > 0 {
		h, err := DecodeHeader(b)
		require.NoError(t, err)
		h, _, err = DecodeBatch(b[:h.Size()], nil)
		require.NoError(t, err)
		hs = append(hs, h)
		b = b[h.Size():]
	}
	return hs
}

func TestEpochRegressionInLog(t *testing.T) {
	for _, tc := range []struct {
		name string
		segs [][]uint64
		at   int // index of the first regressing batch
	}{
		{"mid-segment", [][]uint64{{1, 1, 2, 2, 1, 1}}, 4},
		{"segment start", [][]uint64{{1, 2}, {1, 1}, {1}}, 2},
		{"later segment", [][]uint64{{1, 2}, {3, 3, 2}, {2, 3}}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			hs := writeRawLog(t, fs, crashDir, tc.segs)
			bad := hs[tc.at]
			before := testutil.DirImage(t, fs, "/data")

			// Found, typed, located — and nothing changes.
			_, err := OpenWriter(crashDir, &WriterOptions{FS: fs})
			var reg *EpochRegressionError
			require.ErrorAs(t, err, &reg)
			require.ErrorIs(t, err, ErrEpochRegression)
			require.ErrorIs(t, err, ErrCorrupt)
			require.Equal(t, bad.FirstLSN, reg.LSN)
			require.Equal(t, bad.Epoch, reg.Epoch)
			require.Equal(t, hs[tc.at-1].Epoch, reg.Prev)
			require.ErrorIs(t, CheckFS(fs, crashDir, 0), ErrEpochRegression)
			_, err = InspectFS(fs, crashDir, 0)
			require.ErrorIs(t, err, ErrEpochRegression)
			require.Equal(t, before, testutil.DirImage(t, fs, "/data"))

			// The way out: everything from the regression on moves to a side
			// file, verbatim; the log ends before it and opens again.
			cut, err := CutEpochRegression(fs, crashDir, 0, "/data")
			require.NoError(t, err)
			require.Equal(t, bad.FirstLSN, cut.LSN)
			require.Equal(t, bad.Epoch, cut.Epoch)
			require.Equal(t, hs[tc.at-1].Epoch, cut.Prev)
			f, err := fs.Open(cut.SideFile)
			require.NoError(t, err)
			side, err := io.ReadAll(f)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			require.EqualValues(t, len(side), cut.Bytes)
			require.Equal(t, hs[tc.at:], decodeAll(t, side))

			w, err := OpenWriter(crashDir, &WriterOptions{FS: fs})
			require.NoError(t, err)
			require.Equal(t, bad.FirstLSN, w.NextLSN())
			require.Equal(t, hs[tc.at-1].Epoch, w.LastEpoch())
			require.NoError(t, w.Close())
			got := readAllFS(t, fs, crashDir)
			require.Equal(t, hs[:tc.at], got)

			// Nothing left to cut: a second run changes nothing.
			after := testutil.DirImage(t, fs, "/data")
			again, err := CutEpochRegression(fs, crashDir, 0, "/data")
			require.NoError(t, err)
			require.Zero(t, again.LSN)
			require.Equal(t, after, testutil.DirImage(t, fs, "/data"))
		})
	}
}

// TestCutEpochRegressionCrash crashes the cut before each of its filesystem
// operations: every crash image either still holds the regression, with
// every cut byte in some side file (running the cut again finishes it), or
// is cut, with the side file whole — no batch is ever lost.
func TestCutEpochRegressionCrash(t *testing.T) {
	segs := [][]uint64{{1, 2}, {2, 1}, {1, 1}}
	for k := int64(0); ; k++ {
		mem := vfs.NewCrashableMem()
		hs := writeRawLog(t, mem, crashDir, segs)
		fs := testutil.NewCrashFS(mem, testutil.CrashOptions{At: int(k)})
		_, err := CutEpochRegression(fs, crashDir, 0, "/data")
		img := fs.Image()
		if img == nil {
			require.NoError(t, err)
			break
		}
		require.Error(t, err)
		// Finish the cut on the crash image, as an operator would rerun it.
		cut, err := CutEpochRegression(img, crashDir, 0, "/data")
		require.NoError(t, err, "crash before op %d", k)
		require.Equal(t, hs[:3], readAllFS(t, img, crashDir), "crash before op %d", k)
		// Every stale batch is whole in some side file: the first run's
		// was synced before the log changed, a rerun's holds what was left.
		names, err := img.List("/data")
		require.NoError(t, err)
		saved := map[Header]bool{}
		for _, name := range names {
			if name == "wal" {
				continue
			}
			f, err := img.Open("/data/" + name)
			require.NoError(t, err)
			b, err := io.ReadAll(f)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			for _, h := range decodeAllLoose(b) {
				saved[h] = true
			}
		}
		for _, h := range hs[3:] {
			require.True(t, saved[h], "crash before op %d (rerun cut %+v): stale batch at LSN %d in no side file", k, cut, h.FirstLSN)
		}
	}
}

// decodeAllLoose decodes the batches at the start of b, stopping at the
// first that does not decode (an unsynced side file of a crash image).
func decodeAllLoose(b []byte) []Header {
	var hs []Header
	for len(b) > 0 {
		h, err := DecodeHeader(b)
		if err != nil || h.Size() > len(b) {
			return hs
		}
		if h, _, err = DecodeBatch(b[:h.Size()], nil); err != nil {
			return hs
		}
		hs = append(hs, h)
		b = b[h.Size():]
	}
	return hs
}

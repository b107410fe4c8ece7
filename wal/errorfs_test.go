package wal

import (
	"fmt"
	"io"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// failNth fails the nth operation (0-based) of kind, counting only while
// on.
func failNth(kind errorfs.OpKind, n int64) *errorfs.Toggle {
	return &errorfs.Toggle{Injector: &testutil.FailNth{N: n, Match: testutil.OpKinds(kind)}}
}

// TestWriterStickyFailure injects a write, sync, segment-create or
// directory-sync error at each point of an append workload with segment
// rolls. The failing call and every later one return the same error,
// carrying ErrWriterFailed and the cause; nothing more is written; the
// reopened log holds every acknowledged batch and continues.
func TestWriterStickyFailure(t *testing.T) {
	for _, kind := range []errorfs.OpKind{errorfs.OpFileWriteAt, errorfs.OpFileSyncData, errorfs.OpCreate, errorfs.OpOpenDir} {
		for n := int64(0); n < 12; n++ {
			what := fmt.Sprintf("%v #%d", kind, n)
			mem := vfs.NewMem()
			inj := failNth(kind, n)
			fs := errorfs.Wrap(mem, inj)
			opts := &WriterOptions{FS: fs, SegmentSize: 2 << 10}
			w, err := OpenWriter("/wal", opts)
			require.NoError(t, err, what)
			inj.On()
			var acked []Header
			var failed error
			for i := 0; i < 40 && failed == nil; i++ {
				h, err := w.Append(1, crashBatch(i))
				if err != nil {
					failed = err
					break
				}
				acked = append(acked, h)
			}
			require.Error(t, failed, "%s: never injected", what)
			require.ErrorIs(t, failed, ErrWriterFailed, what)
			require.ErrorIs(t, failed, errorfs.ErrInjected, what)
			inj.Off() // the FS works again; the Writer must not

			next := w.NextLSN()
			_, err = w.Append(1, crashBatch(100))
			require.Equal(t, failed, err, "%s: Append after failure", what)
			require.Equal(t, failed, w.Sync(), "%s: Sync after failure", what)
			_, err = w.DeleteBelow(next)
			require.Equal(t, failed, err, "%s: DeleteBelow after failure", what)
			require.Equal(t, next, w.NextLSN(), "%s: nothing more appended", what)
			require.Equal(t, failed, w.Close(), "%s: Close after failure", what)
			_, err = w.Append(1, crashBatch(100))
			require.ErrorIs(t, err, ErrClosed, what)

			// Reopen recovers: every acknowledged batch is there, the failed
			// one at most whole, and the log continues.
			w, err = OpenWriter("/wal", &WriterOptions{FS: mem, SegmentSize: 2 << 10})
			require.NoError(t, err, "%s: reopen", what)
			r, err := OpenReaderFS(mem, "/wal", 0)
			require.NoError(t, err, what)
			var got []Header
			for {
				h, _, err := r.Next()
				if err != nil {
					require.ErrorIs(t, err, io.EOF, what)
					break
				}
				got = append(got, h)
			}
			require.NoError(t, r.Close())
			require.GreaterOrEqual(t, len(got), len(acked), what)
			require.LessOrEqual(t, len(got), len(acked)+1, what)
			for i := range acked {
				require.Equal(t, acked[i], got[i], what)
			}
			end := uint64(0)
			if len(got) > 0 {
				end = got[len(got)-1].LastLSN()
			}
			require.Equal(t, end+1, w.NextLSN(), what)
			_, err = w.Append(2, crashBatch(200))
			require.NoError(t, err, what)
			require.NoError(t, w.Close(), what)
		}
	}
}

// TestOpenWriterIOErrors fails each FS operation of OpenWriter in turn, on an
// existing log with a torn tail: the open fails with the injected error and
// holds no lock, and a clean open afterwards recovers the same log.
func TestOpenWriterIOErrors(t *testing.T) {
	base := vfs.NewCrashableMem()
	w, err := OpenWriter("/wal", &WriterOptions{FS: base, SegmentSize: 2 << 10})
	require.NoError(t, err)
	var acked []Header
	for i := 0; i < 12; i++ {
		h, err := w.Append(1, crashBatch(i))
		require.NoError(t, err)
		acked = append(acked, h)
	}
	require.NoError(t, w.Close())
	// A torn tail: half of one more batch.
	torn, err := AppendBatch(nil, 0, 1, acked[len(acked)-1].LastLSN()+1, crashBatch(50))
	require.NoError(t, err)
	segs, err := listSegments(base, "/wal", 0)
	require.NoError(t, err)
	f, err := base.OpenReadWrite("/wal/"+segs[len(segs)-1].name, vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	st, err := f.Stat()
	require.NoError(t, err)
	_, err = f.WriteAt(torn[:len(torn)/2], st.Size())
	require.NoError(t, err)
	require.NoError(t, f.Sync()) // so that the copies below hold it
	require.NoError(t, f.Close())

	for i := int64(0); ; i++ {
		copyFS := base.CrashClone(vfs.CrashCloneCfg{}) // everything in base is synced: an exact copy
		inj := &errorfs.Toggle{Injector: &testutil.FailNth{N: i}}
		inj.On()
		w, err := OpenWriter("/wal", &WriterOptions{FS: errorfs.Wrap(copyFS, inj), SegmentSize: 2 << 10})
		if err == nil {
			inj.Off()
			require.NoError(t, w.Close())
			require.Greater(t, i, int64(10), "the sweep covered the open's operations")
			t.Logf("%d operations failed in turn", i)
			return
		}
		require.ErrorIs(t, err, errorfs.ErrInjected, "op %d", i)
		// No lock held, and the log recovers intact.
		w, err = OpenWriter("/wal", &WriterOptions{FS: copyFS, SegmentSize: 2 << 10})
		require.NoError(t, err, "op %d", i)
		require.Equal(t, acked[len(acked)-1].LastLSN()+1, w.NextLSN(), "op %d", i)
		require.NoError(t, w.Close())
	}
}

// TestDeleteBelowIOErrors fails a segment removal, or the directory sync
// after one, part-way through a DeleteBelow: the call reports how many
// segments it deleted, the log stays readable from its new first LSN, the
// Writer goes on appending, and a later DeleteBelow finishes the job.
func TestDeleteBelowIOErrors(t *testing.T) {
	for _, kind := range []errorfs.OpKind{errorfs.OpRemove, errorfs.OpOpenDir} {
		for n := int64(0); n < 3; n++ {
			what := fmt.Sprintf("%v #%d", kind, n)
			mem := vfs.NewMem()
			inj := failNth(kind, n)
			w, err := OpenWriter("/wal", &WriterOptions{FS: errorfs.Wrap(mem, inj), SegmentSize: 2 << 10})
			require.NoError(t, err, what)
			var hs []Header
			for i := 0; i < 30; i++ {
				h, err := w.Append(1, crashBatch(i))
				require.NoError(t, err, what)
				hs = append(hs, h)
			}
			segs, err := listSegments(mem, "/wal", 0)
			require.NoError(t, err)
			require.Greater(t, len(segs), 5, what)
			inj.On()
			removed, err := w.DeleteBelow(segs[4].first)
			require.ErrorIs(t, err, errorfs.ErrInjected, what)
			require.NotErrorIs(t, err, ErrWriterFailed, "%s: retention errors are not sticky", what)
			wantRemoved := int(n)
			if kind == errorfs.OpOpenDir {
				wantRemoved++ // the removal happened, its sync failed
			}
			require.Equal(t, wantRemoved, removed, what)
			left, err := listSegments(mem, "/wal", 0)
			require.NoError(t, err)
			require.Equal(t, segs[wantRemoved:], left, "%s: a contiguous suffix", what)
			require.Equal(t, left[0].first, w.FirstLSN(), what)

			h, err := w.Append(1, crashBatch(99))
			require.NoError(t, err, what)
			hs = append(hs, h)
			inj.Off()
			removed, err = w.DeleteBelow(segs[4].first)
			require.NoError(t, err, what)
			require.Equal(t, 4-wantRemoved, removed, what)
			require.Equal(t, segs[4].first, w.FirstLSN(), what)
			require.NoError(t, w.Close())

			r, err := OpenReaderFS(mem, "/wal", 0)
			require.NoError(t, err, what)
			for _, want := range hs {
				if want.FirstLSN < segs[4].first {
					continue
				}
				got, _, err := r.Next()
				require.NoError(t, err, what)
				require.Equal(t, want, got, what)
			}
			require.NoError(t, r.Close())
		}
	}
}

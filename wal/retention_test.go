package wal

import (
	"errors"
	"io"
	"math"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
)

// buildSegments appends batches of 1..4 events to a fresh log of shard 1
// with small segments, returning the open Writer and the headers.
func buildSegments(t *testing.T, dir string, batches int) (*Writer, []Header) {
	t.Helper()
	w, err := OpenWriter(dir, &WriterOptions{Shard: 1, SegmentSize: 700, Sync: SyncManual})
	require.NoError(t, err)
	var hs []Header
	for b := 0; b < batches; b++ {
		h, err := w.Append(uint64(1+b/10), testEvents(1+b%4, b))
		require.NoError(t, err)
		hs = append(hs, h)
	}
	require.NoError(t, w.Sync())
	return w, hs
}

// diskBytes is the bytes of the batches in shard 1's segment files in dir
// (what RetainedBytes counts), found by walking each file's batch headers.
// Each file holds nothing but zeros after them (written ahead), up to its
// size, which is at most SegmentSize unless it holds one larger batch.
func diskBytes(t *testing.T, dir string) (n int64) {
	segs, err := listSegments(vfs.Default, dir, 1)
	require.NoError(t, err)
	var buf []byte
	for i, s := range segs {
		f, err := vfs.Default.Open(filepath.Join(dir, s.name))
		require.NoError(t, err)
		res, err := scanSegment(f, s, 1, i == len(segs)-1, 0, &buf)
		require.NoError(t, err)
		zero, err := allZero(f, res.end, res.size)
		require.NoError(t, err)
		require.True(t, zero, "segment %s: zeros after its batches", s.name)
		require.True(t, res.size <= 700 || res.end == res.size, "segment %s: %d bytes on disk, %d of batches", s.name, res.size, res.end)
		require.NoError(t, f.Close())
		n += res.end
	}
	return n
}

func TestDeleteBelow(t *testing.T) {
	dir := t.TempDir()
	w, hs := buildSegments(t, dir, 60)
	segs, err := listSegments(vfs.Default, dir, 1)
	require.NoError(t, err)
	require.Greater(t, len(segs), 6)
	require.Equal(t, uint64(1), w.FirstLSN())
	require.Equal(t, diskBytes(t, dir), w.RetainedBytes())

	// Nothing is below the first LSN.
	n, err := w.DeleteBelow(1)
	require.NoError(t, err)
	require.Zero(t, n)
	// An LSN inside segment 2 deletes segments 0 and 1 only: segment 2
	// still holds LSNs at or above it.
	mid := segs[2].first + 1
	n, err = w.DeleteBelow(mid)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, segs[2].first, w.FirstLSN())
	require.Equal(t, diskBytes(t, dir), w.RetainedBytes())
	// The first LSN of the next segment deletes the one before it exactly.
	n, err = w.DeleteBelow(segs[3].first)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, segs[3].first, w.FirstLSN())
	left, err := listSegments(vfs.Default, dir, 1)
	require.NoError(t, err)
	require.Equal(t, segs[3:], left)

	// Readers: below the retained range is ErrCompacted, never a skip.
	r, err := OpenReader(dir, 1)
	require.NoError(t, err)
	defer r.Close()
	for _, lsn := range []uint64{1, segs[3].first - 1} {
		require.ErrorIs(t, r.Seek(lsn), ErrCompacted, "lsn %d", lsn)
	}
	gotHs, _ := readAll(t, dir, 1, w.FirstLSN())
	var want []Header
	for _, h := range hs {
		if h.FirstLSN >= segs[3].first {
			want = append(want, h)
		}
	}
	require.Equal(t, want, gotHs)
	gotHs, _ = readAll(t, dir, 1, 0)
	require.Equal(t, want, gotHs, "Seek(0) reads from the oldest retained batch")

	// The active segment is never deleted, however high the LSN.
	n, err = w.DeleteBelow(math.MaxUint64)
	require.NoError(t, err)
	require.Equal(t, len(segs)-4, n)
	left, err = listSegments(vfs.Default, dir, 1)
	require.NoError(t, err)
	require.Equal(t, segs[len(segs)-1:], left)
	require.Equal(t, segs[len(segs)-1].first, w.FirstLSN())
	require.Equal(t, diskBytes(t, dir), w.RetainedBytes())

	// Appends and rolls go on; a reopen sees the same retained log.
	for b := 0; b < 20; b++ {
		h, err := w.Append(9, testEvents(3, 100+b))
		require.NoError(t, err)
		hs = append(hs, h)
	}
	require.Equal(t, diskBytes(t, dir), w.RetainedBytes())
	first, next, retained := w.FirstLSN(), w.NextLSN(), w.RetainedBytes()
	require.NoError(t, w.Close())
	_, err = w.DeleteBelow(next)
	require.ErrorIs(t, err, ErrClosed)
	w, err = OpenWriter(dir, &WriterOptions{Shard: 1, SegmentSize: 700})
	require.NoError(t, err)
	defer w.Close()
	require.Equal(t, first, w.FirstLSN())
	require.Equal(t, next, w.NextLSN())
	require.Equal(t, retained, w.RetainedBytes())
	gotHs, _ = readAll(t, dir, 1, first)
	require.Equal(t, hs[len(hs)-len(gotHs):], gotHs)
	require.Equal(t, first, gotHs[0].FirstLSN)
}

// A Reader inside a segment that retention deletes keeps reading it (the
// open file stays readable on Unix); it returns ErrCompacted only when it
// must open a deleted segment.
func TestReaderSegmentDeletedUnderIt(t *testing.T) {
	dir := t.TempDir()
	w, hs := buildSegments(t, dir, 60)
	defer w.Close()
	segs, err := listSegments(vfs.Default, dir, 1)
	require.NoError(t, err)
	require.Greater(t, len(segs), 4)

	// Reader A is in segment 0 and only segment 0 goes: it reads on
	// seamlessly into segment 1 and to the end.
	ra, err := OpenReader(dir, 1)
	require.NoError(t, err)
	defer ra.Close()
	h, _, err := ra.Next()
	require.NoError(t, err)
	require.Equal(t, hs[0], h)
	// Reader B is in segment 0 too; segments 0 and 1 go, so after segment
	// 0 it must open the deleted segment 1.
	rb, err := OpenReader(dir, 1)
	require.NoError(t, err)
	defer rb.Close()
	_, _, err = rb.Next()
	require.NoError(t, err)

	n, err := w.DeleteBelow(segs[1].first)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	for i := 1; i < len(hs); i++ {
		h, _, err := ra.Next()
		require.NoError(t, err)
		require.Equal(t, hs[i], h)
	}
	_, _, err = ra.Next()
	require.ErrorIs(t, err, io.EOF)

	n, err = w.DeleteBelow(segs[2].first)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	i := 1
	for ; hs[i].FirstLSN < segs[1].first; i++ {
		h, _, err := rb.Next()
		require.NoError(t, err, "the rest of the deleted segment 0 stays readable")
		require.Equal(t, hs[i], h)
	}
	_, _, err = rb.Next()
	require.ErrorIs(t, err, ErrCompacted)

	// A segment listed but deleted before the Reader opens it.
	rc, err := OpenReader(dir, 1)
	require.NoError(t, err)
	defer rc.Close()
	require.ErrorIs(t, rc.open(segs[0]), ErrCompacted)
	// Seeking into a deleted segment.
	require.ErrorIs(t, rc.Seek(segs[1].first), ErrCompacted)
	require.NoError(t, rc.Seek(segs[2].first))
	h, _, err = rc.Next()
	require.NoError(t, err)
	require.Equal(t, segs[2].first, h.FirstLSN)
}

func TestBatchEndingAt(t *testing.T) {
	dir := t.TempDir()
	w, hs := buildSegments(t, dir, 40)
	defer w.Close()
	r, err := OpenReader(dir, 1)
	require.NoError(t, err)
	defer r.Close()
	ends := map[uint64]int{}
	for i, h := range hs {
		ends[h.LastLSN()] = i
	}
	last := hs[len(hs)-1].LastLSN()
	for lsn := uint64(1); lsn <= last; lsn++ {
		h, err := r.BatchEndingAt(lsn)
		i, isEnd := ends[lsn]
		if !isEnd {
			require.ErrorIs(t, err, ErrNoBatchBoundary, "lsn %d", lsn)
			continue
		}
		require.NoError(t, err, "lsn %d", lsn)
		require.Equal(t, hs[i], h, "the header Append returned, HeaderCRC included")
		require.NotZero(t, h.HeaderCRC)
		// Positioned after it.
		next, _, err := r.Next()
		if i == len(hs)-1 {
			require.ErrorIs(t, err, io.EOF)
		} else {
			require.NoError(t, err)
			require.Equal(t, hs[i+1], next)
		}
	}
	_, err = r.BatchEndingAt(0)
	require.ErrorIs(t, err, ErrNoBatchBoundary)
	_, err = r.BatchEndingAt(last + 1)
	require.ErrorIs(t, err, io.EOF, "the log does not reach it yet")

	// A batch with the same LSNs written under another epoch is another
	// batch: its header differs, HeaderCRC included.
	other := t.TempDir()
	w2, err := OpenWriter(other, &WriterOptions{Shard: 1})
	require.NoError(t, err)
	defer w2.Close()
	h2, err := w2.Append(77, testEvents(1, 0))
	require.NoError(t, err)
	require.Equal(t, hs[0].LastLSN(), h2.LastLSN())
	require.Equal(t, hs[0].BodyCRC, h2.BodyCRC)
	require.NotEqual(t, hs[0].HeaderCRC, h2.HeaderCRC)

	// Below the retained range: ErrCompacted, including the LSN just
	// before the first retained one.
	segs, err := listSegments(vfs.Default, dir, 1)
	require.NoError(t, err)
	_, err = w.DeleteBelow(segs[2].first)
	require.NoError(t, err)
	for _, lsn := range []uint64{1, segs[2].first - 1} {
		_, err = r.BatchEndingAt(lsn)
		require.ErrorIs(t, err, ErrCompacted, "lsn %d", lsn)
	}
	i := ends[hs[len(hs)-1].LastLSN()]
	h, err := r.BatchEndingAt(hs[i].LastLSN())
	require.NoError(t, err)
	require.Equal(t, hs[i], h)
	require.False(t, errors.Is(err, ErrCompacted))
}

// listThenDeleteFS runs deleted once, right after its next listing of the
// directory: retention deleting segments between a reader's listing and
// its opening them.
type listThenDeleteFS struct {
	vfs.FS
	deleted func()
}

func (fs *listThenDeleteFS) List(dir string) ([]string, error) {
	names, err := fs.FS.List(dir)
	if f := fs.deleted; f != nil && err == nil {
		fs.deleted = nil
		f()
	}
	return names, err
}

// TestOpenReaderRacingDeleteBelow: segments retention deletes after
// OpenReader listed them and before it checked them do not fail the open;
// the reader serves every LSN still retained and reports the deleted ones
// as compacted. (Found by the multi-follower simulation: a leader refused a
// follower's hello, "checking the hello against the log at LSN 32: open
// …/0000000001-00000000000000000005.wal: file does not exist", because
// retention deleted the log's oldest segment, far below LSN 32, while the
// hello check opened its reader.)
func TestOpenReaderRacingDeleteBelow(t *testing.T) {
	dir := t.TempDir()
	w, hs := buildSegments(t, dir, 60)
	defer w.Close()
	segs, err := listSegments(vfs.Default, dir, 1)
	require.NoError(t, err)
	require.Greater(t, len(segs), 4)
	fs := &listThenDeleteFS{FS: vfs.Default, deleted: func() {
		n, err := w.DeleteBelow(segs[3].first)
		require.NoError(t, err)
		require.Equal(t, 3, n)
	}}
	r, err := OpenReaderFS(fs, dir, 1)
	require.NoError(t, err, "a segment deleted during the open")
	defer r.Close()
	require.Nil(t, fs.deleted, "the deletion ran inside the open")

	last := hs[len(hs)-1]
	require.NoError(t, r.Seek(last.FirstLSN))
	h, _, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, last.FirstLSN, h.FirstLSN)
	require.ErrorIs(t, r.Seek(1), ErrCompacted)
}

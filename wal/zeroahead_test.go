package wal

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// The Writer fills the active segment with zeros ahead of its appends, in
// steps of ZeroAhead and never past SegmentSize (a larger batch gets its
// size); a reopened Writer writes over the zeros it finds.
func TestZeroAheadLayout(t *testing.T) {
	dir := t.TempDir()
	const ahead, segSize = 4 << 10, 10 << 10
	w, err := OpenWriter(dir, &WriterOptions{ZeroAhead: ahead, SegmentSize: segSize})
	require.NoError(t, err)
	fileSize := func(name string) int64 {
		st, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		return st.Size()
	}
	h, err := w.Append(1, testEvents(2, 1))
	require.NoError(t, err)
	first := w.seg.name
	require.Equal(t, int64(h.Size()+ahead), fileSize(first), "filled ZeroAhead past the first batch")
	require.Equal(t, int64(h.Size()), w.RetainedBytes(), "RetainedBytes counts batches, not zeros")

	// Appends within the filled part leave the size alone; the one that
	// passes it fills again, up to SegmentSize at most.
	for w.size+int64(h.Size()) <= int64(h.Size()+ahead) {
		_, err = w.Append(1, testEvents(2, 2))
		require.NoError(t, err)
		require.Equal(t, int64(h.Size()+ahead), fileSize(first))
	}
	_, err = w.Append(1, testEvents(2, 3))
	require.NoError(t, err)
	require.Equal(t, min(w.size+ahead, segSize), fileSize(first))

	// Reopened, the Writer continues after the last batch, over the zeros.
	require.NoError(t, w.Close())
	before := fileSize(first)
	w, err = OpenWriter(dir, &WriterOptions{ZeroAhead: ahead, SegmentSize: segSize})
	require.NoError(t, err)
	require.Equal(t, before, fileSize(first), "zeros kept, not cut")
	next := w.NextLSN()
	h, err = w.Append(1, testEvents(1, 4))
	require.NoError(t, err)
	require.Equal(t, next, h.FirstLSN)

	// A batch larger than SegmentSize gets a segment of exactly its size.
	big := testEvents(1, 5)
	big[0].Value = make([]byte, 2*segSize)
	for i := range big[0].Value {
		big[0].Value[i] = byte(1 + i%200)
	}
	h, err = w.Append(1, big)
	require.NoError(t, err)
	require.Equal(t, int64(h.Size()), fileSize(w.seg.name))
	require.NoError(t, w.Close())
	_, evs := readAll(t, dir, 0, 0)
	require.Equal(t, int(h.LastLSN()), len(evs))
}

// A Writer that found zeros after the log when it validated read-only
// validates again under the lock if another Writer wrote over them
// meanwhile (the size did not change).
func TestZeroAheadRescanAfterAppend(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, nil)
	require.NoError(t, err)
	_, err = w.Append(1, testEvents(2, 1))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	var buf []byte
	scan, err := scanLog(vfs.Default, dir, 0, &buf)
	require.NoError(t, err)
	require.True(t, scan.zeros)
	ok, err := scan.current(vfs.Default, dir, 0)
	require.NoError(t, err)
	require.True(t, ok)

	w, err = OpenWriter(dir, nil)
	require.NoError(t, err)
	_, err = w.Append(1, testEvents(2, 2))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	ok, err = scan.current(vfs.Default, dir, 0)
	require.NoError(t, err)
	require.False(t, ok, "appended over the zeros: the scan is stale")
}

// Over zeros written ahead a crash loses sectors, not the file's end: an
// append whose last sectors or pages never reached the disk reads as data
// followed by zeros. Every such loss of the last batch, from any sector
// boundary on, is a torn tail and is cut; so is a lost header sector with
// later sectors of the batch kept.
func TestTornTailOverZeros(t *testing.T) {
	dir, lastPath, lastOff, want, lastFirst := buildLogZeroAhead(t, 60, DefaultZeroAhead)
	full, err := os.ReadFile(lastPath)
	require.NoError(t, err)
	name := filepath.Base(lastPath)
	end, err := DataEnd(fileAt(t, lastPath), int64(len(full)))
	require.NoError(t, err)
	require.Greater(t, int64(len(full)), end+HeaderSize, "zeros after the last batch")
	cuts := 0
	for s := lastOff / sectorSize * sectorSize; s < end; s += sectorSize {
		from := max(s, lastOff)
		d := testutil.TempCopy(t, dir)
		z := slices.Clone(full)
		clear(z[from:])
		require.NoError(t, os.WriteFile(filepath.Join(d, name), z, 0o644))
		checkRecovered(t, d, want, lastFirst, fmt.Sprintf("zeros from %d", from))
		cuts++
		// The same sector lost, the rest of the batch kept.
		if s > lastOff && s+sectorSize < end {
			d = testutil.TempCopy(t, dir)
			z = slices.Clone(full)
			clear(z[s : s+sectorSize])
			require.NoError(t, os.WriteFile(filepath.Join(d, name), z, 0o644))
			checkRecovered(t, d, want, lastFirst, fmt.Sprintf("sector at %d lost", s))
		}
	}
	require.Greater(t, cuts, 3)
	// The header's sector lost, later ones kept.
	d := testutil.TempCopy(t, dir)
	z := slices.Clone(full)
	clear(z[lastOff : (lastOff/sectorSize+1)*sectorSize])
	require.NoError(t, os.WriteFile(filepath.Join(d, name), z, 0o644))
	checkRecovered(t, d, want, lastFirst, "header sector lost")

	// Damage that is not zeros is corruption, zeros after it or not.
	d = testutil.TempCopy(t, dir)
	z = slices.Clone(full)
	z[lastOff+HeaderSize+5] ^= 0x10
	require.NoError(t, os.WriteFile(filepath.Join(d, name), z, 0o644))
	requireOpenFails(t, d, ErrChecksum, "flipped body bit")
}

// A segment before the last may end in zeros written ahead, and in nothing
// else.
func TestNonLastSegmentZeros(t *testing.T) {
	dir, _, _, _, _ := buildLogZeroAhead(t, 3, DefaultZeroAhead)
	segs, err := listSegments(vfs.Default, dir, 0)
	require.NoError(t, err)
	path := filepath.Join(dir, segs[0].name)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	end, err := DataEnd(fileAt(t, path), int64(len(b)))
	require.NoError(t, err)
	require.Less(t, end, int64(len(b)), "the first segment has zeros after its batches")
	_, evs := readAll(t, testutil.TempCopy(t, dir), 0, 0)
	require.NotEmpty(t, evs)

	d := testutil.TempCopy(t, dir)
	g := slices.Clone(b)
	g[len(g)-1] = 7
	require.NoError(t, os.WriteFile(filepath.Join(d, segs[0].name), g, 0o644))
	requireOpenFails(t, d, corruption.Err, "a byte after the zeros of a non-last segment")
}

func fileAt(t *testing.T, path string) vfs.File {
	f, err := vfs.Default.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

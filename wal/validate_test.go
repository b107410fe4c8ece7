package wal

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// requireRefused checks that OpenWriter and OpenReader of shard in dir both
// fail with target and that the directory (or file) is byte-for-byte as it
// was: a refused open creates no lock file and cuts nothing.
func requireRefused(t *testing.T, dir string, shard uint32, target error, what string) {
	t.Helper()
	snap := func() any {
		if st, err := os.Stat(dir); err == nil && !st.IsDir() {
			b, err := os.ReadFile(dir)
			require.NoError(t, err)
			return string(b)
		}
		return testutil.DirImage(t, vfs.Default, dir)
	}
	before := snap()
	_, err := OpenWriter(dir, &WriterOptions{Shard: shard})
	require.ErrorIs(t, err, target, "%s: writer", what)
	_, err = OpenReader(dir, shard)
	require.ErrorIs(t, err, target, "%s: reader", what)
	require.Equal(t, before, snap(), "%s: changed on disk", what)
}

// writeLog writes a log of shard in dir with a few batches over several
// segments and closes it.
func writeLog(t *testing.T, dir string, shard uint32) {
	t.Helper()
	w, err := OpenWriter(dir, &WriterOptions{Shard: shard, SegmentSize: 500})
	require.NoError(t, err)
	for b := 0; b < 12; b++ {
		_, err := w.Append(1, testEvents(1+b%3, b))
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
}

func TestOpenRefusesNonWAL(t *testing.T) {
	// A regular file.
	file := filepath.Join(t.TempDir(), "wal")
	require.NoError(t, os.WriteFile(file, []byte("not a log"), 0o644))
	requireRefused(t, file, 0, ErrNotWAL, "regular file")
	_, err := ListShards(file)
	require.ErrorIs(t, err, ErrNotWAL)

	// Directories holding something else.
	for _, junk := range []string{"LOCK", "CURRENT", "MANIFEST-000001", "000001.log", "x.lock", "123.lock",
		"00000000001.lock", "000000000a.lock", "0000000001.LOCK", "0000000001-00000000000000000001.wal.bak"} {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, junk), []byte("data"), 0o644))
		requireRefused(t, dir, 0, ErrNotWAL, junk)
		_, err := ListShards(dir)
		require.ErrorIs(t, err, ErrNotWAL, junk)
	}
	// A subdirectory.
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	before := snapshotDirNames(t, dir)
	_, err = OpenWriter(dir, nil)
	require.ErrorIs(t, err, ErrNotWAL)
	require.Equal(t, before, snapshotDirNames(t, dir))

	// A real log with one foreign file beside it.
	dir = t.TempDir()
	writeLog(t, dir, 2)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o644))
	requireRefused(t, dir, 2, ErrNotWAL, "log plus foreign file")

	// A directory that does not exist: the Writer creates it, the Reader
	// and ListShards report it.
	missing := filepath.Join(t.TempDir(), "a", "b")
	_, err = OpenReader(missing, 0)
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = ListShards(missing)
	require.ErrorIs(t, err, os.ErrNotExist)
	w, err := OpenWriter(missing, nil)
	require.NoError(t, err)
	require.NoError(t, w.Close())
}

func snapshotDirNames(t *testing.T, dir string) []string {
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestOpenRefusesRandomSegment(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for i := 0; i < 20; i++ {
		junk := make([]byte, HeaderSize+rng.IntN(5000))
		for j := range junk {
			junk[j] = byte(rng.IntN(256))
		}
		// As the only segment, with and without a lock file from an
		// earlier Writer.
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, SegmentName(0, 1)), junk, 0o644))
		requireRefused(t, dir, 0, ErrCorrupt, "random only segment")
		require.NoError(t, os.WriteFile(filepath.Join(dir, LockName(0)), nil, 0o644))
		requireRefused(t, dir, 0, ErrCorrupt, "random only segment, lock file present")

		// As the last segment of a good log, and as a middle one.
		dir = t.TempDir()
		writeLog(t, dir, 0)
		segs, err := listSegments(vfs.Default, dir, 0)
		require.NoError(t, err)
		require.Greater(t, len(segs), 2)
		for _, victim := range []segment{segs[len(segs)-1], segs[1]} {
			d := testutil.TempCopy(t, dir)
			require.NoError(t, os.WriteFile(filepath.Join(d, victim.name), junk, 0o644))
			requireRefused(t, d, 0, ErrCorrupt, "random segment "+victim.name)
		}
	}
	// Random bytes that happen to start with the magic and version still
	// fail, on the header checksum.
	junk := make([]byte, 300)
	copy(junk, "OWAL\x02\x00")
	for j := 6; j < len(junk); j++ {
		junk[j] = byte(rng.IntN(256))
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, SegmentName(0, 1)), junk, 0o644))
	requireRefused(t, dir, 0, ErrChecksum, "random segment with magic")
}

func TestOpenRefusesForeignShard(t *testing.T) {
	// Shard 2's log, renamed to shard 1's names.
	src := t.TempDir()
	writeLog(t, src, 2)
	segs, err := listSegments(vfs.Default, src, 2)
	require.NoError(t, err)
	for _, victim := range []int{0, len(segs) - 1} {
		dir := t.TempDir()
		writeLog(t, dir, 1)
		mine, err := listSegments(vfs.Default, dir, 1)
		require.NoError(t, err)
		require.Equal(t, len(segs), len(mine), "same workload, same segmentation")
		b, err := os.ReadFile(filepath.Join(src, segs[victim].name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, mine[victim].name), b, 0o644))
		requireRefused(t, dir, 1, ErrShardMismatch, "foreign segment")
		requireRefused(t, dir, 1, ErrCorrupt, "foreign segment")
	}
	// Shard 2's segments beside shard 1's are not foreign: each shard
	// opens its own.
	dir := t.TempDir()
	writeLog(t, dir, 1)
	writeLog(t, dir, 2)
	for _, sh := range []uint32{1, 2} {
		w, err := OpenWriter(dir, &WriterOptions{Shard: sh})
		require.NoError(t, err)
		require.NoError(t, w.Close())
	}
}

func TestListShards(t *testing.T) {
	dir := t.TempDir()
	got, err := ListShards(dir)
	require.NoError(t, err)
	require.Empty(t, got)
	for _, sh := range []uint32{7, 0, 4294967295, 3} {
		writeLog(t, dir, sh)
	}
	got, err = ListShards(dir)
	require.NoError(t, err)
	require.Equal(t, []uint32{0, 3, 7, 4294967295}, got)
	// Lock files alone do not make a shard.
	require.NoError(t, os.WriteFile(filepath.Join(dir, LockName(9)), nil, 0o644))
	got, err = ListShards(dir)
	require.NoError(t, err)
	require.Equal(t, []uint32{0, 3, 7, 4294967295}, got)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.wal"), nil, 0o644))
	_, err = ListShards(dir)
	require.ErrorIs(t, err, ErrBadSegmentName)
}

func TestLockName(t *testing.T) {
	require.Equal(t, "0000000003.lock", LockName(3))
	require.Equal(t, "4294967295.lock", LockName(4294967295))
	require.True(t, isLockName(LockName(0)))
	for _, bad := range []string{"3.lock", "+000000003.lock", "4294967296.lock", "0000000003.lock.tmp", "LOCK",
		SegmentName(3, 1)} {
		require.False(t, isLockName(bad), bad)
	}
	_, _, err := ParseSegmentName(LockName(3))
	require.ErrorIs(t, err, ErrBadSegmentName, "a lock file never parses as a segment")
}

// A segment's temporary copy left by a crash during recovery belongs to the
// WAL: listing skips it, a refused open keeps it, and the next OpenWriter of
// its shard removes it (and only its own shard's).
func TestStaleTempFile(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, 0)
	writeLog(t, dir, 1)
	tmp0 := filepath.Join(dir, SegmentName(0, 1)+tmpSuffix)
	tmp1 := filepath.Join(dir, SegmentName(1, 1)+tmpSuffix)
	require.NoError(t, os.WriteFile(tmp0, []byte("partial copy"), 0o644))
	require.NoError(t, os.WriteFile(tmp1, []byte("partial copy"), 0o644))
	got, err := ListShards(dir)
	require.NoError(t, err)
	require.Equal(t, []uint32{0, 1}, got)
	hs, _ := readAll(t, dir, 0, 0)
	require.NotEmpty(t, hs)

	// Refused (a foreign file): the temporary copies stay.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "junk"), nil, 0o644))
	requireRefused(t, dir, 0, ErrNotWAL, "junk beside a temp file")
	require.NoError(t, os.Remove(filepath.Join(dir, "junk")))

	w, err := OpenWriter(dir, &WriterOptions{Shard: 0})
	require.NoError(t, err)
	require.NoError(t, w.Close())
	_, err = os.Stat(tmp0)
	require.ErrorIs(t, err, os.ErrNotExist, "shard 0's stale copy removed")
	_, err = os.Stat(tmp1)
	require.NoError(t, err, "shard 1's copy is shard 1's business")
	require.True(t, isTempName(filepath.Base(tmp1)))
	require.False(t, isTempName("x.wal.tmp"))
}

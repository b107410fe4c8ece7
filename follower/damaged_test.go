package follower_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// damagedNode writes a small node of shards 0 and 1 (a few batches each,
// closed cleanly so every store is one sstable of one data block) and flips
// one byte inside the data block of shard 1's sstable. It returns the node
// directory and the batches of each shard.
func damagedNode(t *testing.T) (string, [][]byte) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "node")
	n, err := follower.OpenNode(dir, []uint32{0, 1}, &follower.NodeOptions{Follower: follower.Options{Logger: quietLogger}})
	require.NoError(t, err)
	w := recordLog(t, sim.WorkloadOptions{Seed: 3, Sessions: 2, Requests: 12, BatchSize: 4}, 1, nil)
	for _, s := range []uint32{0, 1} {
		for _, b := range encodeLog(t, w, s, 1)[:2] {
			_, err := n.Apply(b)
			require.NoError(t, err)
		}
	}
	require.NoError(t, n.Close())
	flipSSTByte(t, follower.ShardDir(dir, 1))
	return dir, encodeLog(t, w, 0, 1)
}

// flipSSTByte flips one byte of the first data block of the one sstable in
// dir (a block every read of the store needs).
func flipSSTByte(t *testing.T, dir string) {
	t.Helper()
	ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	require.NoError(t, err)
	require.Len(t, ssts, 1, "the store should be one flushed sstable")
	b, err := os.ReadFile(ssts[0])
	require.NoError(t, err)
	b[16] ^= 0xff
	require.NoError(t, os.WriteFile(ssts[0], b, 0o644))
}

// storeDigest is testutil.TreeDigest of a store without its LOCK file's
// entry: taking Pebble's lock truncates the (empty) file, which moves its
// mtime (see peekFS) — the one trace an open leaves.
func storeDigest(t *testing.T, dir string) map[string]string {
	d := testutil.TreeDigest(t, dir)
	delete(d, "LOCK")
	return d
}

// TestDamagedStoreIsAnError: one flipped byte in a store's sstable is
// ErrStoreCorrupt (in the corruption class, naming the store and the
// remedy) from every way the library opens or reads a store — never a
// panic (Pebble's DataCorruption default calls Logger.Fatalf, which the
// FatalLogger turns into one) — and nothing on disk changes.
func TestDamagedStoreIsAnError(t *testing.T) {
	dir, _ := damagedNode(t)
	store := follower.ShardDir(dir, 1)
	for _, tc := range []struct {
		name string
		open func() error
	}{
		{"Open", func() error {
			f, err := follower.Open(store, &follower.Options{Shard: 1, Logger: quietLogger})
			if err == nil {
				_ = f.Close()
			}
			return err
		}},
		{"Describe", func() error { _, err := follower.Describe(vfs.Default, store); return err }},
		{"OpenNode of the damaged shard alone", func() error {
			n, err := follower.OpenNode(dir, []uint32{1}, &follower.NodeOptions{Follower: follower.Options{Logger: quietLogger}})
			if err == nil {
				_ = n.Close()
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := storeDigest(t, store)
			err := tc.open()
			require.ErrorIs(t, err, follower.ErrStoreCorrupt)
			require.ErrorIs(t, err, corruption.Err)
			require.ErrorContains(t, err, store)
			require.ErrorContains(t, err, "checksum mismatch")
			require.ErrorContains(t, err, "--rebuild=auto")
			require.Equal(t, before, storeDigest(t, store), "a refused open changed the store")
		})
	}
}

// TestNodeServesAroundDamagedShard: a node whose shard 1 store is damaged
// opens; shard 0 applies as before, shard 1 is down (Stats Err, Down) and
// refuses its batches with ErrStoreCorrupt, its store untouched.
func TestNodeServesAroundDamagedShard(t *testing.T) {
	dir, batches := damagedNode(t)
	store := follower.ShardDir(dir, 1)
	before := storeDigest(t, store)
	n, err := follower.OpenNode(dir, []uint32{0, 1}, &follower.NodeOptions{Follower: follower.Options{Logger: quietLogger}})
	require.NoError(t, err)
	defer n.Close()

	st := n.Stats()
	require.Equal(t, 1, st.Down)
	require.NoError(t, st.Shards[0].Err)
	require.ErrorIs(t, st.Shards[1].Err, follower.ErrStoreCorrupt)

	res, err := n.Apply(batches[2])
	require.NoError(t, err)
	require.False(t, res.Ack.Refused)
	lsn, _, err := n.Position(0)
	require.NoError(t, err)
	require.Equal(t, res.Ack.AppliedLSN, lsn)

	w := recordLog(t, sim.WorkloadOptions{Seed: 3, Sessions: 2, Requests: 12, BatchSize: 4}, 1, nil)
	res, err = n.Apply(encodeLog(t, w, 1, 1)[2])
	require.ErrorIs(t, err, follower.ErrStoreCorrupt)
	require.True(t, res.Ack.Refused)
	_, _, err = n.Position(1)
	require.ErrorIs(t, err, follower.ErrStoreCorrupt)
	require.NoError(t, n.Close())
	require.Equal(t, before, storeDigest(t, store), "the node changed the damaged store")
}

package follower_test

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

func openNodeOf(t *testing.T, dir string, shards []uint32, count, window int) (*follower.Node, error) {
	t.Helper()
	return follower.OpenNode(dir, shards, &follower.NodeOptions{ShardCount: count,
		Follower: follower.Options{Store: store.Options{Logger: quietLogger, WindowCapacity: window}}})
}

// TestNodeShardCountFixed: a node directory records the deployment's shard
// count and refuses another before it creates a store (it created
// shard-0002 of a 2-shard node, then was refused by the leader).
func TestNodeShardCountFixed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "node")
	n, err := openNodeOf(t, dir, []uint32{0, 1}, 2, 0)
	require.NoError(t, err)
	require.NoError(t, n.Close())
	got, ok, err := store.ReadShardCount(vfs.Default, dir)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 2, got)

	refused := func(shards []uint32, count int, target error) error {
		t.Helper()
		before := testutil.TreeState(t, dir)
		_, err := openNodeOf(t, dir, shards, count, 0)
		require.ErrorIs(t, err, target)
		require.Equal(t, before, testutil.TreeState(t, dir), "a refused open changed the node directory")
		return err
	}
	err = refused([]uint32{0, 1, 2}, 3, store.ErrShardCount)
	require.ErrorContains(t, err, "holds a deployment of 2 shards (recorded in SHARDS), not 3")
	refused([]uint32{0}, 1, store.ErrShardCount)
	refused([]uint32{0, 2}, 2, follower.ErrBadOptions)

	// From before the record: counted from the stores, then recorded.
	require.NoError(t, os.Remove(filepath.Join(dir, store.ShardCountFileName)))
	err = refused([]uint32{0, 1, 2}, 3, store.ErrShardCount)
	require.ErrorContains(t, err, "counted from its stores")
	n, err = openNodeOf(t, dir, []uint32{0, 1}, 2, 0)
	require.NoError(t, err)
	require.NoError(t, n.Close())
	require.FileExists(t, filepath.Join(dir, store.ShardCountFileName))
}

// TestNodeFailedStartLeavesNothing: when one shard's store is refused, the
// stores the same open created for the other shards are removed again, and
// a node directory it created too.
func TestNodeFailedStartLeavesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "node")
	n, err := openNodeOf(t, dir, []uint32{0}, 0, 1000)
	require.NoError(t, err)
	require.NoError(t, n.Close())
	before := testutil.TreeState(t, dir)
	_, err = openNodeOf(t, dir, []uint32{0, 1, 2}, 0, 2000)
	require.ErrorIs(t, err, store.ErrMismatch)
	require.Equal(t, before, testutil.TreeState(t, dir), "a refused open left stores behind")

	fresh := filepath.Join(t.TempDir(), "fresh")
	_, err = follower.OpenNode(fresh, []uint32{0, 1}, &follower.NodeOptions{
		Follower: follower.Options{Store: store.Options{Logger: quietLogger}},
		PerShard: func(s uint32, o *follower.Options) {
			if s == 1 {
				o.Store.FS = refuseFS{o.Store.FS}
			}
		}})
	require.Error(t, err)
	require.NoDirExists(t, fresh)
}

// refuseFS fails every directory creation.
type refuseFS struct{ vfs.FS }

func (refuseFS) MkdirAll(string, os.FileMode) error { return os.ErrPermission }

// TestNodeCreationSurvivesCrash: a crash at any point while OpenNode
// creates a two-shard node directory (each filesystem operation, keeping
// none, half or all of what was not synced) leaves one that opens again as
// the same two-shard node. Recording the count after the stores left a
// directory holding shard-0000 alone, refused ever after as a one-shard
// deployment (the election simulation's stall: a member that never
// followed again).
func TestNodeCreationSurvivesCrash(t *testing.T) {
	open := func(fs vfs.FS) (*follower.Node, error) {
		return follower.OpenNode("/node", []uint32{0, 1}, &follower.NodeOptions{ShardCount: 2,
			Follower: follower.Options{Store: store.Options{FS: fs, Logger: quietLogger}}})
	}
	probe := testutil.NewCrashFS(vfs.NewCrashableMem(), testutil.CrashOptions{At: -1})
	n, err := open(probe)
	require.NoError(t, err)
	require.NoError(t, n.Close())
	points := probe.Counted()
	tested := 0
	for at := 0; at < points; at++ {
		for _, keep := range []int{0, 25, 50, 75, 100} {
			c := testutil.NewCrashFS(vfs.NewCrashableMem(), testutil.CrashOptions{At: at, Continue: true,
				Clone: vfs.CrashCloneCfg{UnsyncedDataPercent: keep, RNG: rand.New(rand.NewPCG(uint64(at), uint64(keep)))}})
			n, err := open(c)
			require.NoError(t, err)
			require.NoError(t, n.Close())
			img := c.Image()
			if img == nil {
				continue // background work made this run shorter than the probe
			}
			tested++
			n, err = open(img)
			require.NoError(t, err, "crash before operation %d of %d (keeping %d%% unsynced)", at, points, keep)
			require.NoError(t, n.Close())
		}
	}
	require.Greater(t, tested, 5*points/2, "too few crash images were taken")
}

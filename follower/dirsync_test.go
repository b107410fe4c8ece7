package follower_test

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestNewStoreSurvivesPowerFailure: a batch a fresh store acknowledged
// survives a power failure that keeps nothing unsynced — including the
// entries of the directories the store was created in (found by the
// multi-follower simulation: a node's whole store vanished with its
// directory, after acknowledging batches).
func TestNewStoreSurvivesPowerFailure(t *testing.T) {
	batch, err := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{{Op: wal.OpOpen, Session: session.ID{1}, Seq: 1, Time: 1}})
	require.NoError(t, err)
	t.Run("follower", func(t *testing.T) {
		mem := vfs.NewCrashableMem()
		f, err := follower.Open("/a/b/store", testOptions(mem))
		require.NoError(t, err)
		_, err = f.Apply(batch)
		require.NoError(t, err)
		crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		require.NoError(t, f.Close())
		f, err = follower.Open("/a/b/store", testOptions(crashed))
		require.NoError(t, err)
		defer f.Close()
		lsn, _ := f.Position()
		require.Equal(t, uint64(1), lsn, "the acknowledged batch was lost with the store's directory")
	})
	t.Run("node", func(t *testing.T) {
		mem := vfs.NewCrashableMem()
		o := &follower.NodeOptions{Follower: *testOptions(mem)}
		n, err := follower.OpenNode("/nodes/n1", []uint32{0}, o)
		require.NoError(t, err)
		_, err = n.Apply(batch)
		require.NoError(t, err)
		o.Follower.Store.FS = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		require.NoError(t, n.Close())
		n, err = follower.OpenNode("/nodes/n1", []uint32{0}, o)
		require.NoError(t, err)
		defer n.Close()
		lsn, _, err := n.Position(0)
		require.NoError(t, err)
		require.Equal(t, uint64(1), lsn, "the acknowledged batch was lost with the node's directory")
	})
}

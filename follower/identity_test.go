package follower_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// appliedStore fills a store of shard with a short workload and closes it.
func appliedStore(t *testing.T, dir string, o follower.Options) uint64 {
	return filledStore(t, dir, o, false)
}

// filledStore fills a store with a short workload and closes it, or kills
// it (its writes then only in Pebble's WAL, for the next Open to flush).
func filledStore(t *testing.T, dir string, o follower.Options, kill bool) uint64 {
	t.Helper()
	w := recordLog(t, sim.WorkloadOptions{Seed: 5, Sessions: 4, Requests: 200, BatchSize: 20}, 1, nil)
	o.Store.Logger = quietLogger
	f, err := follower.Open(dir, &o)
	require.NoError(t, err)
	for _, raw := range encodeLog(t, w, o.Store.Shard, 1) {
		_, err := f.Apply(raw)
		require.NoError(t, err)
	}
	lsn, _ := f.Position()
	if kill {
		require.NoError(t, drill.Kill(f))
	} else {
		require.NoError(t, f.Close())
	}
	return lsn
}

// TestOpenForeignShard: a store of shard 1 opened as shard 0 used to open
// silently and then refuse every batch for ever. Open now refuses it with a
// MismatchError naming both shards, and changes nothing on disk; as shard 1
// it opens.
func TestOpenForeignShard(t *testing.T) {
	dir := t.TempDir()
	lsn := appliedStore(t, dir, follower.Options{Store: store.Options{Shard: 1}})
	before := testutil.TreeState(t, dir)

	_, err := follower.Open(dir, &follower.Options{Store: store.Options{Shard: 0, Logger: quietLogger}})
	require.ErrorIs(t, err, store.ErrMismatch)
	var me *store.MismatchError
	require.ErrorAs(t, err, &me)
	require.Equal(t, uint32(1), me.Found.Shard)
	require.Equal(t, uint32(0), me.Asked.Shard)
	require.Contains(t, err.Error(), "shard 1, asked 0")
	require.Equal(t, before, testutil.TreeState(t, dir), "a refused open changed the store")

	f, err := follower.Open(dir, &follower.Options{Store: store.Options{Shard: 1, Logger: quietLogger}})
	require.NoError(t, err)
	got, _ := f.Position()
	require.Equal(t, lsn, got)
	require.NoError(t, f.Close())
}

// TestOpenOptionMismatch: the window capacity and the retention horizon are
// recorded; a restart with other values is refused (a shorter horizon would
// silently forget live sessions). SetRecordedOptions changes them where that
// is safe — longer, larger — and refuses the rest without changing anything.
func TestOpenOptionMismatch(t *testing.T) {
	dir := t.TempDir()
	base := follower.Options{Store: store.Options{Shard: 2, WindowCapacity: 1000, RetentionHorizon: time.Hour, Logger: quietLogger}}
	appliedStore(t, dir, base)
	before := testutil.TreeState(t, dir)

	for name, mod := range map[string]func(*follower.Options){
		"shorter horizon": func(o *follower.Options) { o.Store.RetentionHorizon = time.Minute },
		"longer horizon":  func(o *follower.Options) { o.Store.RetentionHorizon = 2 * time.Hour },
		"smaller window":  func(o *follower.Options) { o.Store.WindowCapacity = 10 },
		"default window":  func(o *follower.Options) { o.Store.WindowCapacity = 0 },
	} {
		o := base
		mod(&o)
		_, err := follower.Open(dir, &o)
		var me *store.MismatchError
		require.ErrorAs(t, err, &me, name)
		require.Equal(t, 1000, me.Found.WindowCapacity, name)
		require.Equal(t, time.Hour, me.Found.RetentionHorizon, name)
	}
	require.Equal(t, before, testutil.TreeState(t, dir))

	// Unsafe changes are refused and change nothing.
	for name, mod := range map[string]func(*follower.Options){
		"shorter horizon": func(o *follower.Options) { o.Store.RetentionHorizon = time.Minute },
		"smaller window":  func(o *follower.Options) { o.Store.WindowCapacity = 999 },
		"other shard":     func(o *follower.Options) { o.Store.Shard = 3 },
	} {
		o := base
		mod(&o)
		old, err := store.SetRecordedOptions(dir, &o.Store)
		require.ErrorIs(t, err, store.ErrUnsafeOptionChange, name)
		require.Equal(t, 1000, old.WindowCapacity)
	}
	require.Equal(t, before, testutil.TreeState(t, dir))

	grown := base
	grown.Store.WindowCapacity, grown.Store.RetentionHorizon = 5000, 48*time.Hour
	old, err := store.SetRecordedOptions(dir, &grown.Store)
	require.NoError(t, err)
	require.Equal(t, store.Identity{Kind: store.KindShardStore, Shard: 2, WindowCapacity: 1000, RetentionHorizon: time.Hour}, old)
	_, err = follower.Open(dir, &base)
	require.ErrorIs(t, err, store.ErrMismatch, "the old options no longer match")
	f, err := follower.Open(dir, &grown)
	require.NoError(t, err)
	require.Equal(t, 5000, f.Stats().WindowCapacity)
	id, ok, err := store.ReadIdentity(f.View())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 48*time.Hour, id.RetentionHorizon)
	require.NoError(t, f.Close())
}

// TestOpenWrongLayout: a node directory, a WAL directory, a leader's
// directory or a directory of unrelated files given as a single store are
// refused before anything is written (older binaries created a Pebble store
// inside them, or left a LOCK file behind), and a single store given as a
// node directory is refused by OpenNode.
func TestOpenWrongLayout(t *testing.T) {
	root := t.TempDir()
	node := filepath.Join(root, "node")
	n, err := follower.OpenNode(node, []uint32{0, 1}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger}}})
	require.NoError(t, err)
	require.NoError(t, n.Close())

	walDir := filepath.Join(root, "wal")
	w, err := wal.OpenWriter(walDir, &wal.WriterOptions{Shard: 0})
	require.NoError(t, err)
	_, err = w.Append(1, []wal.Event{{Op: wal.OpPut, Key: []byte("k")}})
	require.NoError(t, err)
	require.NoError(t, w.Close())

	leaderDir := filepath.Join(root, "leader")
	require.NoError(t, os.MkdirAll(filepath.Join(leaderDir, store.LeaderWALDirName), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(leaderDir, store.LeaderLockFileName), nil, 0o644))

	random := filepath.Join(root, "random")
	require.NoError(t, os.MkdirAll(random, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(random, "notes.txt"), []byte("hello"), 0o644))

	for _, c := range []struct {
		dir   string
		found store.Layout
	}{{node, store.LayoutNode}, {walDir, store.LayoutWAL}, {leaderDir, store.LayoutLeader}, {random, store.LayoutOther}} {
		before := testutil.TreeState(t, c.dir)
		_, err := follower.Open(c.dir, &follower.Options{Store: store.Options{Logger: quietLogger}})
		require.ErrorIs(t, err, store.ErrWrongLayout, c.dir)
		var le *store.LayoutError
		require.ErrorAs(t, err, &le)
		require.Equal(t, c.found, le.Found, err.Error())
		require.Equal(t, before, testutil.TreeState(t, c.dir), "refused open of %s changed it", c.dir)
		require.NoFileExists(t, filepath.Join(c.dir, "LOCK"))
	}

	storeDir := store.ShardDir(node, 1)
	before := testutil.TreeState(t, storeDir)
	for _, dir := range []string{storeDir, walDir, leaderDir, random} {
		_, err = follower.OpenNode(dir, []uint32{0}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger}}})
		require.ErrorIs(t, err, store.ErrWrongLayout, dir)
	}
	require.Equal(t, before, testutil.TreeState(t, storeDir))
	require.NoDirExists(t, filepath.Join(storeDir, "shard-0000"))
}

// TestOpenNotOncewalStore: a Pebble store that is not oncewal's is refused
// unchanged (store.ErrNotStore).
func TestOpenNotOncewalStore(t *testing.T) {
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{Logger: store.FatalLogger{}})
	require.NoError(t, err)
	require.NoError(t, db.Set([]byte("users/1"), []byte("alice"), pebble.Sync))
	require.NoError(t, db.Close())
	before := testutil.TreeState(t, dir)
	_, err = follower.Open(dir, &follower.Options{Store: store.Options{Logger: quietLogger}})
	require.ErrorIs(t, err, store.ErrNotStore)
	require.Equal(t, before, testutil.TreeState(t, dir))
}

// TestOpenAdoptsStoreWithoutIdentity: a store written before the identity
// was recorded opens and gets the identity of the options it was opened
// with; inside a node's shard directory, its name still fixes the shard.
func TestOpenAdoptsStoreWithoutIdentity(t *testing.T) {
	root := t.TempDir()
	dir := store.ShardDir(root, 4)
	lsn := appliedStore(t, dir, follower.Options{Store: store.Options{Shard: 4}})
	db, err := pebble.Open(dir, &pebble.Options{Logger: store.FatalLogger{}})
	require.NoError(t, err)
	require.NoError(t, db.Delete([]byte(keyspace.MetaIdentity), pebble.Sync))
	require.NoError(t, db.Close())

	_, err = follower.Open(dir, &follower.Options{Store: store.Options{Shard: 0, Logger: quietLogger}})
	require.ErrorIs(t, err, store.ErrMismatch, "shard-0004 opened as shard 0")

	f, err := follower.Open(dir, &follower.Options{Store: store.Options{Shard: 4, WindowCapacity: 77, Logger: quietLogger}})
	require.NoError(t, err)
	got, _ := f.Position()
	require.Equal(t, lsn, got)
	id, ok, err := store.ReadIdentity(f.View())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 77, id.WindowCapacity)
	require.NoError(t, f.Close())
	_, err = follower.Open(dir, &follower.Options{Store: store.Options{Shard: 4, Logger: quietLogger}})
	require.ErrorIs(t, err, store.ErrMismatch, "the adopted identity is enforced")
}

// TestOpenNewStoreRecordsIdentity: a new store records its identity at once
// (before any batch), and it marks the store as oncewal's.
func TestOpenNewStoreRecordsIdentity(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	f, err := follower.Open(dir, &follower.Options{Store: store.Options{Shard: 9, Logger: quietLogger}})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, err = follower.Open(dir, &follower.Options{Store: store.Options{Shard: 8, Logger: quietLogger}})
	require.ErrorIs(t, err, store.ErrMismatch)
	f, err = follower.Open(dir, &follower.Options{Store: store.Options{Shard: 9, Logger: quietLogger}})
	require.NoError(t, err)
	_, _, ok, err := store.ReadMeta(f.View())
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, f.Close())
}

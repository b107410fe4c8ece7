package follower_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/snapshot"
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
	n, err := follower.OpenNode(dir, []uint32{0, 1}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger}}})
	require.NoError(t, err)
	w := recordLog(t, sim.WorkloadOptions{Seed: 3, Sessions: 2, Requests: 12, BatchSize: 4}, 1, nil)
	for _, s := range []uint32{0, 1} {
		for _, b := range encodeLog(t, w, s, 1)[:2] {
			_, err := n.Apply(b)
			require.NoError(t, err)
		}
	}
	require.NoError(t, n.Close())
	flipSSTByte(t, store.ShardDir(dir, 1))
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
// store.ErrCorrupt (in the corruption class, naming the store and the
// remedy) from every way the library opens or reads a store — never a
// panic (Pebble's DataCorruption default calls Logger.Fatalf, which the
// FatalLogger turns into one) — and nothing on disk changes.
func TestDamagedStoreIsAnError(t *testing.T) {
	dir, _ := damagedNode(t)
	storeDir := store.ShardDir(dir, 1)
	for _, tc := range []struct {
		name string
		open func() error
	}{
		{"Open", func() error {
			f, err := follower.Open(storeDir, &follower.Options{Store: store.Options{Shard: 1, Logger: quietLogger}})
			if err == nil {
				_ = f.Close()
			}
			return err
		}},
		{"Describe", func() error { _, err := store.Describe(vfs.Default, storeDir); return err }},
		{"OpenNode of the damaged shard alone", func() error {
			n, err := follower.OpenNode(dir, []uint32{1}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger}}})
			if err == nil {
				_ = n.Close()
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := storeDigest(t, storeDir)
			err := tc.open()
			require.ErrorIs(t, err, store.ErrCorrupt)
			require.ErrorIs(t, err, corruption.Err)
			require.ErrorContains(t, err, storeDir)
			require.ErrorContains(t, err, "checksum mismatch")
			require.ErrorContains(t, err, "--rebuild=auto")
			require.Equal(t, before, storeDigest(t, storeDir), "a refused open changed the store")
		})
	}
}

// TestNodeServesAroundDamagedShard: a node whose shard 1 store is damaged
// opens; shard 0 applies as before, shard 1 is down (Stats Err, Down) and
// refuses its batches with store.ErrCorrupt, its store untouched.
func TestNodeServesAroundDamagedShard(t *testing.T) {
	dir, batches := damagedNode(t)
	storeDir := store.ShardDir(dir, 1)
	before := storeDigest(t, storeDir)
	n, err := follower.OpenNode(dir, []uint32{0, 1}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger}}})
	require.NoError(t, err)
	defer n.Close()

	st := n.Stats()
	require.Equal(t, 1, st.Down)
	require.NoError(t, st.Shards[0].Err)
	require.ErrorIs(t, st.Shards[1].Err, store.ErrCorrupt)

	res, err := n.Apply(batches[2])
	require.NoError(t, err)
	require.False(t, res.Ack.Refused)
	lsn, _, err := n.Position(0)
	require.NoError(t, err)
	require.Equal(t, res.Ack.AppliedLSN, lsn)

	w := recordLog(t, sim.WorkloadOptions{Seed: 3, Sessions: 2, Requests: 12, BatchSize: 4}, 1, nil)
	res, err = n.Apply(encodeLog(t, w, 1, 1)[2])
	require.ErrorIs(t, err, store.ErrCorrupt)
	require.True(t, res.Ack.Refused)
	_, _, err = n.Position(1)
	require.ErrorIs(t, err, store.ErrCorrupt)
	require.NoError(t, n.Close())
	require.Equal(t, before, storeDigest(t, storeDir), "the node changed the damaged store")
}

// TestNodeRebuildsDamagedShard: a node of two shards replicates from a
// leader and stops; one byte of shard 1's sstable is flipped. Reopened with
// Rebuild auto, the node opens with shard 1 down (store.ErrCorrupt), serves
// shard 0, rebuilds shard 1 from the leader's snapshot, and ends equal to
// the oracle with exactly one rebuild, of shard 1.
func TestNodeRebuildsDamagedShard(t *testing.T) {
	w := sim.GenerateWorkload(sim.WorkloadOptions{Seed: 21, Sessions: 4, Requests: 60, BatchSize: 6})
	clock := sim.NewClock(w.Options.Start)
	trs := []*inprocess.Transport{inprocess.New(inprocess.FaultsNone, 1), inprocess.New(inprocess.FaultsNone, 2)}
	defer trs[0].Close()
	defer trs[1].Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, ran := runLeader(t, ctx, dir+"/leader", clock, 2, []string{"node"}, 0,
		func(s uint32) replication.Listener { return trs[s] })
	defer l.Close()
	donors := shardDonors(t, l)
	c := sim.NewClient(w, 2, clock)
	for !c.Done() {
		_, err := c.Send(l)
		require.NoError(t, err)
	}
	opts := &follower.NodeOptions{Follower: follower.Options{Store: store.Options{ID: "node", Logger: quietLogger}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 20 * time.Millisecond, Rebuild: follower.RebuildAuto, RebuildFrom: snapshot.NewRouter(func(s uint32) snapshot.Source { return donors[s] })}, ReopenBackoff: time.Millisecond}
	serve := func(n *follower.Node) { serveNodeUntilCaughtUp(t, ctx, n, trs, c)() }
	n, err := follower.OpenNode(dir+"/node", []uint32{0, 1}, opts)
	require.NoError(t, err)
	serve(n)
	require.NoError(t, n.Close())
	flipSSTByte(t, store.ShardDir(dir+"/node", 1))

	n, err = follower.OpenNode(dir+"/node", []uint32{0, 1}, opts)
	require.NoError(t, err)
	defer n.Close()
	require.ErrorIs(t, n.Stats().Shards[1].Err, store.ErrCorrupt)
	serve(n)
	require.NoError(t, c.Oracle().Verify(sim.RoutedState{Router: l.Router(), Node: n}))
	for _, ss := range n.Stats().Shards {
		require.Equal(t, int(ss.Shard), ss.Rebuilds, "shard %d", ss.Shard)
		require.NoError(t, ss.Err, "shard %d", ss.Shard)
	}
	require.NoError(t, n.Close())
	cancel()
	<-ran
}

// TestDamagedBlockMetWhileApplying: a store with one byte flipped in a
// block Open does not read opens; the batch whose reads meet the block
// fails the store (store.ErrFailed, sticky: the next batch is
// refused the same way, no retry loop), with Pebble's corruption, which
// CorruptStoreError types. The block is found by flipping one byte at each
// twentieth of the sstable in turn (the store is written the same way every
// run) until Open succeeds and applying meets it.
func TestDamagedBlockMetWhileApplying(t *testing.T) {
	pristine := filepath.Join(t.TempDir(), "s")
	w := recordLog(t, sim.WorkloadOptions{Seed: 4, Sessions: 600, Requests: 3000, BatchSize: 600}, 1, nil)
	batches := encodeLog(t, w, 0, 1)
	f, err := follower.Open(pristine, &follower.Options{Store: store.Options{Logger: quietLogger}})
	require.NoError(t, err)
	half := len(batches) / 2
	for _, b := range batches[:half] {
		_, err := f.Apply(b)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())
	ssts, err := filepath.Glob(filepath.Join(pristine, "*.sst"))
	require.NoError(t, err)
	require.Len(t, ssts, 1)
	orig, err := os.ReadFile(ssts[0])
	require.NoError(t, err)

	for i := 1; i < 20; i++ {
		dir := filepath.Join(t.TempDir(), "s")
		require.NoError(t, os.CopyFS(dir, os.DirFS(pristine)))
		b := append([]byte(nil), orig...)
		b[len(b)*i/20] ^= 0xff
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(ssts[0])), b, 0o644))
		f, err := follower.Open(dir, &follower.Options{Store: store.Options{Logger: quietLogger}})
		if err != nil {
			require.ErrorIs(t, err, store.ErrCorrupt)
			continue // a block Open reads
		}
		var failed error
		for _, b := range batches[half:] {
			if _, err := f.Apply(b); err != nil {
				failed = err
				break
			}
		}
		if failed == nil {
			require.NoError(t, f.Close())
			continue // a block applying did not read
		}
		require.ErrorIs(t, failed, store.ErrFailed)
		require.ErrorIs(t, store.CorruptError(dir, failed), store.ErrCorrupt)
		_, err = f.Apply(batches[len(batches)-1])
		require.ErrorIs(t, err, store.ErrFailed, "the failure is sticky")
		_ = f.Close()
		t.Logf("byte %d of %d: Open succeeded, applying failed: %v", len(b)*i/20, len(b), failed)
		return
	}
	t.Fatal("no damaged block was met by applying but not by Open")
}

// TestRunRebuildsDamagedStore: a single store replicates from a leader and
// stops; one byte of its sstable is flipped. Run with Rebuild never returns
// store.ErrCorrupt and leaves the store as it was; with Rebuild auto it
// rebuilds the store from the leader's snapshot (the damage is the reason
// the Rebuilt hook gets) and serves on to the end of the log, equal to the
// oracle.
func TestRunRebuildsDamagedStore(t *testing.T) {
	w := sim.GenerateWorkload(sim.WorkloadOptions{Seed: 22, Sessions: 4, Requests: 60, BatchSize: 6})
	clock := sim.NewClock(w.Options.Start)
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, ran := runLeader(t, ctx, dir+"/leader", clock, 1, []string{"a"}, 0, func(uint32) replication.Listener { return tr })
	defer l.Close()
	donor := shardDonors(t, l)[0]
	c := sim.NewClient(w, 1, clock)
	half := false
	for !c.Done() && !half {
		_, err := c.Send(l)
		require.NoError(t, err)
		half = c.LastLSN(0) > 30
	}
	opts := func(mode follower.RebuildMode) *follower.Options {
		return &follower.Options{Store: store.Options{ID: "a", Logger: quietLogger}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 20 * time.Millisecond, Rebuild: mode, RebuildFrom: donor}
	}
	storeDir := dir + "/a"
	f, stop := serveFollower(t, ctx, storeDir, opts(follower.RebuildNever), tr)
	waitLSN(t, ctx, f, c.LastLSN(0))
	stop()
	flipSSTByte(t, storeDir)
	for !c.Done() {
		_, err := c.Send(l)
		require.NoError(t, err)
	}

	before := storeDigest(t, storeDir)
	err := follower.Run(ctx, storeDir, opts(follower.RebuildNever), tr, nil)
	require.ErrorIs(t, err, store.ErrCorrupt)
	require.Equal(t, before, storeDigest(t, storeDir), "Run without rebuilds changed the damaged store")

	reasons, err := runUntilCaughtUp(t, ctx, storeDir, opts(follower.RebuildAuto), tr, c.LastLSN(0), c.Oracle())
	require.NoError(t, err)
	require.Len(t, reasons, 1)
	require.ErrorIs(t, reasons[0], store.ErrCorrupt)
	cancel()
	<-ran
}

// lockCountFS counts the locks taken on one file and the listings of one
// directory (every open of a store lists it; so does the node's check for a
// replaced store).
type lockCountFS struct {
	vfs.FS
	lock, dir    string
	locks, lists atomic.Int64
}

func (fs *lockCountFS) Lock(name string) (io.Closer, error) {
	if filepath.Clean(name) == fs.lock {
		fs.locks.Add(1)
	}
	return fs.FS.Lock(name)
}

func (fs *lockCountFS) List(dir string) ([]string, error) {
	if filepath.Clean(dir) == fs.dir {
		fs.lists.Add(1)
	}
	return fs.FS.List(dir)
}

// TestNodeLeavesDamagedShardAlone (invariant 3): a serving node with Rebuild
// never does not open its damaged shard's store again while the store is
// unchanged — it takes no lock on it, which oncewal inspect of the running
// node would meet as store.ErrLocked instead of the damage (a flaky
// TestRealProcessDamagedStore) — and changes nothing in it; once the
// operator restores the damaged sstable, the node opens the store again.
func TestNodeLeavesDamagedShardAlone(t *testing.T) {
	dir, _ := damagedNode(t)
	storeDir := store.ShardDir(dir, 1)
	before := storeDigest(t, storeDir)
	fs := &lockCountFS{FS: vfs.Default, lock: filepath.Join(storeDir, "LOCK"), dir: storeDir}
	n, err := follower.OpenNode(dir, []uint32{0, 1}, &follower.NodeOptions{
		Follower:      follower.Options{Store: store.Options{FS: fs, Logger: quietLogger}, Rebuild: follower.RebuildNever},
		ReopenBackoff: time.Millisecond,
	})
	require.NoError(t, err)
	defer n.Close()
	require.ErrorIs(t, n.Stats().Shards[1].Err, store.ErrCorrupt)
	locks, lists := fs.locks.Load(), fs.lists.Load()
	require.Positive(t, locks, "the open that found the damage takes the lock")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	served := make(chan error, 1)
	go func() {
		served <- n.Serve(ctx, func(s uint32) replication.Dialer {
			if s == 1 {
				return tr
			}
			return nil
		})
	}()
	waitNode(t, ctx, n, "the node to look at the damaged shard ten times", func() bool { return fs.lists.Load() >= lists+10 })
	require.Equal(t, locks, fs.locks.Load(), "the node opened its damaged store again")
	require.Equal(t, before, storeDigest(t, storeDir), "the node changed the damaged store")

	// The operator restores the sstable from a copy, renamed into place.
	ssts, err := filepath.Glob(filepath.Join(storeDir, "*.sst"))
	require.NoError(t, err)
	b, err := os.ReadFile(ssts[0])
	require.NoError(t, err)
	b[16] ^= 0xff
	restored := filepath.Join(t.TempDir(), "restored.sst")
	require.NoError(t, os.WriteFile(restored, b, 0o644))
	require.NoError(t, os.Rename(restored, ssts[0]))
	waitNode(t, ctx, n, "the restored store to open", func() bool { return n.Stats().Shards[1].Err == nil })
	require.Greater(t, fs.locks.Load(), locks)
	require.Equal(t, 1, n.Stats().Shards[1].Reopens)
	cancel()
	require.NoError(t, <-served)
	require.NoError(t, n.Close())
}

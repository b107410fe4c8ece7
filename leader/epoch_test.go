package leader_test

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// refusedUnchanged opens dir with o, requires err to match every target,
// and dir to be exactly as it was (absent if it was).
func refusedUnchanged(t *testing.T, dir string, o leader.Options, targets ...error) error {
	t.Helper()
	_, statErr := os.Stat(dir)
	var before map[string]string
	if statErr == nil {
		before = testutil.TreeState(t, dir)
	}
	o.Store.Logger, o.Logger = discard(), discard()
	_, err := leader.Open(dir, &o)
	for _, target := range targets {
		require.ErrorIs(t, err, target)
	}
	if statErr != nil {
		require.NoDirExists(t, dir, "a refused open created the directory")
	} else {
		require.Equal(t, before, testutil.TreeState(t, dir), "a refused open changed the directory")
	}
	return err
}

// appendN appends n events of one session to shard 0 and returns the
// headers.
func appendN(t *testing.T, l *leader.Leader, id session.ID, n int) []wal.Header {
	t.Helper()
	var hs []wal.Header
	for range n {
		h, err := l.Append(wal.Event{Op: wal.OpPut, Session: id, Key: []byte("k"), Value: []byte("v")})
		require.NoError(t, err)
		hs = append(hs, h)
	}
	return hs
}

func TestEpochBound(t *testing.T) {
	for _, epoch := range []uint64{replication.MaxEpoch + 1, math.MaxUint64} {
		dir := filepath.Join(t.TempDir(), "leader")
		refusedUnchanged(t, dir, leader.Options{Shards: 1, Epoch: epoch}, leader.ErrBadOptions, replication.ErrEpochExhausted)
	}
	// The bound itself is an epoch a leader may hold; nothing is above it
	// for a promotion (leader.Options.Promote, leader.Promote).
	dir := t.TempDir()
	l := open(t, dir, &leader.Options{Shards: 1, Epoch: replication.MaxEpoch})
	sh, _ := l.Shard(0)
	require.EqualValues(t, replication.MaxEpoch, sh.Epoch())
	appendN(t, l, session.ID{1}, 2)
	require.NoError(t, l.Close())

	fdir := t.TempDir()
	feed(t, store.ShardDir(fdir, 0), filepath.Join(dir, leader.WALDirName), 1, 2)
	refusedUnchanged(t, fdir, leader.Options{Shards: 1, Promote: true}, replication.ErrEpochExhausted)
	for _, epoch := range []uint64{0, replication.MaxEpoch + 1, math.MaxUint64} {
		f, err := follower.Open(store.ShardDir(fdir, 0), quiet())
		require.NoError(t, err)
		_, err = leader.Promote(retire(t, f), leader.PromoteOptions{WALDir: filepath.Join(t.TempDir(), "wal"), Epoch: epoch})
		require.ErrorIs(t, err, replication.ErrEpochExhausted, "PromoteOptions.Epoch %d", epoch)
		_, stored := f.Position()
		require.EqualValues(t, replication.MaxEpoch, stored)
		require.NoError(t, f.Close())
	}
}

// TestLostStoreTwoEpochs: a leader restarted once with a higher epoch
// loses a shard's store. It rebuilds the store from its WAL and serves at
// the epoch of the WAL's last batch, with the boundary the log shows, and
// appends nothing stale. (It served at epoch 1, appended an epoch-1 batch
// after the epoch-2 ones and never started again.)
func TestLostStoreTwoEpochs(t *testing.T) {
	dir := t.TempDir()
	id := testutil.SessionID(rand.New(rand.NewPCG(3, 3)))
	l := open(t, dir, &leader.Options{Shards: 1})
	_, err := l.Append(wal.Event{Op: wal.OpOpen, Session: id})
	require.NoError(t, err)
	appendN(t, l, id, 3)
	require.NoError(t, l.Close())
	l = open(t, dir, &leader.Options{Shards: 1, Epoch: 2})
	two := appendN(t, l, id, 3)
	require.NoError(t, l.Close())

	require.NoError(t, os.RemoveAll(store.ShardDir(dir, 0)))
	refusedUnchanged(t, dir, leader.Options{Shards: 1, Epoch: 1}, replication.ErrStaleEpoch)

	l = open(t, dir, &leader.Options{Shards: 1})
	sh, _ := l.Shard(0)
	require.EqualValues(t, 2, sh.Epoch())
	require.Equal(t, two[0].FirstLSN, sh.Log().EpochStartLSN())
	hs := appendN(t, l, id, 2)
	require.EqualValues(t, 2, hs[0].Epoch)
	require.Equal(t, two[2].LastLSN()+1, hs[0].FirstLSN, "the session continues where the log left it")
	require.NoError(t, l.Close())
	info, err := wal.InspectFS(vfs.Default, filepath.Join(dir, leader.WALDirName), 0)
	require.NoError(t, err)
	require.EqualValues(t, 2, info.LastEpoch)

	// It starts again, at the same epoch or a raised one.
	l = open(t, dir, &leader.Options{Shards: 1})
	require.NoError(t, l.Close())
	l = open(t, dir, &leader.Options{Shards: 1, Epoch: 3})
	sh, _ = l.Shard(0)
	require.EqualValues(t, 3, sh.Epoch())
	require.NoError(t, l.Close())
}

// TestRegressedLogWayOut: a log an older binary damaged (an epoch-1 batch
// after epoch-2 ones) is refused, unchanged, with the LSN, both epochs and
// the command that cuts it; after the cut the leader starts at epoch 2 with
// everything it had acknowledged.
func TestRegressedLogWayOut(t *testing.T) {
	dir := t.TempDir()
	walDir := filepath.Join(dir, leader.WALDirName)
	id := testutil.SessionID(rand.New(rand.NewPCG(5, 5)))
	l := open(t, dir, &leader.Options{Shards: 1})
	_, err := l.Append(wal.Event{Op: wal.OpOpen, Session: id})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	l = open(t, dir, &leader.Options{Shards: 1, Epoch: 2})
	acked := appendN(t, l, id, 2)
	require.NoError(t, l.Close())
	// The stale batch, appended as the old binary did.
	end := acked[1].LastLSN()
	stale, err := wal.AppendBatch(nil, 0, 1, end+1, []wal.Event{{Op: wal.OpPut, Session: id, Seq: 4, Time: 1, Key: []byte("x")}})
	require.NoError(t, err)
	segs, err := filepath.Glob(filepath.Join(walDir, "*.wal"))
	require.NoError(t, err)
	f, err := os.OpenFile(segs[len(segs)-1], os.O_RDWR, 0)
	require.NoError(t, err)
	st, err := f.Stat()
	require.NoError(t, err)
	dataEnd, err := wal.DataEnd(f, st.Size()) // after the batches, over the zeros written ahead
	require.NoError(t, err)
	_, err = f.WriteAt(stale, dataEnd)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	err = refusedUnchanged(t, dir, leader.Options{Shards: 1}, leader.ErrEpochRegression, wal.ErrEpochRegression)
	require.ErrorContains(t, err, "LSN 4 holds a batch of epoch 1 after a batch of epoch 2")
	require.ErrorContains(t, err, "oncewal waldump --cut-epoch-regression --shard 0 "+walDir)

	cut, err := wal.CutEpochRegression(vfs.Default, walDir, 0, dir)
	require.NoError(t, err)
	require.Equal(t, end+1, cut.LSN)
	l = open(t, dir, &leader.Options{Shards: 1})
	sh, _ := l.Shard(0)
	require.EqualValues(t, 2, sh.Epoch())
	require.Equal(t, end+1, sh.NextLSN(), "every acknowledged batch is kept")
	h := appendN(t, l, id, 1)[0]
	require.EqualValues(t, 2, h.Epoch)
	require.NoError(t, l.Close())
}

// TestLeaderOnFollowerDir: a follower's node directory is no leader's: a
// leader opened on it would serve at the live leader's epoch without
// fencing it. Refused, unchanged, until promoted (Options.Promote, what
// oncewal promote sets); the promoted directory then opens as a leader's.
func TestLeaderOnFollowerDir(t *testing.T) {
	src := t.TempDir()
	l := open(t, src, &leader.Options{Shards: 1, Epoch: 4})
	appendN(t, l, session.ID{7}, 3)
	require.NoError(t, l.Close())
	fdir := t.TempDir()
	feed(t, store.ShardDir(fdir, 0), filepath.Join(src, leader.WALDirName), 1, 3)

	for _, epoch := range []uint64{0, 4, 5} {
		err := refusedUnchanged(t, fdir, leader.Options{Shards: 1, Epoch: epoch}, leader.ErrNotLeaderStore)
		require.ErrorContains(t, err, "oncewal promote --dir "+fdir)
	}
	// Also a follower node that never received anything.
	empty := t.TempDir()
	n, err := follower.OpenNode(empty, []uint32{0}, &follower.NodeOptions{ShardCount: 1, Follower: *quiet()})
	require.NoError(t, err)
	require.NoError(t, n.Close())
	refusedUnchanged(t, empty, leader.Options{Shards: 1}, leader.ErrNotLeaderStore)
	// A promotion must raise the epoch above what the store has seen.
	refusedUnchanged(t, fdir, leader.Options{Shards: 1, Epoch: 4, Promote: true}, replication.ErrStaleEpoch)

	l = open(t, fdir, &leader.Options{Shards: 1, Promote: true})
	sh, _ := l.Shard(0)
	require.EqualValues(t, 5, sh.Epoch())
	require.EqualValues(t, 4, sh.Log().EpochStartLSN())
	require.NoError(t, l.Close())
	l = open(t, fdir, &leader.Options{Shards: 1})
	sh, _ = l.Shard(0)
	require.EqualValues(t, 5, sh.Epoch(), "a promoted store is a leader's")
	require.NoError(t, l.Close())
}

// TestShardCountFixed: the shard count is recorded when the directory is
// created, or taken once from what a directory without the record holds;
// any other count is refused, before anything is created.
func TestShardCountFixed(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, &leader.Options{Shards: 2})
	require.NoError(t, l.Close())
	n, ok, err := store.ReadShardCount(vfs.Default, dir)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 2, n)

	err = refusedUnchanged(t, dir, leader.Options{Shards: 3}, store.ErrShardCount)
	require.ErrorContains(t, err, "holds a deployment of 2 shards (recorded in SHARDS), not 3")
	require.ErrorContains(t, err, "--shards 2")
	refusedUnchanged(t, dir, leader.Options{Shards: 1}, leader.ErrForeignShard)

	// A directory from before the record: counted from what it holds, then
	// recorded.
	require.NoError(t, os.Remove(filepath.Join(dir, store.ShardCountFileName)))
	err = refusedUnchanged(t, dir, leader.Options{Shards: 3}, store.ErrShardCount)
	require.ErrorContains(t, err, "counted from its stores and WAL segments")
	l = open(t, dir, &leader.Options{Shards: 2})
	require.NoError(t, l.Close())
	require.FileExists(t, filepath.Join(dir, store.ShardCountFileName))
}

// TestFailedStartLeavesNothing: a store lost under a log that no longer
// starts at LSN 1 cannot be rebuilt; the refusal creates no empty store.
func TestFailedStartLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, &leader.Options{Shards: 1, SegmentSize: 1})
	appendN(t, l, session.ID{9}, 4)
	require.NoError(t, l.Close())
	segs, err := filepath.Glob(filepath.Join(dir, leader.WALDirName, "*.wal"))
	require.NoError(t, err)
	require.Greater(t, len(segs), 2)
	require.NoError(t, os.Remove(segs[0]))
	require.NoError(t, os.RemoveAll(store.ShardDir(dir, 0)))
	err = refusedUnchanged(t, dir, leader.Options{Shards: 1}, wal.ErrCompacted)
	require.ErrorContains(t, err, "starts at LSN 2")
}

// retire hands f's store over for a promotion (follower.Follower.Retire).
func retire(t testing.TB, f *follower.Follower) *store.Store {
	t.Helper()
	st, err := f.Retire()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestLeaderBelowPromise: a store that promised epoch 6 to a fencing leader
// (store.Store.Promise, an automatic failover) is never served below it:
// leader.Open refuses a promotion at 5, and the default one (the store's
// epoch + 1 = 5), with ErrStaleEpoch naming the promise and changing
// nothing; so does Promote on the open store. Promoting at the promised
// epoch — the election's winner — serves, and the leader's own batches
// pass its store's fence.
func TestLeaderBelowPromise(t *testing.T) {
	src := t.TempDir()
	l := open(t, src, &leader.Options{Shards: 1, Epoch: 4})
	appendN(t, l, session.ID{7}, 3)
	require.NoError(t, l.Close())
	fdir := t.TempDir()
	sdir := store.ShardDir(fdir, 0)
	feed(t, sdir, filepath.Join(src, leader.WALDirName), 1, 3)

	st, err := store.Open(sdir, &store.Options{Logger: discard()})
	require.NoError(t, err)
	_, err = st.Promise(6)
	require.NoError(t, err)
	_, err = leader.Promote(st, leader.PromoteOptions{WALDir: t.TempDir(), Epoch: 5})
	require.ErrorIs(t, err, replication.ErrStaleEpoch)
	require.ErrorContains(t, err, "leader epoch 5 is below epoch 6, which the store of shard 0 promised to a fencing leader")
	require.NoError(t, st.Close())

	for _, epoch := range []uint64{5, 0} {
		err := refusedUnchanged(t, fdir, leader.Options{Shards: 1, Epoch: epoch, Promote: true}, replication.ErrStaleEpoch)
		require.ErrorContains(t, err, "leader epoch 5 is below epoch 6, which store "+sdir+" promised to a fencing leader")
	}
	l = open(t, fdir, &leader.Options{Shards: 1, Epoch: 6, Promote: true})
	sh, _ := l.Shard(0)
	require.EqualValues(t, 6, sh.Epoch())
	require.EqualValues(t, 4, sh.Log().EpochStartLSN())
	hs := appendN(t, l, session.ID{7}, 1)
	require.EqualValues(t, 6, hs[0].Epoch)
	require.NoError(t, l.Close())
}

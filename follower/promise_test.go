package follower_test

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// switchDialer dials whichever transport it points at: the leader a
// failover publishes.
type switchDialer struct {
	to atomic.Pointer[inprocess.Transport]
}

func (d *switchDialer) Dial(ctx context.Context, hello replication.Ack) (replication.FollowerConn, error) {
	return d.to.Load().Dial(ctx, hello)
}

// TestNodePromiseFencesLeader: a failover by promises, with real leaders.
// Two follower nodes of a leader at epoch 1 promise epoch 5 (Node.Promise),
// each answering its position. The deposed leader's later appends are
// never acknowledged by them — its next batch is refused (counted as a
// stale_epoch refusal, the link redialled), WaitAcked(AckAll) runs out,
// its view of their acks stays at what they promised at — and their
// positions stay where Promise reported. Then node-2's store is promoted
// at the promised epoch (leader.Open, Promote) and node-1, pointed at it,
// takes its epoch-5 batches from exactly its promised position.
func TestNodePromiseFencesLeader(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	old := inprocess.New(inprocess.FaultsNone, 1)
	defer old.Close()
	l, err := leader.Open(t.TempDir(), &leader.Options{Shards: 1, Epoch: 1, Followers: []string{"node-1", "node-2"},
		Listener: func(uint32) replication.Listener { return old }, Logger: quietLogger, Store: store.Options{Logger: quietLogger}})
	require.NoError(t, err)
	defer l.Close()
	lrun := make(chan error, 1)
	go func() { lrun <- l.Run(ctx) }()

	dirs := map[string]string{"node-1": filepath.Join(t.TempDir(), "n1"), "node-2": filepath.Join(t.TempDir(), "n2")}
	nodes := map[string]*follower.Node{}
	dialers := map[string]*switchDialer{}
	served := map[string]chan error{}
	for _, id := range []string{"node-1", "node-2"} {
		n, err := follower.OpenNode(dirs[id], []uint32{0}, &follower.NodeOptions{
			Follower: follower.Options{Store: store.Options{ID: id, Logger: quietLogger},
				ReconnectBackoff: 5 * time.Millisecond, MaxReconnectBackoff: 50 * time.Millisecond}})
		require.NoError(t, err)
		defer n.Close()
		d := &switchDialer{}
		d.to.Store(old)
		done := make(chan error, 1)
		nodes[id], dialers[id], served[id] = n, d, done
		// The goroutine gets its channel, not the map the loop writes on.
		go func() { done <- n.Serve(ctx, func(uint32) replication.Dialer { return d }) }()
	}

	id := session.ID{7}
	put := func(l *leader.Leader) wal.Header {
		h, err := l.Append(wal.Event{Op: wal.OpPut, Session: id, Key: []byte("k"), Value: []byte("v")})
		require.NoError(t, err)
		return h
	}
	for range 3 {
		put(l)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	require.NoError(t, l.WaitAcked(wctx, leader.AckAll))
	wcancel()

	promised := map[string]replication.Ack{}
	for id, n := range nodes {
		acks, err := n.Promise(5)
		require.NoError(t, err)
		require.Len(t, acks, 1)
		require.Equal(t, uint64(3), acks[0].AppliedLSN, id)
		require.Equal(t, uint64(1), acks[0].Epoch, id)
		promised[id] = acks[0]
	}
	put(l)
	put(l)
	// Each node meets the deposed leader's next batch and refuses it.
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			if n.Stats().Shards[0].Link.Refusals["stale_epoch"] == 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond)
	short, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	require.Error(t, l.WaitAcked(short, leader.AckAll), "a fenced follower acknowledged the deposed leader")
	scancel()
	for _, fs := range l.Stats()[0].Shipping.Followers {
		require.Equal(t, uint64(3), fs.AckedLSN, "the deposed leader counts %s past its promise", fs.ID)
	}
	for id, n := range nodes {
		applied, epoch, err := n.Position(0)
		require.NoError(t, err)
		require.Equal(t, [2]uint64{promised[id].AppliedLSN, promised[id].Epoch}, [2]uint64{applied, epoch}, id)
	}

	// Promote node-2's store at the promised epoch; node-1 follows it.
	require.NoError(t, nodes["node-2"].Close())
	<-served["node-2"]
	next := inprocess.New(inprocess.FaultsNone, 2)
	defer next.Close()
	l2, err := leader.Open(dirs["node-2"], &leader.Options{Shards: 1, Epoch: 5, Promote: true, Followers: []string{"node-1"},
		Listener: func(uint32) replication.Listener { return next }, Logger: quietLogger, Store: store.Options{Logger: quietLogger}})
	require.NoError(t, err)
	defer l2.Close()
	l2run := make(chan error, 1)
	go func() { l2run <- l2.Run(ctx) }()
	dialers["node-1"].to.Store(next)
	h := put(l2)
	require.Equal(t, wal.Header{Shard: 0, Epoch: 5, FirstLSN: 4, Count: 1}, wal.Header{Shard: h.Shard, Epoch: h.Epoch, FirstLSN: h.FirstLSN, Count: h.Count})
	wctx, wcancel = context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	require.NoError(t, l2.WaitAcked(wctx, leader.AckAll))
	applied, epoch, err := nodes["node-1"].Position(0)
	require.NoError(t, err)
	require.Equal(t, [2]uint64{4, 5}, [2]uint64{applied, epoch})

	cancel()
	require.NoError(t, <-served["node-1"])
	<-lrun
	<-l2run
}

// TestRebuildKeepsPromise: a store that promised epoch 7 and is then
// rebuilt from a donor at epoch 1 keeps its promise: the rebuild does not
// let it follow a leader the election deposed.
func TestRebuildKeepsPromise(t *testing.T) {
	dir := t.TempDir()
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	l, err := leader.Open(dir+"/leader", &leader.Options{Shards: 1, Epoch: 1, Followers: []string{"f1"}, Logger: quietLogger,
		Store: store.Options{Logger: quietLogger}, Listener: func(uint32) replication.Listener { return tr }})
	require.NoError(t, err)
	defer l.Close()
	for range 3 {
		_, err := l.Append(wal.Event{Op: wal.OpPut, Session: session.ID{7}, Key: []byte("k"), Value: []byte("v")})
		require.NoError(t, err)
	}
	donor, err := l.Donor(0, nil)
	require.NoError(t, err)
	defer donor.Close()

	storeDir := store.ShardDir(dir+"/node", 0)
	so := &follower.Options{Store: store.Options{Logger: quietLogger}}
	f, err := follower.Open(storeDir, so)
	require.NoError(t, err)
	_, err = f.Promise(7)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, err = f.Promise(8)
	require.ErrorIs(t, err, follower.ErrClosed)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, _, err := follower.Rebuild(ctx, storeDir, so, donor, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(3), m.Cut.AppliedLSN)
	info, err := store.PeekStore(nil, storeDir)
	require.NoError(t, err)
	require.Equal(t, uint64(7), info.Promise, "the rebuild undid the store's promise")
	require.Equal(t, uint64(3), info.Applied)
}

// TestNodePromisePerShard: Node.Promise answers every shard that promised,
// with its shard, and names every one that did not in a *PromiseError
// (errors.Is through its causes); an epoch no leader can have is refused
// before any store is touched.
func TestNodePromisePerShard(t *testing.T) {
	n, err := follower.OpenNode(t.TempDir(), []uint32{0, 1, 2}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger}}})
	require.NoError(t, err)
	defer n.Close()

	_, err = n.Promise(0)
	require.ErrorIs(t, err, store.ErrBadPromise)
	_, err = n.Promise(replication.MaxEpoch + 1)
	require.ErrorIs(t, err, replication.ErrEpochExhausted)
	for _, s := range n.Shards() {
		require.NoError(t, n.Follower(s, func(f *follower.Follower) error {
			require.Zero(t, f.Store().Promised(), "a refused promise touched shard %d", s)
			return nil
		}))
	}

	acks, err := n.Promise(3)
	require.NoError(t, err)
	require.Equal(t, map[uint32]replication.Ack{0: {Shard: 0}, 1: {Shard: 1}, 2: {Shard: 2}}, acks)

	// Shard 1's store closes under its follower: it alone fails.
	require.NoError(t, n.Follower(1, func(f *follower.Follower) error { return f.Store().Close() }))
	acks, err = n.Promise(4)
	var pe *follower.PromiseError
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, store.ErrClosed)
	require.Equal(t, []uint32{1}, slices.Collect(maps.Keys(pe.Failed)))
	require.ErrorContains(t, err, "shards [1] did not promise epoch 4 (the fencing leader cannot count them as fenced; ask them again once they serve): shard 1: store: closed")
	require.Equal(t, []uint32{0, 2}, slices.Sorted(maps.Keys(acks)))
}

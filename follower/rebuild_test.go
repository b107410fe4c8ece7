package follower_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/stretchr/testify/require"
)

// TestRebuildJoinsLateAndDivergedFollowers: a leader whose retention has
// deleted its log's start (the bound dropped a follower that never came),
// a live follower, a late follower with an empty store, one with a diverged
// history and one whose store is behind the retained log. With
// Rebuild=auto each is refused for its reason, rebuilt from the leader
// (its Donor, in process) and then replicates through the ordinary path;
// every one ends equal to the oracle. With Rebuild=never the refusal stands.
func TestRebuildJoinsLateAndDivergedFollowers(t *testing.T) {
	w := sim.GenerateWorkload(sim.WorkloadOptions{Seed: 11, Sessions: 6, Requests: 600, RetryRate: 0.1, CloseRate: 0.03, BatchSize: 12})
	clock := sim.NewClock(w.Options.Start)
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, ran := runLeader(t, ctx, dir+"/leader", clock, 1, []string{"live", "late", "diverged", "behind", "refused"}, 16<<10,
		func(uint32) replication.Listener { return tr })
	defer l.Close()
	donor, err := l.Donor(0, &snapshot.DonorOptions{RateLimit: -1})
	require.NoError(t, err)
	defer donor.Close()

	opts := func(id string, mode follower.RebuildMode) *follower.Options {
		return &follower.Options{Store: store.Options{ID: id, Logger: quietLogger, PebbleOptions: smallMemtable}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 20 * time.Millisecond, Rebuild: mode, RebuildFrom: donor, Snapshot: snapshot.Options{ChunkSize: 8 << 10}}
	}
	live, stopLive := serveFollower(t, ctx, dir+"/live", opts("live", follower.RebuildNever), tr)
	defer stopLive()

	// "behind" applies the start of the log, then stops.
	c := sim.NewClient(w, 1, clock)
	for range 5 {
		_, err := c.Send(l)
		require.NoError(t, err)
	}
	behind, stopBehind := serveFollower(t, ctx, dir+"/behind", opts("behind", follower.RebuildNever), tr)
	waitLSN(t, ctx, behind, c.LastLSN(0))
	stopBehind()
	// A diverged history: another workload's log, longer than this one.
	other, err := sim.Record(sim.GenerateWorkload(sim.WorkloadOptions{Seed: 12, Sessions: 3, Requests: 800, BatchSize: 12}), 1)
	require.NoError(t, err)
	batches, err := other.Encode(0, 0, 1)
	require.NoError(t, err)
	d, err := follower.Open(dir+"/diverged", opts("diverged", follower.RebuildNever))
	require.NoError(t, err)
	for _, raw := range batches {
		_, err := d.Apply(raw)
		require.NoError(t, err)
	}
	require.NoError(t, d.Close())

	for !c.Done() {
		_, err := c.Send(l)
		require.NoError(t, err)
		require.NoError(t, l.Retain())
	}
	last := c.LastLSN(0)
	waitLSN(t, ctx, live, last)
	require.NoError(t, l.Retain())
	st := l.Stats()[0]
	require.Greater(t, st.Retention.FirstLSN, uint64(1), "retention deleted the log's start: %+v", st)

	// Rebuild=never: the refusal stands (and is typed).
	o := opts("refused", follower.RebuildNever)
	o.StopOnPermanentRefusal = true
	err = follower.Run(ctx, dir+"/refused", o, tr, nil)
	require.ErrorIs(t, err, replication.ErrBehindRetention)

	var wg sync.WaitGroup
	for _, id := range []string{"late", "diverged", "behind"} {
		wg.Go(func() {
			reasons, err := runUntilCaughtUp(t, ctx, dir+"/"+id, opts(id, follower.RebuildAuto), tr, last, c.Oracle())
			require.NoError(t, err)
			require.Len(t, reasons, 1, id)
			want := replication.ErrBehindRetention
			if id == "diverged" {
				want = replication.ErrDiverged
			}
			require.ErrorIs(t, reasons[0], want, id)
		})
	}
	wg.Wait()
	require.NoError(t, c.Oracle().Verify(live.State()))
	require.Zero(t, donor.Serving(), "every snapshot released")
	cancel()
	<-ran
}

func serveFollower(t *testing.T, ctx context.Context, dir string, o *follower.Options, d replication.Dialer) (*follower.Follower, func()) {
	t.Helper()
	f, err := follower.Open(dir, o)
	require.NoError(t, err)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = f.Serve(sctx, d); close(done) }()
	var once sync.Once
	return f, func() {
		once.Do(func() {
			cancel()
			<-done
			require.NoError(t, f.Close())
		})
	}
}

// runLeader opens a leader in dir of shards shards on the clock, shipping
// over listen to followers, that keeps at most retained bytes of its log
// (4 KiB segments; retention passes only when the test calls Retain), and
// starts its Run with ctx: ran gets what Run returns.
func runLeader(t *testing.T, ctx context.Context, dir string, clock *sim.Clock, shards int, followers []string, retained int64,
	listen func(uint32) replication.Listener) (l *leader.Leader, ran <-chan error) {
	t.Helper()
	l, err := leader.Open(dir, &leader.Options{
		Shards: shards, Followers: followers, Wall: clock.Now,
		SegmentSize: 4 << 10, MaxRetainedBytes: retained, RetentionInterval: time.Hour,
		Logger: quietLogger, Store: store.Options{Logger: quietLogger, PebbleOptions: smallMemtable},
		Listener: listen,
		Shipping: leader.ShipperOptions{RetransmitTimeout: 20 * time.Millisecond, PollInterval: time.Millisecond},
	})
	require.NoError(t, err)
	r := make(chan error, 1)
	go func() { r <- l.Run(ctx) }()
	return l, r
}

// sendRetaining sends c's whole workload to l with a retention pass after
// every request, and checks that retention deleted the start of every
// shard's log: a follower that starts empty is refused as behind it.
func sendRetaining(t *testing.T, c *sim.Client, l *leader.Leader) {
	t.Helper()
	for !c.Done() {
		_, err := c.Send(l)
		require.NoError(t, err)
		require.NoError(t, l.Retain())
	}
	for _, st := range l.Stats() {
		require.Greater(t, st.Retention.FirstLSN, uint64(1), "shard %d: retention deleted the log's start", st.Shard)
	}
}

func waitLSN(t *testing.T, ctx context.Context, f *follower.Follower, lsn uint64) {
	t.Helper()
	for {
		if got, _ := f.Position(); got >= lsn {
			return
		}
		require.NoError(t, ctx.Err(), "follower never reached LSN %d", lsn)
		time.Sleep(2 * time.Millisecond)
	}
}

// TestNodeRebuildsEachRefusedShard: a node of two shards joins a leader
// whose retention deleted both logs' starts; with Rebuild=auto each shard
// is rebuilt from its own donor (one Source for the node: snapshot.Router)
// and the node ends equal to the oracle.
func TestNodeRebuildsEachRefusedShard(t *testing.T) {
	w := sim.GenerateWorkload(sim.WorkloadOptions{Seed: 13, Sessions: 8, Requests: 600, RetryRate: 0.1, CloseRate: 0.03, BatchSize: 12})
	clock := sim.NewClock(w.Options.Start)
	trs := []*inprocess.Transport{inprocess.New(inprocess.FaultsNone, 1), inprocess.New(inprocess.FaultsNone, 2)}
	defer trs[0].Close()
	defer trs[1].Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, ran := runLeader(t, ctx, dir+"/leader", clock, 2, []string{"gone", "node"}, 8<<10,
		func(s uint32) replication.Listener { return trs[s] })
	defer l.Close()
	donors := shardDonors(t, l)
	c := sim.NewClient(w, 2, clock)
	sendRetaining(t, c, l)
	n, err := follower.OpenNode(dir+"/node", []uint32{0, 1}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{ID: "node", Logger: quietLogger, PebbleOptions: smallMemtable}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 20 * time.Millisecond, Rebuild: follower.RebuildAuto, RebuildFrom: snapshot.NewRouter(func(s uint32) snapshot.Source { return donors[s] })}})
	require.NoError(t, err)
	stop := serveNodeUntilCaughtUp(t, ctx, n, trs, c)
	require.NoError(t, c.Oracle().Verify(sim.RoutedState{Router: l.Router(), Node: n}))
	for _, ss := range n.Stats().Shards {
		require.Equal(t, 1, ss.Rebuilds, "shard %d", ss.Shard)
	}
	stop()
	require.NoError(t, n.Close())
	cancel()
	<-ran
}

// TestDeposedLeaderRejoinsAsFollower: leader A ships to follower node B,
// which stops; A logs more and dies. B is promoted (a leader opened on its
// node directory at epoch 2). A's own shard store — which holds entries the
// new history does not — joins B as follower "a" with Rebuild=auto: it is
// refused as diverged, rebuilt from B's snapshot, and equals the history B
// continues.
func TestDeposedLeaderRejoinsAsFollower(t *testing.T) {
	w := sim.GenerateWorkload(sim.WorkloadOptions{Seed: 17, Sessions: 6, Requests: 400, RetryRate: 0.1, BatchSize: 12})
	clock := sim.NewClock(w.Options.Start)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// stop ends a leader's Run, then closes it.
	open := func(d string, epoch uint64, followers []string, tr *inprocess.Transport) (*leader.Leader, func()) {
		l, err := leader.Open(d, &leader.Options{
			Shards: 1, Epoch: epoch, Promote: epoch > 0, Followers: followers, Wall: clock.Now,
			Logger: quietLogger, Store: store.Options{Logger: quietLogger, PebbleOptions: smallMemtable},
			Listener: func(uint32) replication.Listener { return tr },
			Shipping: leader.ShipperOptions{RetransmitTimeout: 20 * time.Millisecond, PollInterval: time.Millisecond},
		})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		ran := make(chan error, 1)
		go func() { ran <- l.Run(rctx) }()
		return l, func() { cancel(); <-ran; require.NoError(t, l.Close()) }
	}
	trA := inprocess.New(inprocess.FaultsNone, 1)
	defer trA.Close()
	a, stopA := open(dir+"/a", 0, []string{"b"}, trA)
	c := sim.NewClient(w, 1, clock)
	for range len(w.Batches) / 2 {
		_, err := c.Send(a)
		require.NoError(t, err)
	}
	b, err := follower.OpenNode(dir+"/b", []uint32{0}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{ID: "b", Logger: quietLogger, PebbleOptions: smallMemtable}, ReconnectBackoff: time.Millisecond}})
	require.NoError(t, err)
	bctx, stopB := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- b.Serve(bctx, func(uint32) replication.Dialer { return trA }) }()
	promoted := c.LastLSN(0)
	for {
		lsn, _, _ := b.Position(0)
		if lsn == promoted {
			break
		}
		require.NoError(t, ctx.Err())
		time.Sleep(2 * time.Millisecond)
	}
	stopB()
	require.NoError(t, <-served)
	require.NoError(t, b.Close())
	for !c.Done() { // B never sees these: A's store goes beyond the promoted history
		_, err := c.Send(a)
		require.NoError(t, err)
	}
	require.Greater(t, c.LastLSN(0), promoted)
	stopA()
	c.Truncate(0, promoted)

	trB := inprocess.New(inprocess.FaultsNone, 2)
	defer trB.Close()
	lb, stopLB := open(dir+"/b", 2, []string{"a"}, trB)
	defer stopLB()
	donor, err := lb.Donor(0, &snapshot.DonorOptions{RateLimit: -1})
	require.NoError(t, err)
	defer donor.Close()

	var cur atomic.Pointer[follower.Follower]
	var reason error
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- follower.Run(rctx, store.ShardDir(dir+"/a", 0), &follower.Options{Store: store.Options{ID: "a", Logger: quietLogger, PebbleOptions: smallMemtable}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 20 * time.Millisecond, Rebuild: follower.RebuildAuto, RebuildFrom: donor},
			trB, &follower.RunHooks{
				Opened:  func(f *follower.Follower) { cur.Store(f) },
				Rebuilt: func(r error, _ snapshot.Manifest, _ snapshot.Stats) { reason = r },
			})
	}()
	for {
		if f := cur.Load(); f != nil {
			if lsn, epoch := f.Position(); lsn == promoted && epoch == 2 {
				require.NoError(t, c.Oracle().Verify(f.State()))
				break
			}
		}
		require.NoError(t, ctx.Err(), "the deposed leader's store never rejoined")
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	require.NoError(t, <-done)
	require.ErrorIs(t, reason, replication.ErrDiverged)
}

// TestRebuiltStoreHasNoLeaderRows: a follower rebuilt from a leader's donor
// does not inherit the leader's own rows (its replication slots,
// keyspace.MetaSlot): promoted later, it starts with exactly the slots of
// the followers it registers, each at its log's start and none dropped —
// not the deposed leader's positions and drops, which would pin or release
// the wrong WAL.
func TestRebuiltStoreHasNoLeaderRows(t *testing.T) {
	dir := t.TempDir()
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	ids := []string{"f1", "f2"}
	l, err := leader.Open(dir+"/leader", &leader.Options{
		Shards: 1, Followers: ids, SegmentSize: 4 << 10, MaxRetainedBytes: 8 << 10, RetentionInterval: time.Hour,
		Logger: quietLogger, Store: store.Options{Logger: quietLogger, PebbleOptions: smallMemtable},
		Listener: func(uint32) replication.Listener { return tr },
	})
	require.NoError(t, err)
	defer l.Close()
	w := sim.GenerateWorkload(sim.WorkloadOptions{Seed: 5, Sessions: 4, Requests: 300, BatchSize: 4})
	c := sim.NewClient(w, 1, sim.NewClock(w.Options.Start))
	for !c.Done() {
		_, err := c.Send(l)
		require.NoError(t, err)
	}
	// No follower ever connected: the bound dropped both slots.
	require.NoError(t, l.Retain())
	for _, sl := range l.Stats()[0].Retention.Slots {
		require.True(t, sl.Dropped, "slot %+v", sl)
	}
	donor, err := l.Donor(0, &snapshot.DonorOptions{RateLimit: -1})
	require.NoError(t, err)
	defer donor.Close()
	node := dir + "/node"
	storeDir := store.ShardDir(node, 0)
	so := &follower.Options{Store: store.Options{Logger: quietLogger, PebbleOptions: smallMemtable}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, _, err := follower.Rebuild(ctx, storeDir, so, donor, nil)
	require.NoError(t, err)
	require.Equal(t, c.LastLSN(0), m.Cut.AppliedLSN)

	f, err := follower.Open(storeDir, so)
	require.NoError(t, err)
	it, err := f.View().NewIter(&pebble.IterOptions{LowerBound: []byte(keyspace.MetaSlot), UpperBound: keyspace.UpperBound(keyspace.MetaSlot)})
	require.NoError(t, err)
	var leaderRows []string
	for it.First(); it.Valid(); it.Next() {
		leaderRows = append(leaderRows, string(it.Key()))
	}
	require.NoError(t, it.Close())
	require.NoError(t, c.Oracle().Verify(f.State()))
	require.NoError(t, f.Close())
	require.Empty(t, leaderRows, "the rebuilt follower holds the leader's own rows")
	require.NoError(t, donor.Close())
	require.NoError(t, l.Close())

	// Promoted, it has exactly its registered followers' slots, fresh.
	tr2 := inprocess.New(inprocess.FaultsNone, 2)
	defer tr2.Close()
	p, err := leader.Open(node, &leader.Options{
		Shards: 1, Epoch: 2, Promote: true, Followers: ids, RetentionInterval: time.Hour,
		Logger: quietLogger, Store: store.Options{Logger: quietLogger, PebbleOptions: smallMemtable},
		Listener: func(uint32) replication.Listener { return tr2 },
	})
	require.NoError(t, err)
	defer p.Close()
	st := p.Stats()[0]
	start := st.Retention.FirstLSN - 1
	require.Equal(t, m.Cut.AppliedLSN, start)
	require.Equal(t, []leader.SlotStats{{ID: "f1", Acked: start}, {ID: "f2", Acked: start}}, st.Retention.Slots)
}

// TestCloseDuringRebuild: a node whose shard is being rebuilt (a transfer
// throttled to last far longer than the test) closes at once — Close
// cancels the fetch and waits for it, Serve returns nil, nothing panics —
// and the half-fetched staging directory is gone at the next open, which
// finds the old store. The leader donating it closes under a fetch of its
// own too: the fetch ends with leader.ErrClosed, not a panic.
func TestCloseDuringRebuild(t *testing.T) {
	w := sim.GenerateWorkload(sim.WorkloadOptions{Seed: 19, Sessions: 6, Requests: 400, BatchSize: 12})
	clock := sim.NewClock(w.Options.Start)
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	dir := t.TempDir()
	l, ran := runLeader(t, context.Background(), dir+"/leader", clock, 1, []string{"gone", "node", "single"}, 8<<10,
		func(uint32) replication.Listener { return tr })
	defer l.Close()
	donor, err := l.Donor(0, &snapshot.DonorOptions{RateLimit: -1})
	require.NoError(t, err)
	defer donor.Close()
	c := sim.NewClient(w, 1, clock)
	sendRetaining(t, c, l)

	slow := follower.Options{Store: store.Options{Logger: quietLogger, PebbleOptions: smallMemtable}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 20 * time.Millisecond, Rebuild: follower.RebuildAuto, RebuildFrom: donor, Snapshot: snapshot.Options{ChunkSize: 1 << 10, RateLimit: 2 << 10}}
	no := slow
	no.Store.ID = "node"
	n, err := follower.OpenNode(dir+"/node", []uint32{0}, &follower.NodeOptions{Follower: no})
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- n.Serve(context.Background(), func(uint32) replication.Dialer { return tr }) }()
	storeDir := store.ShardDir(dir+"/node", 0)
	require.Eventually(t, func() bool { _, err := os.Stat(snapshot.StagingDir(storeDir)); return err == nil },
		20*time.Second, time.Millisecond, "the rebuild never started")
	closed := make(chan error, 1)
	go func() { closed <- n.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Node.Close hung during a rebuild")
	}
	require.NoError(t, <-served)
	n, err = follower.OpenNode(dir+"/node", []uint32{0}, &follower.NodeOptions{Follower: no})
	require.NoError(t, err)
	_, err = os.Stat(snapshot.StagingDir(storeDir))
	require.ErrorIs(t, err, os.ErrNotExist, "the half-fetched snapshot is left")
	lsn, _, err := n.Position(0)
	require.NoError(t, err)
	require.Zero(t, lsn, "the old (empty) store was replaced by a half-fetched one")
	require.NoError(t, n.Close())

	// The donor's leader closes under a fetch: an error, no panic.
	so := slow
	so.Store.ID = "single"
	fetched := make(chan error, 1)
	go func() {
		_, _, err := follower.Rebuild(context.Background(), dir+"/single", &so, donor, nil)
		fetched <- err
	}()
	require.Eventually(t, func() bool { _, err := os.Stat(snapshot.StagingDir(dir + "/single")); return err == nil },
		20*time.Second, time.Millisecond, "the fetch never started")
	require.NoError(t, l.Close())
	require.NoError(t, <-ran)
	_, err = donor.Begin(context.Background(), 0)
	require.ErrorIs(t, err, leader.ErrClosed)
	require.NoError(t, donor.Close()) // the fetch in flight now reads a released snapshot
	select {
	case err := <-fetched:
		// It starts over, and the closed leader refuses the new snapshot.
		require.ErrorIs(t, err, leader.ErrClosed)
	case <-time.After(20 * time.Second):
		t.Fatal("a fetch from a closed leader's donor hung")
	}
}

// closedDonor is a snapshot.Source whose owner has closed: it refuses every
// Begin with snapshot.ErrClosed.
type closedDonor struct{ begins atomic.Int64 }

func (d *closedDonor) Begin(context.Context, uint32) (snapshot.Manifest, error) {
	d.begins.Add(1)
	return snapshot.Manifest{}, fmt.Errorf("%w: test", snapshot.ErrClosed)
}

func (d *closedDonor) Read(context.Context, string, string, int64, []byte) (int, error) {
	return 0, snapshot.ErrUnknownSnapshot
}

func (d *closedDonor) End(context.Context, string) error { return nil }

// TestNodeRebuildFromClosedDonorRedials: a shard refused for a rebuild whose
// donor is closed does not keep asking that donor: it goes back to its
// Dialer (the store reopened, Reopens counts it), where the current leader
// — here the same one, which refuses it again — decides whether to rebuild
// again.
func TestNodeRebuildFromClosedDonorRedials(t *testing.T) {
	w := sim.GenerateWorkload(sim.WorkloadOptions{Seed: 23, Sessions: 6, Requests: 400, BatchSize: 12})
	clock := sim.NewClock(w.Options.Start)
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, ran := runLeader(t, ctx, dir+"/leader", clock, 1, []string{"gone", "node"}, 8<<10,
		func(uint32) replication.Listener { return tr })
	defer l.Close()
	c := sim.NewClient(w, 1, clock)
	sendRetaining(t, c, l)
	donor := &closedDonor{}
	n, err := follower.OpenNode(dir+"/node", []uint32{0}, &follower.NodeOptions{ReopenBackoff: time.Millisecond, Follower: follower.Options{Store: store.Options{ID: "node", Logger: quietLogger, PebbleOptions: smallMemtable}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 20 * time.Millisecond, Rebuild: follower.RebuildAuto, RebuildFrom: donor}})
	require.NoError(t, err)
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- n.Serve(sctx, func(uint32) replication.Dialer { return tr }) }()
	require.Eventually(t, func() bool { return n.Stats().Shards[0].Reopens >= 2 }, 20*time.Second, 5*time.Millisecond,
		"the shard kept asking a closed donor instead of redialling the leader")
	require.GreaterOrEqual(t, donor.begins.Load(), int64(2))
	require.Zero(t, n.Stats().Shards[0].Rebuilds)
	stop()
	require.NoError(t, <-served)
	require.NoError(t, n.Close())
	cancel()
	<-ran
}

// serveNodeUntilCaughtUp serves n over trs (one transport per shard) until
// every shard has applied the client's last LSN, and returns the function
// that stops Serve and checks it returned nil.
func serveNodeUntilCaughtUp(t *testing.T, ctx context.Context, n *follower.Node, trs []*inprocess.Transport, c *sim.Client) (stop func()) {
	t.Helper()
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- n.Serve(sctx, func(s uint32) replication.Dialer { return trs[s] }) }()
	for s := range uint32(len(trs)) {
		for {
			lsn, _, err := n.Position(s)
			if err == nil && lsn == c.LastLSN(s) {
				break
			}
			require.NoError(t, ctx.Err(), "shard %d never caught up", s)
			time.Sleep(5 * time.Millisecond)
		}
	}
	return func() {
		cancel()
		require.NoError(t, <-served)
	}
}

// shardDonors opens an unthrottled snapshot donor of every shard of l,
// closed when the test ends.
func shardDonors(t *testing.T, l *leader.Leader) []snapshot.Source {
	t.Helper()
	var donors []snapshot.Source
	for s := range uint32(l.Shards()) {
		d, err := l.Donor(s, &snapshot.DonorOptions{RateLimit: -1})
		require.NoError(t, err)
		t.Cleanup(func() { _ = d.Close() })
		donors = append(donors, d)
	}
	return donors
}

// runUntilCaughtUp runs follower.Run on dir until the store it serves has
// applied last, checks that store against oracle while it serves (Run
// closes it when it stops), stops Run and returns the reasons of the
// rebuilds it made and what it returned. Safe to call from several
// goroutines of one test.
func runUntilCaughtUp(t *testing.T, ctx context.Context, dir string, o *follower.Options, d replication.Dialer, last uint64,
	oracle *sim.Oracle) ([]error, error) {
	t.Helper()
	var cur atomic.Pointer[follower.Follower]
	var reasons []error
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- follower.Run(rctx, dir, o, d, &follower.RunHooks{
			Opened:  func(f *follower.Follower) { cur.Store(f) },
			Rebuilt: func(reason error, _ snapshot.Manifest, _ snapshot.Stats) { reasons = append(reasons, reason) },
		})
	}()
	for {
		if f := cur.Load(); f != nil {
			if lsn, _ := f.Position(); lsn == last {
				if err := oracle.Verify(f.State()); err != nil {
					t.Errorf("%s: %v", dir, err)
				}
				break
			}
		}
		if ctx.Err() != nil {
			t.Errorf("%s never caught up", dir)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	err := <-done
	return reasons, err
}

// TestRunStoppedWhileOpening: a Run stopped while its store opens (after a
// rebuild, or at start on a slow disk) returns nil, as a stop does, not
// the open's context error. (oncewal follower exited 1 when stopped during
// the reopen that follows a rebuild: TestLeaderRetentionFlags failed so
// once.)
func TestRunStoppedWhileOpening(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	// The store's first file: the stop comes while Pebble creates it, and
	// Pebble is held there until the open has given up on it.
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpCreate {
			once.Do(func() {
				cancel()
				time.Sleep(200 * time.Millisecond)
			})
		}
		return nil
	}))
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	err := follower.Run(ctx, "/store", &follower.Options{Store: store.Options{FS: fs, Logger: quietLogger}}, tr, nil)
	require.NoError(t, err)
}

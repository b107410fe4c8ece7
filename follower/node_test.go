package follower_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// simNode is the simulation's multi-shard target: a follower.Node on a
// crashable in-memory filesystem holding every shard's store, so a crash
// clone is a power failure of the whole node.
type simNode struct {
	t      testing.TB
	fs     *vfs.MemFS
	shards []uint32
	node   *follower.Node
	total  store.ReceiverStats
	opts   follower.NodeOptions
}

func (s *simNode) open() {
	o := s.opts
	o.Follower.Store.FS = s.fs
	n, err := follower.OpenNode("/node", s.shards, &o)
	require.NoError(s.t, err)
	s.node = n
}

func (s *simNode) retire() { s.total = s.total.Add(s.node.Stats().Total) }

func (s *simNode) Apply(raw []byte) (store.Result, error) { return s.node.Apply(raw) }

func (s *simNode) Position(shard uint32) uint64 {
	lsn, _, err := s.node.Position(shard)
	require.NoError(s.t, err)
	return lsn
}

func (s *simNode) Restart() {
	s.retire()
	require.NoError(s.t, s.node.Close())
	s.open()
}

func (s *simNode) Crash(rng *rand.Rand) {
	s.retire()
	clone := s.fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng})
	_ = s.node.Close()
	s.fs = clone
	s.open()
}

// runShardedSim is runSim for a node serving every shard of a deployment:
// the workload is routed by session (replication.ShardRouter), each shard's
// log gets its own fault stream (seeded independently per shard), and
// restarts and power-failure crashes hit the whole node.
func runShardedSim(t testing.TB, seed uint64, shards int, cfg sim.WorkloadOptions) (restarts, crashes int, st store.ReceiverStats) {
	cfg.Seed = seed
	w := recordLog(t, cfg, shards, &hostile)
	router, err := leader.NewShardRouter(shards)
	require.NoError(t, err)
	ids := make([]uint32, shards)
	nets := make([]*simNet, shards)
	for s := range nets {
		ids[s] = uint32(s)
		log, err := w.Encode(uint32(s), uint32(s), 1)
		require.NoError(t, err)
		nets[s] = newSimNet(sim.ShardSeed(seed, uint32(s)), log)
		nets[s].shard = uint32(s)
	}
	sn := &simNode{t: t, fs: vfs.NewCrashableMem(), shards: ids,
		opts: follower.NodeOptions{Follower: *testOptions(nil)}}
	sn.opts.Follower.Store.WindowCapacity = 4096
	sn.open()
	defer func() { _ = sn.node.Close() }()

	simulate(t, seed, sn, nets, rand.New(rand.NewPCG(seed, 0x73686172)), true)
	if err := w.Oracle.Verify(sim.RoutedState{Router: router, Node: sn.node}); err != nil {
		t.Fatalf("seed %d, %d shards: node state differs from the oracle: %v (replay: ONCEWAL_SEED=%d go test ./follower -run TestNodeExactlyOnceSeeds)", seed, shards, err, seed)
	}
	for _, ss := range sn.node.Stats().Shards {
		lsn := ss.AppliedLSN
		require.Equal(t, nets[ss.Shard].lastLSN, lsn, "seed %d shard %d", seed, ss.Shard)
	}
	sn.retire()
	require.Equal(t, sn.total.Events, sn.total.Accounted(), "seed %d: counters do not account for every delivered event: %+v", seed, sn.total)
	for _, n := range nets {
		restarts += n.restarts
		crashes += n.crashes
	}
	return restarts, crashes, sn.total
}

// TestNodeExactlyOnceSeeds is the deterministic simulation over 2, 3 and 4
// shards with independent faults per shard, whole-node restarts and power
// failures: 10 seeds by default (the race detector makes each ~0.5–1 s),
// ONCEWAL_LONG=1 for 500, ONCEWAL_SEEDS=n for n, ONCEWAL_SEED=n to replay one.
func TestNodeExactlyOnceSeeds(t *testing.T) {
	def := 10
	if os.Getenv("ONCEWAL_LONG") != "" {
		def = 500
	}
	first, n := seedCount(t, def)
	cfg := sim.WorkloadOptions{Sessions: 10, Requests: 200, RetryRate: 0.1, CloseRate: 0.03, BatchSize: 16}
	var total store.ReceiverStats
	restarts, crashes := 0, 0
	for seed := first; seed < first+uint64(n); seed++ {
		r, c, st := runShardedSim(t, seed, 2+int(seed%3), cfg)
		total = total.Add(st)
		restarts += r
		crashes += c
	}
	t.Logf("%d seeds × 2–4 shards: %d restarts, %d crashes; events delivered %d, applied %d, discarded position %d / HWM %d / window %d / in-batch %d, closed %d, refused %d (out of order %d)",
		n, restarts, crashes, total.Events, total.Applied, total.DiscardedPosition, total.DiscardedHWM,
		total.DiscardedWindow, total.DiscardedInBatch, total.SkippedClosed, total.RefusedEvents, total.OutOfOrder)
	if n >= 10 {
		require.NotZero(t, total.DiscardedHWM)
		require.NotZero(t, total.DiscardedWindow)
		require.NotZero(t, total.OutOfOrder)
		require.NotZero(t, crashes)
		require.NotZero(t, restarts)
	}
}

// TestNodeShardedPipeline runs the real moving parts for several shards:
// a client through the leader (a WAL, a store and a Fanout per shard) on
// disk, one InProcess link per shard with its own fault seed, a follower
// node on disk restarted and killed along the way (sim.Run).
func TestNodeShardedPipeline(t *testing.T) {
	seeds := 1
	if os.Getenv("ONCEWAL_LONG") != "" {
		seeds = 40
	}
	for _, p := range []struct {
		name   string
		faults inprocess.FaultOptions
	}{{"heavy", inprocess.FaultsHeavy}} {
		t.Run(p.name, func(t *testing.T) {
			for seed := uint64(1); seed <= uint64(seeds); seed++ {
				shards := 4 - 2*int(seed%2) // 2, 4, 2, …
				res, err := sim.Run(context.Background(), sim.Options{
					Dir:      t.TempDir(),
					Seed:     seed,
					Workload: sim.WorkloadOptions{Sessions: 16, Requests: 1200, RetryRate: 0.05, CloseRate: 0.01, BatchSize: 40},
					Faults:   p.faults,
					Restarts: 3,
					Follower: follower.Options{Store: store.Options{Logger: quietLogger, PebbleOptions: smallMemtable}},
					Timeout:  time.Minute,
					Shards:   shards,
				})
				require.NoError(t, err, "seed %d", seed)
				require.True(t, res.Verified, "seed %d: %v", seed, res.VerifyErr)
				require.Len(t, res.Shards, shards)
				var logged uint64
				for _, sr := range res.Shards {
					logged += sr.LastLSN
					require.NotZero(t, sr.Sessions, "seed %d shard %d got no sessions", seed, sr.Shard)
					require.Equal(t, sr.LastLSN, res.Followers[0].Shards[sr.Shard].AppliedLSN)
				}
				require.Equal(t, uint64(res.Logged), logged, "seed %d: every logged event is in exactly one shard", seed)
			}
		})
	}
}

// TestNodeWrongShard: a batch for a shard the node does not serve is refused
// with replication.ErrWrongShard and touches no store; so is a batch whose
// header does not decode (with its wal error).
func TestNodeWrongShard(t *testing.T) {
	dir := t.TempDir()
	n, err := follower.OpenNode(dir, []uint32{1, 3}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger}}})
	require.NoError(t, err)
	defer n.Close()
	require.Equal(t, []uint32{1, 3}, n.Shards())

	w := recordLog(t, sim.WorkloadOptions{Seed: 1, Requests: 40}, 1, nil)
	good := encodeLog(t, w, 3, 1)
	_, err = n.Apply(good[0])
	require.NoError(t, err)

	snapshot := func() map[uint32]map[string]string {
		out := map[uint32]map[string]string{}
		for _, s := range n.Shards() {
			require.NoError(t, n.Follower(s, func(f *follower.Follower) error {
				snap, err := testutil.SnapshotDB(f.View())
				out[s] = snap
				return err
			}))
		}
		return out
	}
	before := snapshot()
	for _, shard := range []uint32{0, 2, 4, 1 << 20} {
		res, err := n.Apply(encodeLog(t, w, shard, 1)[0])
		require.ErrorIs(t, err, replication.ErrWrongShard, "shard %d", shard)
		require.True(t, res.Ack.Refused)
		require.Equal(t, shard, res.Ack.Shard)
	}
	bad := append([]byte(nil), good[1]...)
	bad[3] ^= 0xff // magic
	_, err = n.Apply(bad)
	require.ErrorIs(t, err, wal.ErrCorrupt)
	require.Equal(t, before, snapshot(), "a refused batch changed a store")

	st := n.Stats()
	require.Equal(t, uint64(4), st.WrongShard)
	require.Equal(t, uint64(1), st.Corrupt)
	require.Len(t, st.Shards, 2)
	require.Equal(t, uint64(len(w.Shards[0][0])), st.Shards[1].AppliedLSN)
	require.Zero(t, st.Shards[0].AppliedLSN)

	require.ErrorIs(t, n.Follower(2, func(*follower.Follower) error { return nil }), replication.ErrWrongShard)
	_, _, err = n.Position(7)
	require.ErrorIs(t, err, replication.ErrWrongShard)

	// Reopening finds each shard's position in its own directory.
	require.NoError(t, n.Close())
	got, err := store.NodeShards(nil, dir)
	require.NoError(t, err)
	require.Equal(t, []uint32{1, 3}, got)
	n, err = follower.OpenNode(dir, []uint32{3}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger}}})
	require.NoError(t, err)
	lsn, _, err := n.Position(3)
	require.NoError(t, err)
	require.Equal(t, uint64(len(w.Shards[0][0])), lsn)
	require.NoError(t, n.Close())
}

func TestNodeBadOptions(t *testing.T) {
	for _, shards := range [][]uint32{nil, {}, {1, 2, 1}} {
		_, err := follower.OpenNode(t.TempDir(), shards, nil)
		require.ErrorIs(t, err, follower.ErrBadOptions, "%v", shards)
	}
	_, err := follower.OpenNode(t.TempDir(), []uint32{0}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{WindowCapacity: -1}}})
	require.ErrorIs(t, err, follower.ErrBadOptions)
	require.Equal(t, int64(24*100_000+4*181_819), follower.WindowBytes(100_000)) // 4 B slots at a load of at most 0.55
}

// TestNodeWindowBoundPerShard: every shard's window holds at most its own
// capacity, and the node reports the sum.
func TestNodeWindowBoundPerShard(t *testing.T) {
	const capacity = 50
	n, err := follower.OpenNode(t.TempDir(), []uint32{0, 1, 2}, &follower.NodeOptions{
		Follower: follower.Options{Store: store.Options{Logger: quietLogger, WindowCapacity: capacity, PebbleOptions: smallMemtable}}})
	require.NoError(t, err)
	defer n.Close()
	w := recordLog(t, sim.WorkloadOptions{Seed: 5, Requests: 400}, 1, nil)
	for s := range uint32(3) {
		for _, raw := range encodeLog(t, w, s, 1) {
			_, err := n.Apply(raw)
			require.NoError(t, err)
		}
	}
	st := n.Stats()
	for _, ss := range st.Shards {
		require.Equal(t, capacity, ss.WindowLen, "shard %d", ss.Shard)
		require.Equal(t, capacity, ss.WindowCapacity)
	}
	require.Equal(t, 3*capacity, st.WindowLen)
	require.Equal(t, 3*capacity, st.WindowCapacity)
	require.Equal(t, 3*follower.WindowBytes(capacity), st.WindowBytes)
}

// stallDialer is a link that never connects: Dial blocks until ctx ends.
type stallDialer struct{}

func (stallDialer) Dial(ctx context.Context, _ replication.Ack) (replication.FollowerConn, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestNodeStalledShard: one shard's transport never delivers anything; the
// other shards of the node still finish, restarts included.
func TestNodeStalledShard(t *testing.T) {
	res, err := sim.Run(context.Background(), sim.Options{
		Dir:      t.TempDir(),
		Seed:     3,
		Workload: sim.WorkloadOptions{Sessions: 12, Requests: 800, BatchSize: 30},
		Faults:   inprocess.FaultsLight,
		Restarts: 2,
		Follower: follower.Options{Store: store.Options{Logger: quietLogger, PebbleOptions: smallMemtable}},
		Timeout:  time.Minute,
		Shards:   3,
		Wrap: func(_ int, s uint32, d replication.Dialer) replication.Dialer {
			if s == 1 {
				return stallDialer{}
			}
			return d
		},
		Skip: func(s uint32) bool { return s == 1 },
	})
	require.NoError(t, err)
	require.True(t, res.Verified, "%v", res.VerifyErr)
	require.NotZero(t, res.Shards[1].LastLSN)
	applied := res.Followers[0].Shards
	require.Zero(t, applied[1].AppliedLSN, "the stalled shard got nothing")
	for _, s := range []int{0, 2} {
		require.Equal(t, res.Shards[s].LastLSN, applied[s].AppliedLSN)
	}
}

// TestNodeFailingShard: one shard's store fails every WAL write
// (store.ErrFailed). The other shards finish while it is down;
// once the fault clears, the node reopens the failed shard on its own and it
// catches up, exactly once.
func TestNodeFailingShard(t *testing.T) {
	const shards, bad = 3, 2
	dir := t.TempDir()
	var failing atomic.Bool
	var injected atomic.Int64
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if failing.Load() && op.Kind == errorfs.OpFileWrite && strings.HasSuffix(op.Path, ".log") {
			injected.Add(1)
			return errorfs.ErrInjected
		}
		return nil
	})
	trs := make([]*inprocess.Transport, shards)
	for s := range trs {
		trs[s] = inprocess.New(inprocess.FaultsLight, sim.ShardSeed(9, uint32(s)))
		defer trs[s].Close()
	}
	w := sim.GenerateWorkload(sim.WorkloadOptions{Seed: 9, Sessions: 12, Requests: 800, RetryRate: 0.05, BatchSize: 30})
	clock := sim.NewClock(w.Options.Start)
	l, err := leader.Open(filepath.Join(dir, "leader"), &leader.Options{
		Shards: shards, Followers: []string{"node"}, Wall: clock.Now, Logger: quietLogger,
		Store:    store.Options{Logger: quietLogger, PebbleOptions: smallMemtable},
		Listener: func(s uint32) replication.Listener { return trs[s] },
		Shipping: leader.ShipperOptions{RetransmitTimeout: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, PollInterval: time.Millisecond},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leaderDone := make(chan error, 1)
	go func() { leaderDone <- l.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-leaderDone)
		require.NoError(t, l.Close())
	}()

	c := sim.NewClient(w, shards, clock)
	for !c.Done() {
		_, err := c.Send(l)
		require.NoError(t, err)
	}
	last := make([]uint64, shards)
	for s := range last {
		last[s] = c.LastLSN(uint32(s))
	}

	n, err := follower.OpenNode(filepath.Join(dir, "node"), []uint32{0, 1, 2}, &follower.NodeOptions{
		Follower:      follower.Options{Store: store.Options{ID: "node", Logger: quietLogger, PebbleOptions: smallMemtable}},
		ReopenBackoff: 5 * time.Millisecond,
		PerShard: func(s uint32, o *follower.Options) {
			if s == bad {
				o.Store.FS = errorfs.Wrap(vfs.Default, inj)
			}
		},
	})
	require.NoError(t, err)
	defer n.Close()
	// The store opened (and recorded its identity); from now on its WAL
	// writes fail.
	failing.Store(true)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = n.Serve(ctx, func(s uint32) replication.Dialer { return trs[s] })
	}()

	waitFor := func(what string, cond func() bool) { t.Helper(); waitNode(t, ctx, n, what, cond) }
	at := func(s uint32) bool {
		lsn, _, err := n.Position(s)
		return err == nil && lsn == last[s]
	}
	waitFor("healthy shards to finish", func() bool { return at(0) && at(1) })
	waitFor("the failing shard to fail", func() bool { return injected.Load() > 0 && n.Stats().Down == 1 })
	st := n.Stats()
	require.ErrorIs(t, st.Shards[bad].Err, store.ErrFailed)
	require.Less(t, st.Shards[bad].AppliedLSN, last[bad])

	failing.Store(false)
	waitFor("the failed shard to recover and catch up", func() bool { return at(bad) })
	st = n.Stats()
	require.GreaterOrEqual(t, st.Shards[bad].Reopens, 1)
	require.Zero(t, st.Down)
	require.NoError(t, c.Oracle().Verify(sim.RoutedState{Router: l.Router(), Node: n}))
	require.Equal(t, st.Total.Events, st.Total.Accounted())
	cancel()
	<-served
	require.NoError(t, n.Close())
}

// TestNodeCloseRacesServe: a Serve that starts as the node closes either
// returns ErrClosed or is waited for by Close (found by the multi-follower
// simulation; the race detector flags a Serve that runs unordered with
// Close).
func TestNodeCloseRacesServe(t *testing.T) {
	for i := range 20 {
		n, err := follower.OpenNode(t.TempDir(), []uint32{0}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger, PebbleOptions: smallMemtable}}})
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			done <- n.Serve(context.Background(), func(uint32) replication.Dialer { return stallDialer{} })
		}()
		if i%2 == 0 {
			require.NoError(t, drill.Kill(n))
		} else {
			require.NoError(t, n.Close())
		}
		err = <-done
		require.True(t, err == nil || errors.Is(err, follower.ErrClosed), "%v", err)
	}
}

// TestNodeCloseStopsServe: Close stops a running Serve (every shard's loop)
// and leaves no goroutine behind; a shard whose dialer is nil is not served.
func TestNodeCloseStopsServe(t *testing.T) {
	before := runtime.NumGoroutine()
	tr := inprocess.New(inprocess.FaultsNone, 1)
	n, err := follower.OpenNode(t.TempDir(), []uint32{0, 1, 2}, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger}}})
	require.NoError(t, err)
	require.ErrorIs(t, n.Serve(context.Background(), nil), follower.ErrBadOptions)
	done := make(chan error, 1)
	dialed := make(chan uint32, 3)
	go func() {
		done <- n.Serve(context.Background(), func(s uint32) replication.Dialer {
			if s == 1 {
				return nil
			}
			dialed <- s
			return stallDialer{}
		})
	}()
	<-dialed
	<-dialed
	require.ErrorIs(t, n.Serve(context.Background(), func(uint32) replication.Dialer { return nil }), follower.ErrNodeServing)
	require.NoError(t, n.Close())
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	require.NoError(t, n.Close(), "Close is idempotent")
	require.ErrorIs(t, n.Serve(context.Background(), nil), follower.ErrClosed)
	_, err = n.Apply(nil)
	require.Error(t, err)
	require.NoError(t, tr.Close())
	for i := 0; runtime.NumGoroutine() > before; i++ {
		require.Less(t, i, 500, "goroutines leaked: %d before, %d after", before, runtime.NumGoroutine())
		time.Sleep(10 * time.Millisecond)
	}
}

// brokenApplier fails every batch: a state machine with a bug.
type brokenApplier struct{}

var errBrokenApplier = errors.New("broken state machine")

func (brokenApplier) Apply(*pebble.Batch, []wal.Event) error { return errBrokenApplier }

// TestNodeApplierFailure: a shard whose Applier fails stops and stays down
// (replication.ErrApply in its ShardStats.Err and in what Serve returns),
// instead of being reopened to meet the same batch again, while the other
// shard serves on; the node reopened with a fixed Applier catches it up.
func TestNodeApplierFailure(t *testing.T) {
	const bad = 1
	dir := t.TempDir()
	trs := []*inprocess.Transport{inprocess.New(inprocess.FaultsNone, 1), inprocess.New(inprocess.FaultsNone, 2)}
	for _, tr := range trs {
		defer tr.Close()
	}
	l, err := leader.Open(filepath.Join(dir, "leader"), &leader.Options{Shards: 2, Followers: []string{"node"}, Logger: quietLogger,
		Store: store.Options{Logger: quietLogger}, Listener: func(s uint32) replication.Listener { return trs[s] }})
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go l.Run(ctx)
	for i := 0; i < 40; i++ {
		_, err := l.Append(wal.Event{Op: wal.OpPut, Session: session.NewID(), Key: []byte("k"), Value: []byte{byte(i)}})
		require.NoError(t, err)
	}
	at := func(n *follower.Node, s uint32) bool {
		sh, _ := l.Shard(s)
		lsn, _, err := n.Position(s)
		return err == nil && lsn == sh.NextLSN()-1
	}
	waitFor := func(n *follower.Node, what string, cond func() bool) { t.Helper(); waitNode(t, ctx, n, what, cond) }
	nodeOpts := &follower.NodeOptions{Follower: follower.Options{Store: store.Options{ID: "node", Logger: quietLogger}}, ReopenBackoff: time.Millisecond,
		PerShard: func(s uint32, o *follower.Options) {
			if s == bad {
				o.Store.Applier = brokenApplier{}
			}
		}}
	n, err := follower.OpenNode(filepath.Join(dir, "node"), []uint32{0, 1}, nodeOpts)
	require.NoError(t, err)
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- n.Serve(sctx, func(s uint32) replication.Dialer { return trs[s] }) }()
	waitFor(n, "the good shard to catch up and the bad one to stop", func() bool { return at(n, 0) && n.Stats().Down == 1 })
	st := n.Stats()
	require.ErrorIs(t, st.Shards[bad].Err, store.ErrApply)
	require.ErrorIs(t, st.Shards[bad].Err, errBrokenApplier)
	stop()
	err = <-served
	require.ErrorIs(t, err, store.ErrApply, "Serve must report the stopped shard")
	st = n.Stats()
	require.Zero(t, st.Shards[bad].Reopens, "a shard whose Applier failed was reopened")
	require.Equal(t, uint64(1), st.Shards[bad].Receiver.ApplyErrors)
	require.NoError(t, n.Close())

	nodeOpts.PerShard = nil // the fixed Applier: the default one
	n, err = follower.OpenNode(filepath.Join(dir, "node"), []uint32{0, 1}, nodeOpts)
	require.NoError(t, err)
	defer n.Close()
	sctx, stop = context.WithCancel(ctx)
	defer stop()
	go func() { served <- n.Serve(sctx, func(s uint32) replication.Dialer { return trs[s] }) }()
	waitFor(n, "both shards to catch up", func() bool { return at(n, 0) && at(n, bad) })
	stop()
	require.NoError(t, <-served)
}

// waitNode polls cond until it holds, failing with n's stats once ctx ends.
func waitNode(t *testing.T, ctx context.Context, n *follower.Node, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s: %+v", what, n.Stats())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

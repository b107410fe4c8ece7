package follower_test

import (
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// The tests in this file prove exactly-once apply with a deterministic
// simulation: a seeded RNG decides every fault (drop, duplicate, reorder,
// redeliver an old batch, clean restart, crash with unsynced data lost), so a
// failing seed replays exactly. The invariant an outsider can check: after
// delivery completes, the follower's state equals the oracle, which applies
// every distinct operation of the leader's log exactly once, and the receiver
// counters account for every event delivered.

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// smallMemtable keeps the many Pebble opens of these tests cheap: the default
// 4 MiB memtable is calloc'd at every open.
func smallMemtable(o *pebble.Options) { o.MemTableSize = 256 << 10 }

// testOptions are the follower options of the simulation tests. The HWM log
// checkpoints a session two batches after its change, so the workloads'
// dozen batches exercise logging, checkpoints, delta deletion and replay.
func testOptions(fs vfs.FS) *follower.Options {
	return &follower.Options{Store: store.Options{FS: fs, Logger: quietLogger, PebbleOptions: smallMemtable, HWMLogBatches: 2}}
}

// logModes are the HWM log settings the seeded simulations rotate through:
// off, checkpointing after one and three batches, and the default (which
// these short workloads never checkpoint: log and replay only).
var logModes = []int{-1, 1, 3, 0}

// hostile is the simulation's injection of log shapes no correct leader
// writes (sim.Log.Hostile): verbatim re-appends and late writes to closed
// sessions, which followers must still apply exactly once.
var hostile = sim.HostileOptions{Reappends: 0.1, LateWrites: 0.02}

// recordLog runs a generated client workload through a leader of shards
// shards (sim.Record) and, with h set, injects hostile shapes into its log.
func recordLog(t testing.TB, cfg sim.WorkloadOptions, shards int, h *sim.HostileOptions) *sim.Log {
	t.Helper()
	log, err := sim.Record(sim.GenerateWorkload(cfg), shards)
	require.NoError(t, err)
	if h != nil {
		hc := *h
		hc.Seed = cfg.Seed
		log = log.Hostile(hc)
	}
	return log
}

// encodeLog encodes shard 0 of a log into the leader's shipped batches
// (LSNs from 1), stamped as shard.
func encodeLog(t testing.TB, log *sim.Log, shard uint32, epoch uint64) [][]byte {
	t.Helper()
	out, err := log.Encode(0, shard, epoch)
	require.NoError(t, err)
	return out
}

// simNet is a seeded, single-goroutine model of an at-least-once shipper on a
// faulty link. It tracks what the follower acked, like the real Shipper.
type simNet struct {
	shard    uint32
	rng      *rand.Rand
	log      [][]byte
	first    []uint64 // first LSN of each batch
	next     int      // index of the next batch to send
	acked    uint64
	lastLSN  uint64
	restarts int
	crashes  int
}

func newSimNet(seed uint64, log [][]byte) *simNet {
	n := &simNet{rng: rand.New(rand.NewPCG(seed, 0x51)), log: log}
	lsn := uint64(1)
	for _, raw := range log {
		h, err := wal.DecodeHeader(raw)
		if err != nil {
			panic(err)
		}
		n.first = append(n.first, lsn)
		lsn += uint64(h.Count)
	}
	n.lastLSN = lsn - 1
	return n
}

// rewind makes the next send the batch after LSN pos.
func (n *simNet) rewind(pos uint64) {
	n.next = len(n.log)
	for i, f := range n.first {
		if f > pos {
			n.next = i
			break
		}
	}
}

type simFollower struct {
	t     testing.TB
	fs    *vfs.MemFS
	f     *follower.Follower
	total store.ReceiverStats // across incarnations
	opts  follower.Options
}

func (s *simFollower) open() {
	o := s.opts
	o.Store.FS = s.fs
	f, err := follower.Open("/follower", &o)
	require.NoError(s.t, err)
	s.f = f
}

func (s *simFollower) retire() {
	s.total = s.total.Add(s.f.Stats().Receiver)
}

func (s *simFollower) restart() {
	s.retire()
	require.NoError(s.t, s.f.Close())
	s.open()
}

// crash abandons the running follower as a power failure would: only what was
// synced survives, plus a random share of what was not.
func (s *simFollower) crash(rng *rand.Rand) {
	s.retire()
	clone := s.fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng})
	_ = s.f.Close() // releases goroutines; writes go to the old filesystem
	s.fs = clone
	s.open()
}

// simTarget is what the simulation drives: one follower, or a node serving
// several shards (node_test.go).
type simTarget interface {
	Apply(raw []byte) (store.Result, error)
	Position(shard uint32) uint64
	Restart()
	Crash(rng *rand.Rand)
}

func (s *simFollower) Apply(raw []byte) (store.Result, error) { return s.f.Apply(raw) }
func (s *simFollower) Position(uint32) uint64                 { lsn, _ := s.f.Position(); return lsn }
func (s *simFollower) Restart()                               { s.restart() }
func (s *simFollower) Crash(rng *rand.Rand)                   { s.crash(rng) }

// runSim drives one seed to completion and checks the invariant.
func runSim(t testing.TB, seed uint64, cfg sim.WorkloadOptions, faults bool) (*simNet, store.ReceiverStats) {
	cfg.Seed = seed
	w := recordLog(t, cfg, 1, &hostile)
	net := newSimNet(seed, encodeLog(t, w, 0, 1))
	sf := &simFollower{t: t, fs: vfs.NewCrashableMem(), opts: *testOptions(nil)}
	sf.opts.Store.WindowCapacity = 4096
	sf.opts.Store.HWMLogBatches = logModes[seed%uint64(len(logModes))]
	sf.open()
	defer func() { _ = sf.f.Close() }()

	simulate(t, seed, sf, []*simNet{net}, nil, faults)
	if err := w.Oracle.Verify(sf.f.State()); err != nil {
		t.Fatalf("seed %d: follower state differs from the oracle: %v (replay: ONCEWAL_SEED=%d go test ./follower -run TestExactlyOnceSeeds)", seed, err, seed)
	}
	sf.retire()
	st := sf.total
	require.Equal(t, st.Events, st.Accounted(), "seed %d: counters do not account for every delivered event: %+v", seed, st)
	return net, st
}

// simulate delivers every net's log to tgt through its own seeded faults
// until every shard's position reaches its last LSN. With several nets (one
// per shard), sched picks which shard takes the next step, so the shards'
// fault streams stay independent of each other; restarts and crashes hit the
// whole target, after which every shard's shipper rewinds to its handshake.
func simulate(t testing.TB, seed uint64, tgt simTarget, nets []*simNet, sched *rand.Rand, faults bool) {
	deliver := func(net *simNet, i int) {
		res, err := tgt.Apply(net.log[i])
		if err != nil && !errors.Is(err, replication.ErrOutOfOrder) && !errors.Is(err, replication.ErrSeqGap) {
			t.Fatalf("seed %d: shard %d batch %d: unexpected error %v", seed, net.shard, i, err)
		}
		if res.Ack.Refused {
			net.rewind(res.Ack.AppliedLSN)
		} else if res.Ack.AppliedLSN > net.acked {
			net.acked = res.Ack.AppliedLSN
		}
	}
	limit := 1000 * len(nets)
	for _, net := range nets {
		limit += 100 * len(net.log)
	}
	pending := make([]*simNet, 0, len(nets))
	for steps := 0; ; steps++ {
		pending = pending[:0]
		for _, net := range nets {
			if tgt.Position(net.shard) < net.lastLSN {
				pending = append(pending, net)
			}
		}
		if len(pending) == 0 {
			return
		}
		require.Less(t, steps, limit, "seed %d: no progress", seed)
		net := pending[0]
		if len(pending) > 1 {
			net = pending[sched.IntN(len(pending))]
		}
		if net.next >= len(net.log) {
			// Everything sent; a retransmit timer fires.
			net.rewind(net.acked)
			continue
		}
		r := net.rng.Float64()
		switch {
		case !faults || r < 0.55:
			deliver(net, net.next)
			net.next++
		case r < 0.65: // dropped in transit
			net.next++
		case r < 0.75: // duplicated
			deliver(net, net.next)
			deliver(net, net.next)
			net.next++
		case r < 0.83: // reordered: a later batch overtakes
			if j := net.next + 1 + net.rng.IntN(3); j < len(net.log) {
				deliver(net, j)
			}
		case r < 0.96: // an old batch redelivered late
			deliver(net, net.rng.IntN(net.next+1))
		case r < 0.98:
			tgt.Restart()
			net.restarts++
			for _, n := range nets {
				n.rewind(tgt.Position(n.shard)) // handshake
			}
		default:
			tgt.Crash(net.rng)
			net.crashes++
			for _, n := range nets {
				lsn := tgt.Position(n.shard)
				n.acked = min(n.acked, lsn)
				n.rewind(lsn)
			}
		}
	}
}

func seedCount(t *testing.T, def int) (first uint64, n int) {
	if s := os.Getenv("ONCEWAL_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		return v, 1
	}
	if s := os.Getenv("ONCEWAL_SEEDS"); s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(t, err)
		return 1, v
	}
	return 1, def
}

// TestExactlyOnceSeeds runs the randomized fault-injection sweep: 500 seeds by
// default, ONCEWAL_SEEDS=10000 for the long run, ONCEWAL_SEED=n to replay one.
func TestExactlyOnceSeeds(t *testing.T) {
	first, n := seedCount(t, 500)
	cfg := sim.WorkloadOptions{Sessions: 6, Requests: 150, RetryRate: 0.1, CloseRate: 0.03, BatchSize: 12}
	var total store.ReceiverStats
	restarts, crashes := 0, 0
	for seed := first; seed < first+uint64(n); seed++ {
		net, st := runSim(t, seed, cfg, true)
		total = total.Add(st)
		restarts += net.restarts
		crashes += net.crashes
	}
	t.Logf("%d seeds: %d restarts, %d crashes; events delivered %d, applied %d, discarded position %d / HWM %d / window %d / in-batch %d, closed %d, refused %d (gaps %d, out of order %d)",
		n, restarts, crashes, total.Events, total.Applied, total.DiscardedPosition, total.DiscardedHWM,
		total.DiscardedWindow, total.DiscardedInBatch, total.SkippedClosed, total.RefusedEvents, total.SeqGaps, total.OutOfOrder)
	// The sweep must actually exercise every dedup path, or it proves little.
	if n >= 50 {
		require.NotZero(t, total.DiscardedPosition)
		require.NotZero(t, total.DiscardedHWM)
		require.NotZero(t, total.DiscardedWindow)
		require.NotZero(t, total.DiscardedInBatch)
		require.NotZero(t, total.OutOfOrder)
		require.NotZero(t, total.SkippedClosed)
		require.NotZero(t, crashes)
	}
}

// commitPathWrites selects the write and sync operations of the commit path
// (Pebble's WAL and MANIFEST; background file deletion is not deterministic
// and is left out): the crash points of the sweeps.
func commitPathWrites(op errorfs.Op) bool {
	switch op.Kind {
	case errorfs.OpCreate, errorfs.OpFileWrite, errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpRename:
	default:
		return false
	}
	return strings.HasSuffix(op.Path, ".log") || strings.Contains(op.Path, "MANIFEST")
}

// newSweepFS is the filesystem of one crash point of a sweep: it takes a
// crash image (keeping pct% of unsynced data) just before the k-th (from 1)
// commit-path write once armed, and lets the run go on; k < 1 only counts.
// onCrash, if set, runs when the image is taken.
func newSweepFS(k, pct int, onCrash func()) *testutil.CrashFS {
	return testutil.NewCrashFS(vfs.NewCrashableMem(), testutil.CrashOptions{
		At:       k - 1,
		Count:    commitPathWrites,
		Clone:    vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(uint64(k), uint64(pct)))},
		Continue: true,
		Disarmed: true,
		OnCrash:  onCrash,
	})
}

// TestCrashSweep crashes the follower at every write/sync point of a workload
// (every one by default; ONCEWAL_LONG=1 also sweeps unsynced-data survival),
// reopens from the crash image, finishes delivery and checks the invariant.
func TestCrashSweep(t *testing.T) {
	w := recordLog(t, sim.WorkloadOptions{Seed: 7, Sessions: 4, Requests: 120, RetryRate: 0.15, CloseRate: 0.03, BatchSize: 10}, 1, &hostile)
	log := encodeLog(t, w, 0, 1)

	// Count the write points of a fault-free run.
	probe := newSweepFS(-1, 0, nil)
	runCrashPoint(t, w, log, probe)
	points := probe.Counted()
	require.Greater(t, points, 20)
	percents := []int{0, 50}
	if os.Getenv("ONCEWAL_LONG") != "" {
		percents = []int{0, 10, 50, 90, 100}
	}
	crashed, missed := 0, 0
	for _, pct := range percents {
		for k := 1; k <= points; k++ {
			c := newSweepFS(k, pct, nil)
			runCrashPoint(t, w, log, c)
			clone := c.Image()
			if clone == nil {
				// Pebble's log writer coalesces writes by timing, so a run
				// may have a few write points fewer than the probe run.
				missed++
				continue
			}
			// Recover from the crash image and finish delivery.
			f, err := follower.Open("/follower", testOptions(clone))
			require.NoError(t, err, "crash point %d (%d%% unsynced kept)", k, pct)
			lsn, _ := f.Position()
			for _, raw := range log {
				_, err := f.Apply(raw)
				require.NoError(t, err)
			}
			if err := w.Oracle.Verify(f.State()); err != nil {
				t.Fatalf("crash point %d/%d (%d%% unsynced kept, recovered at LSN %d): %v", k, points, pct, lsn, err)
			}
			require.NoError(t, f.Close())
			crashed++
		}
	}
	require.Less(t, missed, len(percents)*points/5, "too many crash points not reached")
	t.Logf("%d crash points × %v%% unsynced data kept = %d crash recoveries verified (%d points not reached)", points, percents, crashed, missed)
}

// runCrashPoint applies the whole log (each batch twice: redelivery) with
// the counting filesystem in place, restarting cleanly half-way.
func runCrashPoint(t *testing.T, w *sim.Log, log [][]byte, fs *testutil.CrashFS) {
	open := func() *follower.Follower {
		f, err := follower.Open("/follower", testOptions(fs))
		require.NoError(t, err)
		return f
	}
	// A crash while Pebble creates an empty store is Pebble's business (with
	// unsynced directory entries kept at random it may not reopen); the sweep
	// starts once the store exists.
	f := open()
	fs.Arm()
	for i, raw := range log {
		for range 2 {
			_, err := f.Apply(raw)
			require.NoError(t, err)
		}
		if i == len(log)/2 {
			require.NoError(t, f.Close())
			f = open()
		}
	}
	require.NoError(t, w.Oracle.Verify(f.State()))
	require.NoError(t, f.Close())
}

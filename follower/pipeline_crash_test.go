package follower_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// pipelineCrashFS is a sweep filesystem (newSweepFS, exactlyonce_test.go)
// that also notes, when it takes the crash image, the highest LSN
// acknowledged so far and how many batches were between Start and their
// ack.
type pipelineCrashFS struct {
	*testutil.CrashFS
	acked, inFlight         atomic.Int64
	ackedAtCrash, inFlight0 atomic.Int64
}

func newPipelineCrashFS(k, pct int) *pipelineCrashFS {
	c := &pipelineCrashFS{}
	c.CrashFS = newSweepFS(k, pct, func() {
		c.ackedAtCrash.Store(c.acked.Load())
		c.inFlight0.Store(c.inFlight.Load())
	})
	return c
}

// TestCrashSweepPipelined is TestCrashSweep with the follower's pipeline in
// use: up to 3 batches between Start and their ack, so every crash point
// finds batches in every stage — acknowledged (synced), in the memtable with
// their WAL sync in flight, and just decided and staged. It checks what the
// pipeline adds to the sweep: the store recovers at or past every LSN that
// was acknowledged before the crash (no ack precedes its batch's sync), and
// finishing delivery yields the oracle's state (exactly once).
func TestCrashSweepPipelined(t *testing.T) {
	w := recordLog(t, sim.WorkloadOptions{Seed: 7, Sessions: 4, Requests: 120, RetryRate: 0.15, CloseRate: 0.03, BatchSize: 10}, 1, &hostile)
	log := encodeLog(t, w, 0, 1)
	probe := newPipelineCrashFS(-1, 0)
	runPipelinedCrashPoint(t, w, log, probe)
	points := probe.Counted()
	require.Greater(t, points, 20)
	crashed, busy := 0, 0
	for _, pct := range []int{0, 50} {
		for k := 1; k <= points; k++ {
			c := newPipelineCrashFS(k, pct)
			runPipelinedCrashPoint(t, w, log, c)
			clone, ackedAtCrash, inFlight := c.Image(), c.ackedAtCrash.Load(), c.inFlight0.Load()
			if clone == nil {
				continue // Pebble coalesced writes; see TestCrashSweep
			}
			f, err := follower.Open("/follower", testOptions(clone))
			require.NoError(t, err, "crash point %d (%d%% unsynced kept)", k, pct)
			lsn, _ := f.Position()
			require.GreaterOrEqual(t, int64(lsn), ackedAtCrash,
				"crash point %d (%d%% unsynced kept): recovered at LSN %d, but LSN %d was acknowledged", k, pct, lsn, ackedAtCrash)
			for _, raw := range log {
				_, err := f.Apply(raw)
				require.NoError(t, err)
			}
			if err := w.Oracle.Verify(f.State()); err != nil {
				t.Fatalf("crash point %d/%d (%d%% unsynced kept, recovered at LSN %d): %v", k, points, pct, lsn, err)
			}
			require.NoError(t, f.Close())
			crashed++
			if inFlight >= 2 {
				busy++
			}
		}
	}
	require.Greater(t, crashed, points, "too many crash points not reached")
	require.Greater(t, busy, crashed/4, "too few crashes with batches in the pipeline")
	t.Logf("%d crash recoveries verified, %d with 2+ batches between Start and ack", crashed, busy)
}

// runPipelinedCrashPoint delivers the whole log (each batch twice:
// redelivery) through Follower.Start with up to 3 batches in flight,
// restarting cleanly half-way.
func runPipelinedCrashPoint(t *testing.T, w *sim.Log, log [][]byte, c *pipelineCrashFS) {
	open := func() *follower.Follower {
		f, err := follower.Open("/follower", testOptions(c.CrashFS))
		require.NoError(t, err)
		return f
	}
	f := open()
	c.Arm()
	var queue []*store.Pending
	wait := func() {
		res, err := queue[0].Wait()
		queue = queue[1:]
		c.inFlight.Add(-1)
		require.NoError(t, err)
		if lsn := int64(res.Ack.AppliedLSN); lsn > c.acked.Load() {
			c.acked.Store(lsn)
		}
	}
	for i, raw := range log {
		for range 2 {
			if len(queue) == 3 {
				wait()
			}
			c.inFlight.Add(1)
			queue = append(queue, f.Start(raw))
		}
		if i == len(log)/2 {
			for len(queue) > 0 {
				wait()
			}
			require.NoError(t, f.Close())
			f = open()
		}
	}
	for len(queue) > 0 {
		wait()
	}
	require.NoError(t, w.Oracle.Verify(f.State()))
	require.NoError(t, f.Close())
}

// scriptedLeader is a Dialer whose one connection delivers log's batches as
// fast as the follower takes them and records the acks; done closes when
// the last LSN is acknowledged.
type scriptedLeader struct {
	log  [][]byte
	last uint64
	next int
	acks []replication.Ack
	done chan struct{}
	mu   sync.Mutex
}

func (l *scriptedLeader) Dial(ctx context.Context, _ replication.Ack) (replication.FollowerConn, error) {
	return l, nil
}

func (l *scriptedLeader) Recv(ctx context.Context) ([]byte, error) {
	l.mu.Lock()
	if l.next < len(l.log) {
		raw := l.log[l.next]
		l.next++
		l.mu.Unlock()
		return raw, nil
	}
	l.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

func (l *scriptedLeader) Send(_ context.Context, ack replication.Ack) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acks = append(l.acks, ack)
	if ack.AppliedLSN == l.last && !ack.Refused {
		select {
		case <-l.done:
		default:
			close(l.done)
		}
	}
	return nil
}

func (l *scriptedLeader) Close() error { return nil }

// TestServeOverlapsSyncs: while a batch's WAL sync is in flight, Serve
// decides and stages the next ones, so Pebble syncs several batches with one
// fsync. With a 20 ms sync and batches always waiting, a follower that
// applied one batch per sync (no pipeline) would fsync once per batch; the
// pipeline needs far fewer. The acks still come in order, each for a
// durable position, and the state is the oracle's.
func TestServeOverlapsSyncs(t *testing.T) {
	w := recordLog(t, sim.WorkloadOptions{Seed: 3, Sessions: 8, Requests: 240, BatchSize: 8}, 1, nil)
	log := encodeLog(t, w, 0, 1)
	require.Greater(t, len(log), 20)
	fs := &testutil.SyncFS{FS: vfs.NewMem(), Delay: 20 * time.Millisecond}
	f, err := follower.Open("/follower", testOptions(fs))
	require.NoError(t, err)
	defer f.Close()
	syncs := serveScripted(t, f, fs, log)
	require.NoError(t, w.Oracle.Verify(f.State()))
	require.Less(t, syncs, int64(len(log))*3/4, "%d WAL syncs for %d batches: the syncs did not overlap the next batches", syncs, len(log))
	t.Logf("%d batches, %d WAL syncs", len(log), syncs)
}

// serveScripted serves log to f from a scriptedLeader until the ack of
// its last batch (a minute at most) and checks the acks: one per batch, in
// order, none refused, the last at the log's end. It returns how many WAL
// syncs fs counted meanwhile.
func serveScripted(t *testing.T, f *follower.Follower, fs *testutil.SyncFS, log [][]byte) int64 {
	t.Helper()
	h, err := wal.DecodeHeader(log[len(log)-1])
	require.NoError(t, err)
	lead := &scriptedLeader{log: log, last: h.LastLSN(), done: make(chan struct{})}
	syncs0 := fs.Syncs()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- f.Serve(ctx, lead) }()
	select {
	case <-lead.done:
	case <-time.After(time.Minute):
		t.Fatal("the follower did not acknowledge the last batch")
	}
	cancel()
	require.NoError(t, <-served)
	syncs := fs.Syncs() - syncs0

	lead.mu.Lock()
	defer lead.mu.Unlock()
	var prev uint64
	for i, a := range lead.acks {
		require.False(t, a.Refused, "ack %d refused", i)
		require.GreaterOrEqual(t, a.AppliedLSN, prev, "acks out of order")
		prev = a.AppliedLSN
	}
	require.Len(t, lead.acks, len(log))
	require.Equal(t, h.LastLSN(), prev)
	return syncs
}

// TestNodeStart: Node.Start routes each batch to its shard's pipeline, the
// shards' batches interleaved and several in flight per shard; a batch for
// a shard the node does not serve is refused with ErrWrongShard.
func TestNodeStart(t *testing.T) {
	w := recordLog(t, sim.WorkloadOptions{Seed: 5, Sessions: 4, Requests: 60, BatchSize: 6}, 1, nil)
	logs := [][][]byte{encodeLog(t, w, 0, 1), encodeLog(t, w, 1, 1)}
	n, err := follower.OpenNode("/node", []uint32{0, 1}, &follower.NodeOptions{Follower: *testOptions(vfs.NewMem())})
	require.NoError(t, err)
	defer n.Close()
	var queue [2][]*store.Pending
	for i := range logs[0] {
		for s := range 2 {
			queue[s] = append(queue[s], n.Start(logs[s][i]))
			if len(queue[s]) == 3 {
				res, err := queue[s][0].Wait()
				require.NoError(t, err)
				require.False(t, res.Ack.Refused)
				queue[s] = queue[s][1:]
			}
		}
	}
	for s := range 2 {
		for _, p := range queue[s] {
			_, err := p.Wait()
			require.NoError(t, err)
		}
		require.NoError(t, n.Follower(uint32(s), func(f *follower.Follower) error { return w.Oracle.Verify(f.State()) }))
	}
	other, err := wal.AppendBatch(nil, 7, 1, 1, []wal.Event{{Op: wal.OpOpen, Session: session.ID{1}, Seq: 1, Time: 1}})
	require.NoError(t, err)
	res, err := n.Start(other).Wait()
	require.ErrorIs(t, err, replication.ErrWrongShard)
	require.True(t, res.Ack.Refused)
}

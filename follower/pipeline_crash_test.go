package follower_test

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/stretchr/testify/require"
)

// pipelineCrashFS is crashFS (exactlyonce_test.go) that also notes, when it
// takes the crash image, the highest LSN acknowledged so far and how many
// batches were between Start and their ack.
type pipelineCrashFS struct {
	*crashFS
	acked, inFlight         atomic.Int64
	ackedAtCrash, inFlight0 int64
}

func newPipelineCrashFS(k, pct int) *pipelineCrashFS {
	c := &pipelineCrashFS{crashFS: &crashFS{mem: vfs.NewCrashableMem(), k: k,
		rng: rand.New(rand.NewPCG(uint64(k), uint64(pct))), pct: pct}}
	c.onClone = func() { c.ackedAtCrash, c.inFlight0 = c.acked.Load(), c.inFlight.Load() }
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
	w := recordLog(t, sim.WorkloadConfig{Seed: 7, Sessions: 4, Requests: 120, RetryRate: 0.15, CloseRate: 0.03, BatchSize: 10}, 1, &hostile)
	log := encodeLog(t, w, 0, 1)
	probe := newPipelineCrashFS(-1, 0)
	runPipelinedCrashPoint(t, w, log, probe)
	points := probe.n
	require.Greater(t, points, 20)
	crashed, busy := 0, 0
	for _, pct := range []int{0, 50} {
		for k := 1; k <= points; k++ {
			c := newPipelineCrashFS(k, pct)
			runPipelinedCrashPoint(t, w, log, c)
			c.mu.Lock()
			clone, ackedAtCrash, inFlight := c.clone, c.ackedAtCrash, c.inFlight0
			c.mu.Unlock()
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
	fs := errorfs.Wrap(c.mem, c.crashFS)
	open := func() *follower.Follower {
		f, err := follower.Open("/follower", testOptions(fs))
		require.NoError(t, err)
		return f
	}
	f := open()
	c.mu.Lock()
	c.armed = true
	c.mu.Unlock()
	var queue []*replication.Pending
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

package sim

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/wal"
)

// TestCatchUpWaitsForTheRebuildACrashLost replays, deterministically, the
// interleaving behind the long run's failure of seed 2836 (issue 12):
//
//  1. The promotion's zombie leader leaves follower g diverged: its store
//     holds the deposed leader's last batch, at an LSN the new history
//     (which logs nothing more) does not reach.
//  2. g is refused as diverged and rebuilds from the new leader; its fetch
//     is held once the snapshot is staged and verified (testSnapshotEnd).
//  3. g has a power failure: its filesystem image is taken while the install
//     has not begun; then the held fetch goes on, and the old incarnation
//     installs the snapshot on the lost filesystem and counts the rebuild.
//  4. g restarts on the image — the diverged store, standing beyond the new
//     history's end — and its dials are held until the run polled catchUp
//     twice.
//
// Before the fix catchUp took "refused, rebuilt once, at or beyond the last
// LSN" for caught up at its first poll, and the diverged store was compared
// with the oracle: "follower f? shard 0 … differs from the oracle". Now it
// waits until g's store ends with the final leader's last batch, which
// takes g's second refusal and rebuild.
func TestCatchUpWaitsForTheRebuildACrashLost(t *testing.T) {
	cfg := crashLostRebuildScenario(t)

	var (
		endOnce, releaseOnce sync.Once
		staged               = make(chan struct{})
		release              = make(chan struct{})
		stagedNode           string // written before staged is closed
		crashedNode          atomic.Value
		crashed              atomic.Bool
		polls                atomic.Int32
		gate                 = make(chan struct{})
	)
	testSnapshotEnd = func(node string, shard uint32) {
		first := false
		endOnce.Do(func() { first, stagedNode = true, node; close(staged) })
		if first {
			select { // until g's power failure image was taken
			case <-release:
			case <-time.After(20 * time.Second):
			}
		}
	}
	testCrashImage = func(node string, taken bool) {
		if !taken {
			select { // g's rebuild is staged, not installed
			case <-staged:
			case <-time.After(20 * time.Second):
			}
			return
		}
		crashedNode.Store(node)
		crashed.Store(true)
		releaseOnce.Do(func() { close(release) })
	}
	t.Cleanup(func() { testSnapshotEnd, testCrashImage = nil, nil })
	cfg.Progress = func(applied, total uint64) {
		if polls.Add(1) == 2 {
			close(gate)
		}
	}
	cfg.Wrap = func(f int, s uint32, d replication.Dialer) replication.Dialer {
		if !crashed.Load() {
			return d
		}
		return gatedDialer{d: d, gate: gate}
	}

	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Verified {
		t.Fatalf("seed %d: %v", cfg.Seed, res.VerifyErr)
	}
	// The run went as scripted: a zombie diverged g, g's rebuild was staged
	// when its power failure struck, the image came back diverged (the
	// leader refused the restarted node again) and g was rebuilt again.
	if !res.Zombie || res.Refusals["diverged"] != 1 {
		t.Fatalf("seed %d: zombie %v, refusals %v: want a zombie leader and one diverged follower", cfg.Seed, res.Zombie, res.Refusals)
	}
	var g *FollowerResult
	for i := range res.Followers {
		if res.Followers[i].Crashes > 0 {
			g = &res.Followers[i]
		}
	}
	if g == nil || g.ID != stagedNode || crashedNode.Load() != stagedNode {
		t.Fatalf("seed %d: the power failure (%v) did not strike the follower whose rebuild was staged (%q)", cfg.Seed, crashedNode.Load(), stagedNode)
	}
	fs := g.Shards[0]
	if fs.Refused != "diverged" || fs.Rebuilt != 2 || fs.Shipper.BadHellos < 2 || !fs.Verified {
		t.Fatalf("seed %d: %s: refused %q, rebuilt %d, refused hellos %d, verified %v: want diverged, 2 rebuilds (one the crash image lost), refused again after the restart, verified",
			cfg.Seed, g.ID, fs.Refused, fs.Rebuilt, fs.Shipper.BadHellos, fs.Verified)
	}
	if polls.Load() < 2 {
		t.Fatalf("catchUp polled %d times: it never waited for the rebuild", polls.Load())
	}
}

// crashLostRebuildScenario returns the first seed's options whose schedule
// makes the scenario of TestCatchUpWaitsForTheRebuildACrashLost: one shard,
// two followers, three client batches, the promotion (a zombie, after every
// follower caught up) before the third — which the zombie logs, with a put
// or an add, so that the diverged store differs from the oracle — and a power
// failure after it. With two followers, the failure strikes the one that was
// not promoted: the zombie's target.
func crashLostRebuildScenario(t *testing.T) Options {
	for seed := uint64(1); seed <= 20_000; seed++ {
		cfg := Options{
			Seed: seed, Shards: 1, Followers: 2,
			Workload: WorkloadOptions{Sessions: 2, Requests: 5, BatchSize: 3},
			Promote:  true, Diverge: true, Restarts: 1, Rebuild: true,
			Timeout: 30 * time.Second, Trace: trace,
		}
		if err := cfg.EnsureDefaults().Validate(); err != nil {
			t.Fatal(err)
		}
		w := GenerateWorkload(cfg.Workload)
		if len(w.Batches) != 3 {
			continue
		}
		effect := false
		for _, req := range w.Batches[2] {
			effect = effect || req.Event.Op == wal.OpPut || req.Event.Op == wal.OpAdd
		}
		if !effect {
			continue
		}
		promoteAt, crashAfter := -1, false
		for _, e := range (&run{cfg: cfg, rng: scheduleRNG(seed)}).schedule(len(w.Batches)) {
			switch e.kind {
			case evPromote:
				promoteAt = e.at
			case evFollower:
				crashAfter = e.restart == Crash && e.at == len(w.Batches)
			}
		}
		if promoteAt == 2 && crashAfter {
			return cfg
		}
	}
	t.Fatal("no seed makes the scenario")
	return Options{}
}

// gatedDialer holds every dial until gate is closed.
type gatedDialer struct {
	d    replication.Dialer
	gate <-chan struct{}
}

func (g gatedDialer) Dial(ctx context.Context, hello replication.Ack) (replication.FollowerConn, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.d.Dial(ctx, hello)
}

package testutil

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
)

// TestRestartTargetWithinLog checks the restart point of every incarnation
// lies in (from, last] — and is last itself when the follower opened
// already caught up, which the waiter would otherwise never see reached.
func TestRestartTargetWithinLog(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, last := range []uint64{1, 2, 7, 2037} {
		for from := uint64(0); from <= last; from++ {
			for left := 1; left <= 4; left++ {
				got := restartTarget(rng, from, last, left)
				if got > last || (from < last && got <= from) || (from == last && got != last) {
					t.Fatalf("restartTarget(from %d, last %d, left %d) = %d", from, last, left, got)
				}
			}
		}
	}
}

// TestPipelineRestartsCaughtUpFollower is the cause of a flaky
// TestExactlyOnceOverGRPC ("follower stuck at applied position 2037 of
// 2037"): the waiter polls the follower's position, and when it is slow to
// run (a loaded machine) the follower applies past its restart target, up to
// the end of the log. The next incarnation then opens caught up. Here the
// waiter is made slow on purpose through Progress, so every incarnation
// after the first opens at the end of the log; the run must still finish.
func TestPipelineRestartsCaughtUpFollower(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// slowWaiter stands in for a waiter descheduled while the follower
	// replicates the rest of the log.
	slowWaiter := func(applied, total uint64) {
		if applied < total {
			time.Sleep(500 * time.Millisecond)
		}
	}
	cfg := PipelineConfig{
		Seed:     3,
		Workload: WorkloadConfig{Sessions: 4, Events: 300, BatchSize: 32},
		Faults:   replication.FaultsNone,
		Restarts: 3,
		Follower: follower.Options{Logger: quiet, NoSync: true},
		Progress: slowWaiter,
		Timeout:  20 * time.Second,
	}
	t.Run("single", func(t *testing.T) {
		c := cfg
		c.Dir = t.TempDir()
		res, err := RunPipeline(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Verified {
			t.Fatal(res.VerifyErr)
		}
		if res.Restarts+res.Crashes != c.Restarts {
			t.Fatalf("%d restarts and %d kills, want %d in all", res.Restarts, res.Crashes, c.Restarts)
		}
	})
	t.Run("sharded", func(t *testing.T) {
		c := cfg
		c.Dir = t.TempDir()
		res, err := RunShardedPipeline(context.Background(), ShardedPipelineConfig{PipelineConfig: c, Shards: 2})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Verified {
			t.Fatal(res.VerifyErr)
		}
	})
}

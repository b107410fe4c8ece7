package follower_test

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/sim"
	"github.com/stretchr/testify/require"
)

// TestPipelineExactlyOnce runs the real moving parts — a client through the
// leader (its WAL and store on disk), its Fanout, an InProcess link with
// seeded faults, a follower node on disk with clean restarts and kills — and
// checks the oracle and the counters (sim.Run).
func TestPipelineExactlyOnce(t *testing.T) {
	seeds := 12
	if os.Getenv("ONCEWAL_LONG") != "" {
		seeds = 200
	}
	presets := []struct {
		name   string
		faults inprocess.FaultOptions
	}{{"none", inprocess.FaultsNone}, {"light", inprocess.FaultsLight}, {"heavy", inprocess.FaultsHeavy}}
	for _, p := range presets {
		t.Run(p.name, func(t *testing.T) {
			for seed := uint64(1); seed <= uint64(seeds/len(presets)); seed++ {
				res, err := sim.Run(context.Background(), sim.Options{
					Dir:      t.TempDir(),
					Seed:     seed,
					Workload: sim.WorkloadOptions{Sessions: 10, Requests: 1500, RetryRate: 0.05, CloseRate: 0.01, LateRate: 0.01, BatchSize: 40},
					Faults:   p.faults,
					Restarts: 3,
					Follower: follower.Options{Store: store.Options{Logger: quietLogger}},
					Timeout:  time.Minute,
				})
				require.NoError(t, err, "seed %d", seed)
				require.True(t, res.Verified, "seed %d: %v", seed, res.VerifyErr)
				require.Equal(t, res.Shards[0].LastLSN, uint64(res.Logged))
				require.Equal(t, res.Shards[0].LastLSN, res.Followers[0].Shards[0].AppliedLSN)
			}
		})
	}
}

// TestCloseStopsServe checks that Close returns only after Serve has
// returned and leaves no goroutine behind.
func TestCloseStopsServe(t *testing.T) {
	before := runtime.NumGoroutine()
	tr := inprocess.New(inprocess.FaultsNone, 1)
	f, err := follower.Open(t.TempDir(), &follower.Options{Store: store.Options{Logger: quietLogger}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- f.Serve(context.Background(), tr) }()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, f.Close())
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	require.NoError(t, f.Close(), "Close is idempotent")
	require.NoError(t, tr.Close())
	// Poll by hand: require.Eventually runs its condition on a goroutine of its own.
	for i := 0; runtime.NumGoroutine() > before; i++ {
		require.Less(t, i, 500, "goroutines leaked: %d before, %d after", before, runtime.NumGoroutine())
		time.Sleep(10 * time.Millisecond)
	}
}

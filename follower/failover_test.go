package follower_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// TestFailoverRequestsExactlyOnce is the request-level proof (issue 6): a
// client sends non-idempotent adds under request keys to leader A, A ships
// its WAL to follower B and is killed at a random point (after a claim,
// before shipping a commit, after shipping but before the ack, after the
// answer), B is promoted with a higher epoch, and the client retries against
// B every request whose answer it did not see. Invariant, on B (the
// surviving history):
//
//   - every request took effect exactly once (each counter equals the sum
//     of its requests' deltas);
//   - every retry of a request B has a record of got the original outcome,
//     verbatim; a claim inherited in flight from A blocked retries until its
//     lease ended on the WAL clock, then the request executed once;
//   - with synchronous replication (A answers after B's ack) no answer the
//     client saw is ever lost;
//   - with asynchronous replication (A answers at commit) the answers lost
//     are exactly those A gave for requests logged beyond B's applied LSN at
//     promotion: their effect died with A (B never had it), so the retry
//     re-executes them once on B — exactly once in the surviving history,
//     but with a new outcome. That is the window asynchronous replication
//     leaves; nothing else is lost;
//   - A, coming back, is fenced: B's store refuses A's epoch.
//
// Every seed alternates sync/async and draws its kill point. The default run
// covers 120 seeds; ONCEWAL_LONG=1 runs 2000, ONCEWAL_FAILOVER_SEEDS=n runs n,
// ONCEWAL_FAILOVER_SEED=n replays one.
func TestFailoverRequestsExactlyOnce(t *testing.T) {
	seeds := []uint64{}
	n := 120
	if os.Getenv("ONCEWAL_LONG") != "" {
		n = 2000
	}
	if s := os.Getenv("ONCEWAL_FAILOVER_SEEDS"); s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(t, err)
		n = v
	}
	for i := range n {
		seeds = append(seeds, uint64(i+1))
	}
	if s := os.Getenv("ONCEWAL_FAILOVER_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		seeds = []uint64{v}
	}
	var total testutil.FailoverResult
	phases := map[int]int{}
	for _, seed := range seeds {
		res, err := testutil.RunFailover(testutil.FailoverConfig{
			Dir: t.TempDir(), Seed: seed, Async: seed%2 == 0, Requests: 12 + int(seed%29),
		})
		require.NoError(t, err, "seed %d", seed)
		if !res.Verified {
			t.Fatalf("seed %d (async=%v, killed at request %d %s): %v\nreplay: ONCEWAL_FAILOVER_SEED=%d go test -run TestFailoverRequestsExactlyOnce ./follower/",
				seed, seed%2 == 0, res.KilledAt, testutil.KillPhaseName(res.KillPhase), res.VerifyErr, seed)
		}
		require.True(t, res.Fenced)
		phases[res.KillPhase]++
		total.Retried += res.Retried
		total.Replayed += res.Replayed
		total.Reexecuted += res.Reexecuted
		total.InFlightWaits += res.InFlightWaits
		total.LostAnswers += res.LostAnswers
		total.Duplicates += res.Duplicates
		total.SeenOnA += res.SeenOnA
	}
	t.Logf("%d seeds: kill phases %v; %d answers seen on A, %d retries on B: %d replayed, %d re-executed, %d in-flight waits, %d async answers lost, %d duplicate deliveries discarded",
		len(seeds), phases, total.SeenOnA, total.Retried, total.Replayed, total.Reexecuted, total.InFlightWaits, total.LostAnswers, total.Duplicates)
	if len(seeds) >= 100 {
		// The run must have exercised every path it claims to cover.
		require.Len(t, phases, 4)
		require.Positive(t, total.Replayed)
		require.Positive(t, total.Reexecuted)
		require.Positive(t, total.InFlightWaits)
		require.Positive(t, total.LostAnswers)
		require.Positive(t, total.Duplicates)
	}
}

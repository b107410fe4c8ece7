package follower_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/oncewal/oncewal/sim"
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
// The run also has slow owners that extend their lease past the default
// (B keeps the extended lease end when A dies mid-request), duplicate
// deliveries that wait on A for the owner's outcome, and waiting claims on
// B — concurrent pairs among them — that block on a claim inherited from A
// until its lease ends on the WAL clock. A's owner, coming back after the
// promotion, can neither extend nor complete its claim on B.
//
// Beyond the run's own checks, every seed's client history (each request's
// call and final answer, across the kill and the promotion) is checked by
// porcupine, a linearizability checker, against the sequential model of
// the request API (requestModel: the first execution of a key happens once,
// every later answer replays it).
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
	var total sim.FailoverResult
	phases := map[int]int{}
	for _, seed := range seeds {
		res, err := sim.RunFailover(sim.FailoverOptions{
			Dir: t.TempDir(), Seed: seed, Async: seed%2 == 0, Requests: 12 + int(seed%29),
		})
		require.NoError(t, err, "seed %d", seed)
		if !res.Verified {
			t.Fatalf("seed %d (async=%v, killed at request %d %s): %v\nreplay: ONCEWAL_FAILOVER_SEED=%d go test -run TestFailoverRequestsExactlyOnce ./follower/",
				seed, seed%2 == 0, res.KilledAt, sim.KillPhaseName(res.KillPhase), res.VerifyErr, seed)
		}
		require.True(t, res.Fenced)
		if r := checkHistory(t, res.History); r != porcupine.Ok {
			t.Fatalf("seed %d: client history not linearizable against the request model (%s)\nreplay: ONCEWAL_FAILOVER_SEED=%d go test -run TestFailoverRequestsExactlyOnce ./follower/",
				seed, r, seed)
		}
		phases[res.KillPhase]++
		total.Extensions += res.Extensions
		total.ExtendedInherited += res.ExtendedInherited
		total.WaitingOnA += res.WaitingOnA
		total.WaitingOnB += res.WaitingOnB
		total.History = append(total.History, res.History...)
		total.Retried += res.Retried
		total.Replayed += res.Replayed
		total.Reexecuted += res.Reexecuted
		total.InFlightWaits += res.InFlightWaits
		total.LostAnswers += res.LostAnswers
		total.Duplicates += res.Duplicates
		total.SeenOnA += res.SeenOnA
	}
	t.Logf("%d seeds: kill phases %v; %d answers seen on A, %d requests to B: %d replayed, %d re-executed, %d in-flight waits, %d async answers lost, %d duplicate deliveries discarded",
		len(seeds), phases, total.SeenOnA, total.Retried, total.Replayed, total.Reexecuted, total.InFlightWaits, total.LostAnswers, total.Duplicates)
	t.Logf("%d lease extensions, %d extended leases inherited by B, %d waiting duplicates on A, %d waiting claims on B; %d client operations checked linearizable",
		total.Extensions, total.ExtendedInherited, total.WaitingOnA, total.WaitingOnB, len(total.History))
	if len(seeds) >= 100 {
		// The run must have exercised every path it claims to cover.
		require.Len(t, phases, 4)
		require.Positive(t, total.Replayed)
		require.Positive(t, total.Reexecuted)
		require.Positive(t, total.InFlightWaits)
		require.Positive(t, total.LostAnswers)
		require.Positive(t, total.Duplicates)
		require.Positive(t, total.Extensions)
		require.Positive(t, total.ExtendedInherited)
		require.Positive(t, total.WaitingOnA)
		require.Positive(t, total.WaitingOnB)
	}
}

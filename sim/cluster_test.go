package sim

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"
)

// seeds returns the seeds to run: ONCEWAL_SEED=n replays one,
// ONCEWAL_SEEDS=n runs n, ONCEWAL_LONG=1 runs long, else def.
func seeds(t *testing.T, def, long int) (first uint64, n int) {
	if s := os.Getenv("ONCEWAL_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v, 1
	}
	if s := os.Getenv("ONCEWAL_SEEDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		return 1, v
	}
	if os.Getenv("ONCEWAL_LONG") != "" {
		return 1, long
	}
	return 1, def
}

var trace func(string, ...any)

func init() {
	if os.Getenv("ONCEWAL_TRACE") != "" {
		trace = func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	}
}

var presets = []inprocess.FaultOptions{inprocess.FaultsNone, inprocess.FaultsLight, inprocess.FaultsHeavy}

// clusterConfig is the multi-follower simulation of one seed.
func clusterConfig(seed uint64) Options {
	return Options{
		Seed:   seed,
		Shards: 2, Followers: 3,
		Workload: WorkloadOptions{Sessions: 6, Requests: 60, BatchSize: 6, RetryRate: 0.1, CloseRate: 0.05, LateRate: 0.03},
		LinkFaults: func(f int, s uint32) inprocess.FaultOptions {
			return presets[ShardSeed(seed, uint32(f*2)+s+100)%3]
		},
		Restarts: 2, LeaderRestarts: 1, Promote: true, Answers: 3,
		// A late joiner in every fourth seed: it costs a leader restart
		// and a rebuild of every shard.
		Rebuild: true, LateJoiners: map[bool]int{true: 1}[seed%4 == 1],
		// Small segments: retention deletes the start of the log while
		// the run goes on, before most late joins.
		SegmentSize: 512, RetentionInterval: 5 * time.Millisecond,
		RetransmitTimeout: 5 * time.Millisecond,
		Timeout:           time.Minute,
		Trace:             trace,
	}
}

// TestClusterExactlyOnceSeeds is the multi-follower exactly-once
// simulation (see the package documentation for its invariant): 500 seeds
// by default, 10,000 with ONCEWAL_LONG=1, ONCEWAL_SEEDS=n for n,
// ONCEWAL_SEED=n to replay one (ONCEWAL_TRACE=1 narrates it). Seeds run
// four at a time: a run mostly waits (retransmit timers, redials), and
// each run's choices come from its seed alone.
func TestClusterExactlyOnceSeeds(t *testing.T) {
	first, n := seeds(t, 500, 10_000)
	start := time.Now()
	var mu sync.Mutex
	tot := Result{Refusals: map[string]int{}}
	var failed []string
	followers, restarts, kills, crashes, promotions, zombies, lateRebuilt := 0, 0, 0, 0, 0, 0, 0
	next := first
	var wg sync.WaitGroup
	for range min(8, n) {
		wg.Go(func() {
			for {
				mu.Lock()
				seed := next
				next++
				stop := seed >= first+uint64(n) || len(failed) > 0
				mu.Unlock()
				if stop {
					return
				}
				res, err := Run(context.Background(), clusterConfig(seed))
				mu.Lock()
				switch {
				case err != nil:
					failed = append(failed, fmt.Sprintf("seed %d: %v", seed, err))
				case !res.Verified:
					failed = append(failed, fmt.Sprintf("seed %d: %v", seed, res.VerifyErr))
				default:
					tot.Logged += res.Logged
					tot.Lost += res.Lost
					tot.Refused += res.Refused
					tot.Answers += res.Answers
					tot.LeaderRestarts += res.LeaderRestarts
					tot.LeaderCrashes += res.LeaderCrashes
					tot.Transplants += res.Transplants
					tot.LateJoins += res.LateJoins
					tot.JoinsAfterRetention += res.JoinsAfterRetention
					tot.Rebuilds += res.Rebuilds
					if res.Promoted != "" {
						promotions++
					}
					if res.Zombie {
						zombies++
					}
					for k, v := range res.Refusals {
						tot.Refusals[k] += v
					}
					for _, f := range res.Followers {
						followers++
						restarts += f.Restarts
						kills += f.Kills
						crashes += f.Crashes
						for _, fs := range f.Shards {
							if f.Late && fs.Rebuilt > 0 {
								lateRebuilt++
							}
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, f := range failed {
		t.Errorf("%s (replay: ONCEWAL_SEED=<seed> ONCEWAL_TRACE=1 go test ./sim -run TestClusterExactlyOnceSeeds)", f)
	}
	if len(failed) > 0 {
		return
	}
	t.Logf("%d seeds (2 shards × 3 followers, a late joiner in every fourth seed) in %v: %d events logged, %d refused (late writes), %d lost with a deposed leader; "+
		"%d majority answers, all survived; follower restarts %d clean, %d killed, %d power failures; leader restarts %d clean, %d power failures; "+
		"%d promotions (%d with a zombie leader, %d shards rebuilt from a further follower); refused, then rebuilt from the leader and verified: %v; "+
		"%d late joiners (%d after retention deleted the start of the epoch's log), %d of their shard stores rebuilt; %d rebuilds in all",
		n, time.Since(start).Round(time.Millisecond), tot.Logged, tot.Refused, tot.Lost, tot.Answers, restarts, kills, crashes,
		tot.LeaderRestarts, tot.LeaderCrashes, promotions, zombies, tot.Transplants, tot.Refusals, tot.LateJoins, tot.JoinsAfterRetention, lateRebuilt, tot.Rebuilds)
	if n >= 100 {
		if promotions != n || tot.Answers == 0 || crashes == 0 || tot.LeaderCrashes == 0 || tot.Refusals["diverged"] == 0 || tot.Refusals["behind retention"] == 0 ||
			tot.LateJoins != (n+3)/4 || tot.JoinsAfterRetention == 0 || lateRebuilt == 0 {
			t.Errorf("the sweep did not exercise every path")
		}
	}
}

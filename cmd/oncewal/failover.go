package main

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/sim"
)

// failoverSeeds is how many seeds per replication mode the --failover demo
// sweeps after its two narrated runs (a variable so tests can shorten it).
var failoverSeeds = 25

// failoverReport is the --failover --json output.
type failoverReport struct {
	Verified      bool              `json:"verified"`
	Error         string            `json:"error,omitempty"`
	Seed          uint64            `json:"seed"`
	Runs          []failoverRunJSON `json:"runs"`
	Totals        map[string]int    `json:"totals"`
	Seconds       float64           `json:"seconds"`
	Guarantee     string            `json:"guarantee"`
	KillPhaseRuns map[string]int    `json:"kill_phase_runs"`
}

type failoverRunJSON struct {
	Seed          uint64 `json:"seed"`
	Async         bool   `json:"async"`
	Requests      int    `json:"requests"`
	KilledAt      int    `json:"killed_at_request"`
	KillPhase     string `json:"kill_phase"`
	ALastLSN      uint64 `json:"a_last_lsn"`
	PromotedAt    uint64 `json:"b_lsn_at_promotion"`
	SeenOnA       int    `json:"answers_seen_on_a"`
	Retried       int    `json:"retried_on_b"`
	Replayed      int    `json:"replayed"`
	Reexecuted    int    `json:"reexecuted"`
	InFlightWaits int    `json:"inflight_waits"`
	LostAnswers   int    `json:"async_answers_lost"`
	Fenced        bool   `json:"old_leader_fenced"`
	Verified      bool   `json:"verified"`
	Error         string `json:"error,omitempty"`
}

// runFailoverDemo runs the request-level failover scenario on disk: two
// narrated runs (synchronous and asynchronous replication), then a sweep of
// seeds over both, each verified by sim.RunFailover. Exit 0 only if
// every run verified.
func runFailoverDemo(root string, seed uint64, asJSON bool, stdout, stderr io.Writer) int {
	start := time.Now()
	rep := failoverReport{Seed: seed, Totals: map[string]int{}, KillPhaseRuns: map[string]int{}, Verified: true,
		Guarantee: "every request takes effect exactly once in the surviving history and every retry within the replay window gets the original outcome; with asynchronous replication, answers A gave for requests B never received are lost with A and those requests re-execute once on B"}
	run := func(i int, s uint64, async bool, narrate bool) bool {
		cfg := sim.FailoverOptions{
			Dir: filepath.Join(root, fmt.Sprintf("run-%03d", i)), Seed: s, Async: async, Requests: 40, FS: vfs.Default,
			Logger: slog.New(slog.DiscardHandler), // the report is the output; the nodes' lines are not
		}
		if narrate && !asJSON {
			mode := "synchronous replication (A answers after B's ack)"
			if async {
				mode = "asynchronous replication (A answers at commit)"
			}
			fmt.Fprintf(stdout, "\n== seed %d, %s\n", s, mode)
			cfg.Trace = func(format string, args ...any) { fmt.Fprintf(stdout, "   "+format+"\n", args...) }
		}
		res, err := sim.RunFailover(cfg)
		j := failoverRunJSON{Seed: s, Async: async}
		if err != nil {
			j.Error = err.Error()
		} else {
			j = failoverRunJSON{Seed: s, Async: async, Requests: res.Requests, KilledAt: res.KilledAt,
				KillPhase: sim.KillPhaseName(res.KillPhase), ALastLSN: res.ALastLSN, PromotedAt: res.PromotedAt,
				SeenOnA: res.SeenOnA, Retried: res.Retried, Replayed: res.Replayed, Reexecuted: res.Reexecuted,
				InFlightWaits: res.InFlightWaits, LostAnswers: res.LostAnswers, Fenced: res.Fenced, Verified: res.Verified}
			if res.VerifyErr != nil {
				j.Error = res.VerifyErr.Error()
			}
		}
		rep.Runs = append(rep.Runs, j)
		rep.Verified = rep.Verified && j.Verified
		if !j.Verified && rep.Error == "" {
			rep.Error = fmt.Sprintf("seed %d async=%v: %s", s, async, j.Error)
		}
		rep.Totals["requests"] += j.Requests
		rep.Totals["answers_seen_on_a"] += j.SeenOnA
		rep.Totals["retried_on_b"] += j.Retried
		rep.Totals["replayed"] += j.Replayed
		rep.Totals["reexecuted"] += j.Reexecuted
		rep.Totals["inflight_waits"] += j.InFlightWaits
		rep.Totals["async_answers_lost"] += j.LostAnswers
		rep.KillPhaseRuns[j.KillPhase]++
		if narrate && !asJSON {
			fmt.Fprintf(stdout, "   %d answers seen on A; %d retries on B: %d replayed from the replicated ledger, %d executed on B, %d waited out an inherited lease; %d async answers lost; old leader fenced: %v; verified: %v\n",
				j.SeenOnA, j.Retried, j.Replayed, j.Reexecuted, j.InFlightWaits, j.LostAnswers, j.Fenced, j.Verified)
			if j.Error != "" {
				fmt.Fprintf(stdout, "   ERROR: %s\n", j.Error)
			}
		}
		return j.Verified
	}
	run(0, seed, false, true)
	run(1, seed+1, true, true)
	for i := range 2 * failoverSeeds {
		run(2+i, seed+2+uint64(i), i%2 == 1, false)
	}
	rep.Seconds = time.Since(start).Seconds()

	if asJSON {
		if err := writeJSONReport(stdout, rep); err != nil {
			fmt.Fprintln(stderr, "oncewal demo:", err)
			return 1
		}
	} else {
		fmt.Fprintf(stdout, "\n== %d more runs (seeds %d..%d, sync and async alternating, stores and WALs on disk)\n",
			2*failoverSeeds, seed+2, seed+1+2*uint64(failoverSeeds))
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		for _, k := range []string{"requests", "answers_seen_on_a", "retried_on_b", "replayed", "reexecuted", "inflight_waits", "async_answers_lost"} {
			fmt.Fprintf(tw, "   %s\t%d\n", k, rep.Totals[k])
		}
		fmt.Fprintf(tw, "   kill phases\t%v\n", rep.KillPhaseRuns)
		fmt.Fprintf(tw, "   seconds\t%.1f\n", rep.Seconds)
		_ = tw.Flush()
		fmt.Fprintf(stdout, "\nguarantee: %s\n", rep.Guarantee)
		if rep.Verified {
			fmt.Fprintf(stdout, "VERIFIED: %d runs, every request exactly once on the promoted follower, every replay verbatim\n", len(rep.Runs))
		} else {
			fmt.Fprintf(stdout, "FAILED: %s\n", rep.Error)
		}
	}
	if !rep.Verified {
		return 1
	}
	return 0
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/testutil"
)

const demoSynopsis = `demo [flags]

Runs a leader (WAL on disk) -> in-process transport with seeded faults ->
follower (embedded Pebble, on disk) in one process, restarts and kills the
follower along the way, then checks the follower's state against an oracle
that applies every distinct operation exactly once. Exit status 0 only if
they match.`

// Upper bounds of the demo's sizes: far beyond a demonstration, short of
// exhausting memory (the workload and its oracle are held in memory).
const (
	maxDemoSessions = 1_000_000
	maxDemoEvents   = 50_000_000
	maxDemoRestarts = 1000
)

// demoReport is the --json output.
type demoReport struct {
	Verified        bool        `json:"verified"`
	Error           string      `json:"error,omitempty"`
	Seed            uint64      `json:"seed"`
	Faults          string      `json:"faults"`
	Sessions        int         `json:"sessions"`
	Logged          int         `json:"logged"`
	Distinct        int         `json:"distinct"`
	Reappended      int         `json:"reappended"`
	Retries         int         `json:"retries"`
	LateWrites      int         `json:"late_writes"`
	Batches         int         `json:"batches"`
	BatchesShipped  uint64      `json:"batches_shipped"`
	BatchesResent   uint64      `json:"batches_resent"`
	Delivered       uint64      `json:"delivered"`
	Applied         uint64      `json:"applied"`
	DiscardedPos    uint64      `json:"discarded_position"`
	DiscardedHWM    uint64      `json:"discarded_hwm"`
	DiscardedWindow uint64      `json:"discarded_window"`
	DiscardedBatch  uint64      `json:"discarded_in_batch"`
	SkippedClosed   uint64      `json:"skipped_closed"`
	Refused         uint64      `json:"refused_events"`
	GapsRefused     uint64      `json:"gaps_refused"`
	Restarts        int         `json:"restarts"`
	Crashes         int         `json:"kills"`
	TransportDups   uint64      `json:"transport_duplicates"`
	TransportDrops  uint64      `json:"transport_drops"`
	Disconnects     uint64      `json:"disconnects"`
	Seconds         float64     `json:"seconds"`
	EventsPerSec    float64     `json:"events_per_sec"`
	Shards          []demoShard `json:"shards,omitempty"` // with --shards > 1
}

// demoShard is one shard's row of a sharded demo (--shards).
type demoShard struct {
	Shard     uint32 `json:"shard"`
	Sessions  int    `json:"sessions"`
	Batches   int    `json:"batches"`
	LastLSN   uint64 `json:"last_lsn"`
	Applied   uint64 `json:"applied"`
	Discarded uint64 `json:"discarded"`
	Shipped   uint64 `json:"batches_shipped"`
	Faults    uint64 `json:"transport_faults"`
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("demo", demoSynopsis, stderr)
	dir := fs.String("dir", "", "keep the leader WAL in DIR/leader and the follower store in DIR/follower (default: a temp dir removed at exit)")
	sessions := fs.Int("sessions", 100, "concurrent client sessions")
	events := fs.Int("events", 100_000, "client operations to log")
	dupRate := fs.Float64("dup-rate", 0.05, "share of appends that re-log an earlier event verbatim (same session, SeqNo, key)")
	retryRate := fs.Float64("retry-rate", 0.05, "share of appends that retry an operation under a fresh SeqNo with its client key")
	faults := fs.String("faults", "light", "transport faults: none|light|heavy")
	restarts := fs.Int("restarts", 4, "follower restarts during the run (every second one is a kill)")
	seed := fs.Uint64("seed", 1, "seed for the workload and every fault decision")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	network := fs.Bool("network", false, "ship over gRPC with mutual TLS on loopback TCP (certificates made in memory) instead of the in-process transport; --faults is then ignored")
	failover := fs.Bool("failover", false, "request-level demo instead: client requests with idempotency keys against leader A, A killed at random points, follower B promoted, retries against B; verifies exactly-once and original outcomes (see failover.go)")
	shards := fs.Int("shards", 1, "shards: the leader routes sessions to `N` WALs and shippers, one follower node serves all N (faults seeded per shard; not with --network)")
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	fc, known := map[string]replication.FaultConfig{
		"none": replication.FaultsNone, "light": replication.FaultsLight, "heavy": replication.FaultsHeavy,
	}[*faults]
	var c flagCheck
	if !known {
		c.failf("--faults %q: want none, light or heavy", *faults)
	}
	inRange(&c, "sessions", *sessions, 1, maxDemoSessions)
	inRange(&c, "events", *events, 1, maxDemoEvents)
	dupOK := inRange(&c, "dup-rate", *dupRate, 0, 1)
	if inRange(&c, "retry-rate", *retryRate, 0, 1) && dupOK && *dupRate+*retryRate >= 1 {
		c.failf("--dup-rate + --retry-rate must be < 1 (some appends must be fresh operations)")
	}
	inRange(&c, "restarts", *restarts, 0, maxDemoRestarts)
	inRange(&c, "shards", *shards, 1, replication.MaxShards)
	if *shards > 1 && *network {
		c.failf("--shards > 1 does not combine with --network")
	}
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}

	root := *dir
	if root == "" {
		tmp, err := os.MkdirTemp("", "oncewal-demo-")
		if err != nil {
			fmt.Fprintln(stderr, "oncewal demo:", err)
			return 1
		}
		defer os.RemoveAll(tmp)
		root = tmp
	}
	if *failover {
		return runFailoverDemo(root, *seed, *asJSON, stdout, stderr)
	}

	var progress func(applied, total uint64)
	if !*asJSON && isTerminal(stderr) {
		var last time.Time
		progress = func(applied, total uint64) {
			if now := time.Now(); now.Sub(last) > 100*time.Millisecond || applied == total {
				last = now
				fmt.Fprintf(stderr, "\rfollower applied LSN %d / %d", applied, total)
			}
		}
	}
	pcfg := testutil.PipelineConfig{
		Dir:  root,
		Seed: *seed,
		Workload: testutil.WorkloadConfig{
			Sessions: *sessions, Events: *events, DupRate: *dupRate, RetryRate: *retryRate,
			CloseRate: 0.002, BatchSize: 512,
		},
		Faults:    fc,
		Restarts:  *restarts,
		Follower:  follower.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Progress:  progress,
		Transport: loopbackTransport(*network),
	}
	var res *testutil.PipelineResult
	var shardRes []testutil.ShardResult
	var err error
	if *shards > 1 {
		var sres *testutil.ShardedPipelineResult
		sres, err = testutil.RunShardedPipeline(context.Background(), testutil.ShardedPipelineConfig{PipelineConfig: pcfg, Shards: *shards})
		if err == nil {
			res, shardRes = &sres.PipelineResult, sres.Shards
		}
	} else {
		res, err = testutil.RunPipeline(context.Background(), pcfg)
	}
	if progress != nil {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		fmt.Fprintln(stderr, "oncewal demo:", err)
		return 1
	}

	st := res.Follower
	rep := demoReport{
		Verified: res.Verified, Seed: *seed, Faults: *faults, Sessions: *sessions,
		Logged: res.Workload.Logged, Distinct: res.Workload.Distinct,
		Reappended: res.Workload.Reappends, Retries: res.Workload.Retries, LateWrites: res.Workload.LateWrites,
		Batches: res.Batches, BatchesShipped: res.Shipper.BatchesSent, BatchesResent: res.Shipper.BatchesResent,
		Delivered: st.Events, Applied: st.Applied,
		DiscardedPos: st.DiscardedPosition, DiscardedHWM: st.DiscardedHWM,
		DiscardedWindow: st.DiscardedWindow, DiscardedBatch: st.DiscardedInBatch,
		SkippedClosed: st.SkippedClosed, Refused: st.RefusedEvents, GapsRefused: st.SeqGaps + st.OutOfOrder,
		Restarts: res.Restarts, Crashes: res.Crashes,
		TransportDups: res.Transport.BatchesDuplicated, TransportDrops: res.Transport.BatchesDropped,
		Disconnects:  res.Transport.Disconnects,
		Seconds:      res.Elapsed.Seconds(),
		EventsPerSec: float64(st.Events) / res.Elapsed.Seconds(),
	}
	if res.VerifyErr != nil {
		rep.Error = res.VerifyErr.Error()
	}
	for _, sr := range shardRes {
		rep.Shards = append(rep.Shards, demoShard{
			Shard: sr.Shard, Sessions: sr.Sessions, Batches: sr.Batches, LastLSN: sr.LastLSN,
			Applied: sr.Follower.Applied, Discarded: sr.Follower.Discarded(), Shipped: sr.Shipper.BatchesSent,
			Faults: sr.Transport.BatchesDuplicated + sr.Transport.BatchesDropped + sr.Transport.Disconnects,
		})
	}
	if *network {
		rep.Faults = "none (gRPC, mutual TLS, 127.0.0.1)"
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		printDemo(stdout, &rep)
	}
	if !res.Verified {
		return 1
	}
	return 0
}

func printDemo(w io.Writer, r *demoReport) {
	fmt.Fprintf(w, "oncewal demo: seed %d, %d sessions, transport faults %q\n\n", r.Seed, r.Sessions, r.Faults)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name string, v any, note string) { fmt.Fprintf(tw, "  %s\t%10v\t%s\n", name, v, note) }
	row("events logged by the leader", r.Logged, fmt.Sprintf("%d distinct, %d re-appended verbatim, %d client retries, %d late writes", r.Distinct, r.Reappended, r.Retries, r.LateWrites))
	row("batches logged", r.Batches, "")
	row("batches shipped", r.BatchesShipped, fmt.Sprintf("%d resent by the shipper", r.BatchesResent))
	row("transport faults", r.TransportDups+r.TransportDrops+r.Disconnects, fmt.Sprintf("%d duplicated, %d dropped, %d disconnects", r.TransportDups, r.TransportDrops, r.Disconnects))
	row("events delivered", r.Delivered, "every copy that reached the follower")
	row("applied", r.Applied, "")
	row("discarded: position", r.DiscardedPos, "redelivered batch (LSN at or below applied)")
	row("discarded: HWM", r.DiscardedHWM, "SeqNo at or below the session's HWM")
	row("discarded: window", r.DiscardedWindow, "idempotency key recently seen")
	row("discarded: in-batch", r.DiscardedBatch, "key seen earlier in the same batch")
	row("skipped: closed session", r.SkippedClosed, "")
	row("refused, resent later", r.Refused, fmt.Sprintf("%d batches refused for a gap (out of order or SeqNo)", r.GapsRefused))
	row("follower restarts", r.Restarts+r.Crashes, fmt.Sprintf("%d clean, %d killed", r.Restarts, r.Crashes))
	row("events/s delivered", fmt.Sprintf("%.0f", r.EventsPerSec), fmt.Sprintf("over %.2f s", r.Seconds))
	tw.Flush()
	if len(r.Shards) > 0 {
		fmt.Fprintf(w, "\n%d shards (leader: one WAL and shipper each; one follower node, one store each):\n", len(r.Shards))
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  shard\tsessions\tbatches\tlast LSN\tapplied\tdiscarded\tshipped\tfaults\t")
		for _, s := range r.Shards {
			fmt.Fprintf(tw, "  %d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", s.Shard, s.Sessions, s.Batches, s.LastLSN, s.Applied, s.Discarded, s.Shipped, s.Faults)
		}
		tw.Flush()
	}
	if r.Verified {
		fmt.Fprintln(w, "\nverified: follower state matches the oracle (every distinct event applied exactly once)")
	} else {
		fmt.Fprintf(w, "\nNOT VERIFIED: %s\n", r.Error)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

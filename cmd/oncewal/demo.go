package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
)

const demoSynopsis = `demo [flags]

Runs a client → leader (WAL and store on disk) → N follower nodes (embedded
Pebble, on disk) in one process: every follower on its own in-process links
with seeded faults, restarted and killed along the way, then checks every
follower's state against an oracle that applies every distinct request
exactly once. Exit status 0 only if they all match.

With --auto-failover it runs automatic failover instead (package node):
three nodes in one process, each with its own directory and gRPC port on
loopback, elected on a coordinator — etcd when --etcd ENDPOINTS is given,
else coord.Memory in process (the CLI links etcd's client only, no etcd
server) — with clients writing through package client. It kills and pauses
the leader several times (a kill: its Run stopped without resigning, its
lease left to expire; a pause: it hears nothing from the coordinator past
its lease, then resumes), prints each election and failover time (the
leader gone → the first write its successor acknowledged), and checks that
every request is applied exactly once on every replica.`

// Upper bounds of the demo's sizes: far beyond a demonstration, short of
// exhausting memory (the workload and its oracle are held in memory).
const (
	maxDemoSessions  = 1_000_000
	maxDemoEvents    = 50_000_000
	maxDemoRestarts  = 1000
	maxDemoFollowers = 64
)

// demoReport is the --json output. The counters are totals over every
// follower and shard; Followers has one entry per follower.
type demoReport struct {
	Verified        bool           `json:"verified"`
	Error           string         `json:"error,omitempty"`
	Seed            uint64         `json:"seed"`
	Faults          string         `json:"faults"`
	Sessions        int            `json:"sessions"`
	Requests        int            `json:"requests"`
	Logged          int            `json:"logged"`
	Distinct        int            `json:"distinct"`
	Retries         int            `json:"retries"`
	LateRefused     int            `json:"late_writes_refused"`
	Lost            int            `json:"lost_with_deposed_leader"`
	Appends         int            `json:"appends"`
	BatchesShipped  uint64         `json:"batches_shipped"`
	BatchesResent   uint64         `json:"batches_resent"`
	Delivered       uint64         `json:"delivered"`
	Applied         uint64         `json:"applied"`
	DiscardedPos    uint64         `json:"discarded_position"`
	DiscardedHWM    uint64         `json:"discarded_hwm"`
	DiscardedWindow uint64         `json:"discarded_window"`
	DiscardedBatch  uint64         `json:"discarded_in_batch"`
	SkippedClosed   uint64         `json:"skipped_closed"`
	Refused         uint64         `json:"refused_events"`
	GapsRefused     uint64         `json:"gaps_refused"`
	Restarts        int            `json:"restarts"`
	Crashes         int            `json:"kills"`
	LeaderRestarts  int            `json:"leader_restarts"`
	Promoted        string         `json:"promoted,omitempty"`
	TransportDups   uint64         `json:"transport_duplicates"`
	TransportDrops  uint64         `json:"transport_drops"`
	Disconnects     uint64         `json:"disconnects"`
	Seconds         float64        `json:"seconds"`
	EventsPerSec    float64        `json:"events_per_sec"`
	Followers       []demoFollower `json:"followers"`
	Shards          []demoShard    `json:"shards,omitempty"` // with --shards > 1
}

// demoFollower is one follower's row (--followers).
type demoFollower struct {
	ID        string   `json:"id"`
	Verified  bool     `json:"verified"`
	Promoted  bool     `json:"promoted,omitempty"`
	Late      bool     `json:"late,omitempty"`    // joined late, after retention dropped the WAL's start (--rebuild)
	Refused   []string `json:"refused,omitempty"` // shards refused after the promotion or at a late join: "shard N: reason"
	Rebuilt   bool     `json:"rebuilt"`           // a shard store was rebuilt from the leader's snapshot (--rebuild), then verified
	Applied   uint64   `json:"applied"`
	Discarded uint64   `json:"discarded"`
	Delivered uint64   `json:"delivered"`
	Restarts  int      `json:"restarts"`
	Kills     int      `json:"kills"`
	Shipped   uint64   `json:"batches_shipped"`
	Faults    uint64   `json:"transport_faults"`
	LSNs      []uint64 `json:"applied_lsn"` // per shard
}

// demoShard is one shard's row of a sharded demo (--shards), over every
// follower.
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

func linkFaults(t inprocess.Stats) uint64 {
	return t.BatchesDuplicated + t.BatchesDropped + t.Disconnects
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("demo", demoSynopsis, stderr)
	dir := fs.String("dir", "", "keep the leader in DIR/leader and follower i in DIR/f<i>; with --auto-failover, node i in DIR/n<i> (a new or empty DIR) (default: a temp dir removed at exit)")
	sessions := fs.Int("sessions", 100, "concurrent client sessions")
	events := fs.Int("events", 100_000, "client requests to send")
	lateRate := fs.Float64("late-rate", 0.001, "share of requests written to a session the client already closed (the leader refuses them)")
	retryRate := fs.Float64("retry-rate", 0.05, "share of requests that retry an earlier request with its client request ID (the followers discard them)")
	faults := fs.String("faults", "light", "faults of every follower link (each seeded on its own): none|light|heavy")
	followers := fs.Int("followers", 1, "follower nodes: `N` followers per shard, each with its own links, faults and restarts; every one verified")
	restarts := fs.Int("restarts", 4, "follower restarts during the run, spread over the followers (clean or killed, as the seed picks)")
	leaderRestarts := fs.Int("leader-restarts", 0, "leader restarts on its directory during the run")
	promote := fs.Bool("promote", false, "kill the leader mid-run and promote the most advanced follower (needs --followers >= 2); followers it cannot continue are refused and reported")
	rebuild := fs.Bool("rebuild", false, "followers rebuild a refused shard store from the leader's snapshot (--rebuild=auto): the last follower joins late, after retention dropped the WAL's start, and the promotion (implied) gives another a zombie leader's diverged batch; both are rebuilt and verified (needs --followers >= 3)")
	seed := fs.Uint64("seed", 1, "seed for the workload and every fault decision")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	network := fs.Bool("network", false, "ship over gRPC with mutual TLS on loopback TCP (certificates made in memory) instead of the in-process links; --faults is then ignored")
	failover := fs.Bool("failover", false, "request-level demo instead: client requests with idempotency keys against leader A, A killed at random points, follower B promoted, retries against B; verifies exactly-once and original outcomes (see failover.go)")
	shards := fs.Int("shards", 1, "shards: the leader routes sessions to `N` WALs, every follower node serves all N (not with --network)")
	auto := fs.Bool("auto-failover", false, "automatic failover instead: three nodes elected on a coordinator, the leader killed and paused, clients over gRPC; verifies exactly-once on every replica (takes --etcd, --lease-ttl, --kills, --pauses, --clients, --verbose, --shards, --seed, --dir, --json)")
	etcdEndpoints := fs.String("etcd", "", "with --auto-failover: etcd's client `ENDPOINTS` (http://HOST:PORT, comma-separated; plaintext); default: coord.Memory in process")
	leaseTTL := fs.Duration("lease-ttl", 2*time.Second, "with --auto-failover: the leadership lease (etcd: whole seconds, at least 2s); a killed leader is succeeded about one TTL later")
	kills := fs.Int("kills", 2, "with --auto-failover: times the leader is killed")
	pauses := fs.Int("pauses", 1, "with --auto-failover: times the leader is paused past its lease")
	autoClients := fs.Int("clients", 2, "with --auto-failover: concurrent clients, each writing requests one after another")
	verbose := fs.Bool("verbose", false, "with --auto-failover: the nodes' log lines on stderr")
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	fc, known := map[string]inprocess.FaultOptions{
		"none": inprocess.FaultsNone, "light": inprocess.FaultsLight, "heavy": inprocess.FaultsHeavy,
	}[*faults]
	var c flagCheck
	if !known {
		c.failf("--faults %q: want none, light or heavy", *faults)
	}
	inRange(&c, "sessions", *sessions, 1, maxDemoSessions)
	inRange(&c, "events", *events, 1, maxDemoEvents)
	lateOK := inRange(&c, "late-rate", *lateRate, 0, 1)
	if inRange(&c, "retry-rate", *retryRate, 0, 1) && lateOK && *lateRate+*retryRate >= 1 {
		c.failf("--late-rate + --retry-rate must be < 1 (some requests must be fresh operations)")
	}
	inRange(&c, "restarts", *restarts, 0, maxDemoRestarts)
	inRange(&c, "leader-restarts", *leaderRestarts, 0, maxDemoRestarts)
	if inRange(&c, "followers", *followers, 1, maxDemoFollowers) && *promote && *followers < 2 {
		c.failf("--promote needs --followers >= 2")
	}
	if *rebuild && *followers < 3 {
		c.failf("--rebuild needs --followers >= 3 (two for the promotion, one joining late)")
	}
	if *rebuild && *network {
		c.failf("--rebuild does not combine with --network")
	}
	inRange(&c, "shards", *shards, 1, replication.MaxShards)
	if *shards > 1 && *network {
		c.failf("--shards > 1 does not combine with --network")
	}
	var endpoints []string
	checkAutoFlags(&c, fs, *auto)
	if *auto {
		if *etcdEndpoints != "" {
			endpoints = strings.Split(*etcdEndpoints, ",")
			for _, ep := range endpoints {
				if _, err := relayTarget(ep); err != nil {
					c.failf("--etcd: %v", err)
				}
			}
			if !(*leaseTTL >= 2*time.Second && *leaseTTL <= time.Minute && *leaseTTL%time.Second == 0) {
				c.failf("--lease-ttl %v: etcd takes whole seconds from 2s to 1m0s", *leaseTTL)
			}
		} else {
			inRange(&c, "lease-ttl", *leaseTTL, 500*time.Millisecond, time.Minute)
		}
		if inRange(&c, "kills", *kills, 0, maxAutoFaults) && inRange(&c, "pauses", *pauses, 0, maxAutoFaults) && *kills+*pauses == 0 {
			c.failf("--kills + --pauses must be >= 1 (nothing to fail over from)")
		}
		inRange(&c, "clients", *autoClients, 1, maxAutoClients)
		if *dir != "" {
			if ents, err := os.ReadDir(*dir); err == nil && len(ents) > 0 {
				c.failf("--dir %s is not empty: the auto-failover demo starts from empty nodes; give a new or empty directory", *dir)
			}
		}
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
	if *auto {
		cfg := autoConfig{root: root, etcd: endpoints, ttl: *leaseTTL, kills: *kills, pauses: *pauses,
			clients: *autoClients, shards: *shards, seed: *seed, asJSON: *asJSON}
		if *verbose {
			cfg.verbose = stderr
		}
		return runAutoFailoverDemo(cfg, stdout, stderr)
	}

	var progress func(applied, total uint64)
	if !*asJSON && isTerminal(stderr) {
		var last time.Time
		progress = func(applied, total uint64) {
			if now := time.Now(); now.Sub(last) > 100*time.Millisecond || applied == total {
				last = now
				fmt.Fprintf(stderr, "\rfollowers applied %d / %d LSNs", applied, total)
			}
		}
	}
	cfg := sim.Options{
		Dir:  root,
		Seed: *seed,
		Workload: sim.WorkloadOptions{
			Sessions: *sessions, Requests: *events, LateRate: *lateRate, RetryRate: *retryRate,
			CloseRate: 0.002, BatchSize: 512,
		},
		Shards:         *shards,
		Followers:      *followers,
		Faults:         fc,
		Transport:      loopbackTransport(*network),
		Restarts:       *restarts,
		LeaderRestarts: *leaderRestarts,
		Promote:        *promote,
		Follower: follower.Options{Store: store.Options{Logger: slog.New(slog.DiscardHandler),
			// Pebble's own memtable size: the demo's stores grow with the
			// workload (the simulation's default is for many tiny runs).
			PebbleOptions: func(*pebble.Options) {}}},
		Progress: progress,
		Timeout:  time.Hour,
	}
	if *rebuild {
		// One of the N followers joins late; small segments, so that
		// retention drops the WAL's start while the others follow.
		cfg.Followers, cfg.LateJoiners = *followers-1, 1
		cfg.Promote, cfg.Diverge, cfg.Rebuild = true, true, true
		cfg.SegmentSize, cfg.RetentionInterval = 64<<10, 10*time.Millisecond
	}
	res, err := sim.Run(context.Background(), cfg)
	if progress != nil {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		fmt.Fprintln(stderr, "oncewal demo:", err)
		return 1
	}
	rep := demoReportOf(res, *seed, *faults, *sessions)
	if *network {
		rep.Faults = "none (gRPC, mutual TLS, 127.0.0.1)"
	}
	if *asJSON {
		_ = writeJSONReport(stdout, rep)
	} else {
		printDemo(stdout, &rep)
	}
	if !res.Verified {
		return 1
	}
	return 0
}

func demoReportOf(res *sim.Result, seed uint64, faults string, sessions int) demoReport {
	rep := demoReport{
		Verified: res.Verified, Seed: seed, Faults: faults, Sessions: sessions,
		Requests: res.Workload.Requests, Logged: res.Logged, Distinct: res.Distinct, Retries: res.Workload.Retries,
		LateRefused: res.Refused, Lost: res.Lost, Appends: res.Appends,
		LeaderRestarts: res.LeaderRestarts + res.LeaderCrashes, Promoted: res.Promoted,
		Seconds: res.Elapsed.Seconds(),
	}
	if res.VerifyErr != nil {
		rep.Error = res.VerifyErr.Error()
	}
	for _, sr := range res.Shards {
		rep.Shards = append(rep.Shards, demoShard{Shard: sr.Shard, Sessions: sr.Sessions, Batches: sr.Appends, LastLSN: sr.LastLSN})
	}
	var st store.ReceiverStats
	for _, f := range res.Followers {
		row := demoFollower{ID: f.ID, Verified: !f.Promoted, Promoted: f.Promoted, Late: f.Late, Restarts: f.Restarts, Kills: f.Kills + f.Crashes}
		for _, fs := range f.Shards {
			row.Applied += fs.Receiver.Applied
			row.Discarded += fs.Receiver.Discarded()
			row.Delivered += fs.Receiver.Events
			row.Shipped += fs.Shipper.BatchesSent
			row.Faults += linkFaults(fs.Transport)
			row.LSNs = append(row.LSNs, fs.AppliedLSN)
			row.Verified = row.Verified && fs.Verified
			if fs.Refused != "" {
				row.Refused = append(row.Refused, fmt.Sprintf("shard %d: %s", fs.Shard, fs.Refused))
			}
			row.Rebuilt = row.Rebuilt || fs.Rebuilt > 0
			st = st.Add(fs.Receiver)
			rep.BatchesShipped += fs.Shipper.BatchesSent
			rep.BatchesResent += fs.Shipper.BatchesResent
			rep.TransportDups += fs.Transport.BatchesDuplicated
			rep.TransportDrops += fs.Transport.BatchesDropped
			rep.Disconnects += fs.Transport.Disconnects
			sr := &rep.Shards[fs.Shard]
			sr.Applied += fs.Receiver.Applied
			sr.Discarded += fs.Receiver.Discarded()
			sr.Shipped += fs.Shipper.BatchesSent
			sr.Faults += linkFaults(fs.Transport)
		}
		rep.Restarts += f.Restarts
		rep.Crashes += f.Kills + f.Crashes
		rep.Followers = append(rep.Followers, row)
	}
	if len(rep.Shards) == 1 {
		rep.Shards = nil
	}
	rep.Delivered, rep.Applied = st.Events, st.Applied
	rep.DiscardedPos, rep.DiscardedHWM = st.DiscardedPosition, st.DiscardedHWM
	rep.DiscardedWindow, rep.DiscardedBatch = st.DiscardedWindow, st.DiscardedInBatch
	rep.SkippedClosed, rep.Refused, rep.GapsRefused = st.SkippedClosed, st.RefusedEvents, st.SeqGaps+st.OutOfOrder
	rep.EventsPerSec = float64(st.Events) / res.Elapsed.Seconds()
	return rep
}

func printDemo(w io.Writer, r *demoReport) {
	fmt.Fprintf(w, "oncewal demo: seed %d, %d sessions, %d follower(s), link faults %q\n\n", r.Seed, r.Sessions, len(r.Followers), r.Faults)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name string, v any, note string) { fmt.Fprintf(tw, "  %s\t%10v\t%s\n", name, v, note) }
	row("client requests", r.Requests, fmt.Sprintf("%d retries of a request whose answer was lost, %d late writes to closed sessions (refused by the leader)", r.Retries, r.LateRefused))
	row("events logged by the leader", r.Logged, fmt.Sprintf("%d take effect, in %d appends", r.Distinct, r.Appends))
	if r.LeaderRestarts > 0 || r.Promoted != "" {
		row("leader restarts", r.LeaderRestarts, fmt.Sprintf("promoted: %q; %d logged events lost with the deposed leader (never acknowledged by a majority)", r.Promoted, r.Lost))
	}
	row("batches shipped", r.BatchesShipped, fmt.Sprintf("%d resent", r.BatchesResent))
	row("transport faults", r.TransportDups+r.TransportDrops+r.Disconnects, fmt.Sprintf("%d duplicated, %d dropped, %d disconnects", r.TransportDups, r.TransportDrops, r.Disconnects))
	row("events delivered", r.Delivered, "every copy that reached a follower")
	row("applied", r.Applied, "")
	row("discarded: position", r.DiscardedPos, "redelivered batch (LSN at or below applied)")
	row("discarded: HWM", r.DiscardedHWM, "SeqNo at or below the session's HWM")
	row("discarded: window", r.DiscardedWindow, "idempotency key recently seen (a client retry)")
	row("discarded: in-batch", r.DiscardedBatch, "key seen earlier in the same batch")
	row("skipped: closed session", r.SkippedClosed, "")
	row("refused, resent later", r.Refused, fmt.Sprintf("%d batches refused for a gap (out of order or SeqNo)", r.GapsRefused))
	row("follower restarts", r.Restarts+r.Crashes, fmt.Sprintf("%d clean, %d killed", r.Restarts, r.Crashes))
	row("events/s delivered", fmt.Sprintf("%.0f", r.EventsPerSec), fmt.Sprintf("over %.2f s", r.Seconds))
	tw.Flush()

	fmt.Fprintf(w, "\n%d follower(s) (each a node serving every shard over its own links):\n", len(r.Followers))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  follower\tapplied\tdiscarded\tdelivered\tshipped\tfaults\trestarts\tkills\tapplied LSN\tverified\t")
	for _, f := range r.Followers {
		verdict := map[bool]string{true: "yes", false: "NO"}[f.Verified]
		switch {
		case f.Promoted:
			verdict = "promoted"
		case f.Rebuilt:
			verdict = fmt.Sprintf("%s, rebuilt after refused %v", verdict, f.Refused)
		case len(f.Refused) > 0:
			verdict = fmt.Sprintf("refused %v", f.Refused)
		}
		if f.Late {
			verdict += ", joined late"
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%v\t%s\t\n", f.ID, f.Applied, f.Discarded, f.Delivered, f.Shipped, f.Faults, f.Restarts, f.Kills, f.LSNs, verdict)
	}
	tw.Flush()
	if len(r.Shards) > 0 {
		fmt.Fprintf(w, "\n%d shards (leader: one WAL and one stream per follower each; every follower node: one store each):\n", len(r.Shards))
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  shard\tsessions\tbatches\tlast LSN\tapplied\tdiscarded\tshipped\tfaults\t")
		for _, s := range r.Shards {
			fmt.Fprintf(tw, "  %d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", s.Shard, s.Sessions, s.Batches, s.LastLSN, s.Applied, s.Discarded, s.Shipped, s.Faults)
		}
		tw.Flush()
	}
	if r.Verified {
		fmt.Fprintln(w, "\nverified: every follower's state matches the oracle (every distinct request applied exactly once)")
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

// writeJSONReport writes a command's --json report: one indented JSON
// object (bench, demo and demo --auto-failover, failover).
func writeJSONReport(w io.Writer, rep any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

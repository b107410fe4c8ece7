package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/bench"
)

// The bench subcommand runs the standard suite from package bench through
// testing.Benchmark — the same functions `go test -bench` runs in bench/ —
// and prints each figure beside the reference it is judged against,
// measured in the same run. The machine is usually shared, so the full
// suite interleaves rounds (every end-to-end case once per round, in turn)
// and reports medians; a slow neighbour then hits a figure and its
// reference alike instead of one of them for a whole run.

// benchCase is one measurement of the suite.
type benchCase struct {
	name   string // key in the JSON "samples"
	run    func(*testing.B)
	metric string // what to read from the result: "ns/op" or an Extra metric
	kind   string // "e2e", "micro" or "memory": picks the benchtime
	full   bool   // only in the full suite (--quick skips it)
}

// benchConfig is what --quick changes.
type benchConfig struct {
	rounds         int
	e2eTime, micro string // -test.benchtime values
	churn          uint64 // window memory: inserts after the fill
}

func benchConfigFor(quick bool) benchConfig {
	if quick {
		return benchConfig{rounds: 1, e2eTime: "300ms", micro: "200ms", churn: 1_000_000}
	}
	return benchConfig{rounds: 3, e2eTime: "2s", micro: "1s", churn: 10_000_000}
}

func benchSuite(c benchConfig) []benchCase {
	e2e := func(name string, f func(*testing.B)) benchCase {
		return benchCase{name: name, run: f, metric: "events/s", kind: "e2e"}
	}
	// The client rows take about 7 s together even with --quick's
	// benchtime (a leader, followers and a gRPC server per ramp step):
	// full suite only, as --quick already runs near its 30 s.
	req := func(name string, f func(*testing.B)) benchCase {
		return benchCase{name: name, run: f, metric: "requests/s", kind: "e2e", full: true}
	}
	micro := func(name string, f func(*testing.B)) benchCase {
		return benchCase{name: name, run: f, metric: "ns/op", kind: "micro"}
	}
	return []benchCase{
		e2e("raw_ingest", bench.RawIngest(bench.Fresh)),
		e2e("raw_ingest_writeset", bench.RawIngestWriteSet(bench.Fresh)),
		e2e("fresh", bench.Receiver(bench.Fresh)),
		e2e("dup100", bench.Receiver(bench.Dup)),
		e2e("dup100_window", bench.Receiver(bench.Retry)),
		e2e("dup100_pipelined", bench.ReceiverPipelined(bench.Dup, 4)),
		e2e("dup100_window_pipelined", bench.ReceiverPipelined(bench.Retry, 4)),
		e2e("dup100_ceiling", bench.DupCeiling()),
		e2e("dup30", bench.Receiver(bench.Mix30)),
		e2e("naive_fresh", bench.Naive(bench.Fresh)),
		e2e("naive_dup100", bench.Naive(bench.Dup)),
		e2e("e2e", bench.Pipeline(0, false)),
		e2e("e2e_raw", bench.PipelineRaw(0)),
		e2e("e2e_dup30", bench.Pipeline(30, false)),
		e2e("e2e_raw_dup30", bench.PipelineRaw(30)),
		e2e("e2e_nosync", bench.Pipeline(0, true)),
		e2e("e2e_dup100", bench.Pipeline(100, false)),
		e2e("e2e_leader_wal", bench.LeaderWAL()),
		e2e("repl2", bench.Replicated(2, bench.ReplicatedClients, 0)),
		e2e("repl2_dup30", bench.Replicated(2, bench.ReplicatedClients, 30)),
		e2e("repl2_dup100", bench.Replicated(2, bench.ReplicatedClients, 100)),
		e2e("repl2_1client", bench.Replicated(2, 1, 0)),
		e2e("shards4_sync", bench.Shards(4, false)),
		e2e("shards4_nosync", bench.Shards(4, true)),
		e2e("leader_ship_1", bench.LeaderShip(1)),
		e2e("leader_ship_3", bench.LeaderShip(3)),
		e2e("leader_quorum_1", bench.LeaderQuorum(1)),
		e2e("leader_quorum_3", bench.LeaderQuorum(3)),
		e2e("leader_append_1", bench.LeaderConcurrent(1)),
		e2e("leader_append_16", bench.LeaderConcurrent(16)),
		e2e("leader_append_1_batch1000", bench.LeaderConcurrentBatches(1, bench.BatchEvents)),
		e2e("leader_wal_1", bench.LeaderWALBatches(100)),
		e2e("leader_wal_1_batch1000", bench.LeaderWALBatches(bench.BatchEvents)),
		req("client_inprocess", bench.ClientInProcess(0)),
		req("client_network", bench.ClientNetwork(0)),
		req("client_inprocess_majority_1", bench.ClientInProcess(1)),
		req("client_network_majority_1", bench.ClientNetwork(1)),
		req("client_inprocess_majority_2", bench.ClientInProcess(2)),
		req("client_network_majority_2", bench.ClientNetwork(2)),
		req("client_get_leader", bench.ClientReads(false)),
		req("client_get_follower", bench.ClientReads(true)),
		{name: "burst_raw_ingest", run: bench.RawIngest(bench.Burst), metric: "events/s", kind: "e2e", full: true},
		{name: "burst_fresh", run: bench.Receiver(bench.Burst), metric: "events/s", kind: "e2e", full: true},
		micro("derive64", bench.DeriveKey(64)),
		micro("derive64_sum256", bench.DeriveKeySum256(64)),
		micro("window_dup", bench.WindowCheck("oncewal", "dup")),
		micro("window_dup_lru", bench.WindowCheck("golang-lru", "dup")),
		micro("window_new", bench.WindowCheck("oncewal", "new")),
		micro("window_new_lru", bench.WindowCheck("golang-lru", "new")),
		{name: "window_heap", run: bench.WindowMemory("oncewal", c.churn), kind: "memory"},
		{name: "window_heap_lru", run: bench.WindowMemory("golang-lru", c.churn), kind: "memory"},
	}
}

// benchRow is one line of the table.
type benchRow struct {
	Name      string  `json:"name"`
	Value     float64 `json:"value"`
	Unit      string  `json:"unit"`
	RefName   string  `json:"reference,omitempty"`
	RefValue  float64 `json:"reference_value,omitempty"`
	Ratio     float64 `json:"ratio,omitempty"` // Value / RefValue
	Target    string  `json:"target,omitempty"`
	TargetMet *bool   `json:"target_met,omitempty"`
}

type benchMachine struct {
	OS        string  `json:"os"`
	Arch      string  `json:"arch"`
	CPUs      int     `json:"cpus"`
	CPUModel  string  `json:"cpu_model,omitempty"`
	Go        string  `json:"go"`
	LoadStart float64 `json:"load_start,omitempty"` // 1-minute load average
	LoadEnd   float64 `json:"load_end,omitempty"`
	// CPUHog: the suite ran beside a process spinning on one core
	// (--cpu-hog), the loaded run.
	CPUHog bool `json:"cpu_hog,omitempty"`
}

type benchReport struct {
	Machine  benchMachine         `json:"machine"`
	Quick    bool                 `json:"quick"`
	Rounds   int                  `json:"rounds"`
	Seconds  float64              `json:"seconds"`
	Rows     []benchRow           `json:"rows"`
	Samples  map[string][]float64 `json:"samples"` // every round's figure, by case
	CPUNanos map[string]float64   `json:"cpu_ns_per_event,omitempty"`
	Failed   []string             `json:"failed,omitempty"`
}

func runBench(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bench", "bench [--json] [--quick] [--cpu-hog]", stderr)
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	quick := fs.Bool("quick", false, "one short round (under 30 s) instead of three longer ones")
	hog := fs.Bool("cpu-hog", false, "run beside a process that keeps one core busy (the loaded run: compactions fall behind)")
	spin := fs.Bool("spin", false, "internal: be --cpu-hog's process, busy until standard input closes")
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	if *spin {
		spinUntilEOF(os.Stdin)
		return exitOK
	}
	progress := io.Discard
	if !*asJSON {
		progress = stderr
	}
	if *hog {
		stop, err := startCPUHog()
		if err != nil {
			fmt.Fprintf(stderr, "oncewal bench: --cpu-hog: %v\n", err)
			return exitFailure
		}
		defer stop()
	}
	rep, err := measureSuite(benchConfigFor(*quick), *quick, *hog, progress)
	if err != nil {
		fmt.Fprintf(stderr, "oncewal bench: %v\n", err)
		return exitFailure
	}
	if *asJSON {
		if err := writeJSONReport(stdout, rep); err != nil {
			fmt.Fprintf(stderr, "oncewal bench: %v\n", err)
			return exitFailure
		}
	} else {
		printBenchTable(stdout, rep)
	}
	if len(rep.Failed) > 0 {
		fmt.Fprintf(stderr, "oncewal bench: measurements failed: %s (run go test ./bench -bench . for details)\n",
			strings.Join(rep.Failed, ", "))
		return exitFailure
	}
	return exitOK
}

// setBenchTime sets testing's -test.benchtime, which testing.Benchmark reads,
// and returns a func restoring the previous value. Outside a test binary the
// testing flags are registered first (on flag.CommandLine, which the CLI
// does not otherwise use).
func setBenchTime(v string) (restore func(), err error) {
	f := flag.Lookup("test.benchtime")
	if f == nil {
		testing.Init()
		if f = flag.Lookup("test.benchtime"); f == nil {
			return nil, fmt.Errorf("testing flags unavailable")
		}
	}
	old := f.Value.String()
	if err := f.Value.Set(v); err != nil {
		return nil, err
	}
	return func() { _ = f.Value.Set(old) }, nil
}

func measureSuite(c benchConfig, quick, hog bool, progress io.Writer) (*benchReport, error) {
	start := time.Now()
	rep := &benchReport{Machine: machineInfo(), Quick: quick, Rounds: c.rounds,
		Samples: map[string][]float64{}, CPUNanos: map[string]float64{}}
	rep.Machine.CPUHog = hog
	rep.Machine.LoadStart = loadAverage()
	defer bench.Release()
	var suite []benchCase
	for _, bc := range benchSuite(c) {
		if !bc.full || !quick {
			suite = append(suite, bc)
		}
	}
	failed := map[string]bool{}
	for round := 1; round <= c.rounds; round++ {
		for _, bc := range suite {
			if bc.kind == "memory" && round > 1 {
				continue // deterministic enough, and the slowest case
			}
			bt := c.micro
			switch bc.kind {
			case "e2e":
				bt = c.e2eTime
			case "memory":
				bt = "1x"
			}
			restore, err := setBenchTime(bt)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(progress, "round %d/%d: %-18s ", round, c.rounds, bc.name)
			t0 := time.Now()
			r := testing.Benchmark(bc.run)
			restore()
			if r.N == 0 {
				failed[bc.name] = true
				fmt.Fprintf(progress, "FAILED\n")
				continue
			}
			switch bc.kind {
			case "memory":
				rep.Samples[bc.name+"_fresh"] = append(rep.Samples[bc.name+"_fresh"], r.Extra["B/entry-fresh"])
				rep.Samples[bc.name+"_churned"] = append(rep.Samples[bc.name+"_churned"], r.Extra["B/entry-churned"])
				fmt.Fprintf(progress, "%.1f / %.1f B/entry", r.Extra["B/entry-fresh"], r.Extra["B/entry-churned"])
			case "micro":
				v := float64(r.T.Nanoseconds()) / float64(r.N)
				rep.Samples[bc.name] = append(rep.Samples[bc.name], v)
				fmt.Fprintf(progress, "%.1f ns/op", v)
			default:
				v := r.Extra[bc.metric]
				rep.Samples[bc.name] = append(rep.Samples[bc.name], v)
				if c, ok := r.Extra["cpu-ns/event"]; ok && c > 0 {
					// Rows compare CPU per event (NAME_cpu), and the
					// report lists its median per case.
					rep.Samples[bc.name+"_cpu"] = append(rep.Samples[bc.name+"_cpu"], c)
				}
				fmt.Fprintf(progress, "%s %s", siRate(v), bc.metric)
			}
			fmt.Fprintf(progress, "  (%.1fs)\n", time.Since(t0).Seconds())
		}
	}
	for _, bc := range suite {
		if v := rep.Samples[bc.name+"_cpu"]; len(v) > 0 {
			rep.CPUNanos[bc.name] = median(v)
		}
	}
	for _, bc := range suite {
		if failed[bc.name] {
			rep.Failed = append(rep.Failed, bc.name)
		}
	}
	addCoreBound(rep.Samples, "repl2", rep.Machine.CPUs)
	rep.Rows = benchRows(rep.Samples, rep.Machine.CPUHog)
	rep.Machine.LoadEnd = loadAverage()
	rep.Seconds = math.Round(time.Since(start).Seconds()*10) / 10
	return rep, nil
}

// benchRows turns the samples into the table: medians, each beside its
// reference. A row whose figures failed is left out.
func benchRows(s map[string][]float64, hog bool) []benchRow {
	med := func(name string) (float64, bool) {
		v, ok := s[name]
		if !ok || len(v) == 0 {
			return 0, false
		}
		return median(v), true
	}
	var rows []benchRow
	add := func(name, unit, key, refName, refKey string, target func(v, ref float64) (string, bool)) {
		v, ok := med(key)
		if !ok {
			return
		}
		row := benchRow{Name: name, Value: v, Unit: unit}
		ref, refOK := 0.0, refKey == ""
		if refKey != "" {
			if ref, refOK = med(refKey); !refOK {
				return
			}
			row.RefName, row.RefValue = refName, ref
			if ref != 0 {
				row.Ratio = v / ref
			}
		}
		if target != nil && refOK {
			t, met := target(v, ref)
			row.Target, row.TargetMet = t, &met
		}
		rows = append(rows, row)
	}
	const evs = "events/s"
	// Exactly-once nearly free: 0.95x on a quiet machine, 0.8x beside a
	// one-core CPU hog (--cpu-hog), where compactions fall behind.
	freshTarget := 0.95
	if hog {
		freshTarget = 0.8
	}
	add("fresh apply (1000-event batches, Sync)", evs, "fresh", "raw Pebble ingest of the same rows", "raw_ingest",
		func(v, ref float64) (string, bool) {
			return fmt.Sprintf(">= %gx raw ingest", freshTarget), v >= freshTarget*ref
		})
	add("raw ingest of everything fresh apply writes", evs, "raw_ingest_writeset", "raw Pebble ingest of the state rows", "raw_ingest", nil)
	add("fresh apply against its write set's ingest", evs, "fresh", "raw ingest of the write set", "raw_ingest_writeset", nil)
	// The duplicate targets are on the pipelined rows: a follower serving
	// a leader applies batches that way (follower.Serve), and one batch at
	// a time (Apply) waits out an fdatasync per 1000 events before its ack
	// (pipelined, batches that changed only the position share one:
	// store.ReceiverOptions.PositionSyncEvery).
	add("100%-duplicate batches, pipelined as Serve applies them", evs, "dup100_pipelined", "raw Pebble ingest of fresh rows", "raw_ingest",
		func(v, ref float64) (string, bool) { return ">= 25x raw ingest", v >= 25*ref })
	add("100%-duplicate batches, pipelined", evs, "dup100_pipelined", "one batch at a time (Apply)", "dup100", nil)
	// Its ceiling on one shard: decoding each event and checking its HWM,
	// nothing written or synced.
	add("100%-duplicate check alone (decode + HWM), the ceiling", evs, "dup100_ceiling", "raw Pebble ingest of fresh rows", "raw_ingest", nil)
	add("100%-duplicate batches, pipelined, against the ceiling", evs, "dup100_pipelined", "decode + HWM check alone", "dup100_ceiling", nil)
	add("100%-duplicate batches, one at a time", evs, "dup100", "naive: every key in Pebble", "naive_dup100", nil)
	add("100%-retry batches (fresh SeqNo, known key), pipelined", evs, "dup100_window_pipelined", "raw Pebble ingest of fresh rows", "raw_ingest",
		func(v, ref float64) (string, bool) { return ">= 5x raw ingest", v >= 5*ref })
	add("100%-retry batches, pipelined", evs, "dup100_window_pipelined", "one batch at a time (Apply)", "dup100_window", nil)
	add("pipeline, client requests (leader WAL → follower, Sync both)", evs, "e2e", "at-least-once pipeline", "e2e_raw",
		func(v, ref float64) (string, bool) { return ">= 0.8x at-least-once", v >= 0.8*ref })
	add("pipeline, 30% client retries", evs, "e2e_dup30", "at-least-once pipeline, 30% retries", "e2e_raw_dup30",
		func(v, ref float64) (string, bool) { return ">= 1.0x at-least-once", v >= ref })
	add("pipeline, client requests (fsync hidden?)", evs, "e2e", "the same without fsync", "e2e_nosync",
		func(v, ref float64) (string, bool) { return ">= 0.8x no fsync", v >= 0.8*ref })
	add("pipeline, client requests: its leader-WAL ceiling", evs, "e2e", "client → leader WAL alone, Sync", "e2e_leader_wal", nil)
	// Replicated: a stamping leader and two followers, each copy synced per
	// batch, timed to the majority ack, against the single-follower
	// pipeline of the same workload.
	atLeast09 := func(v, ref float64) (string, bool) { return ">= 0.9x 1 follower", v >= 0.9*ref }
	add(fmt.Sprintf("replicated: leader + 2 followers, majority (%d clients)", bench.ReplicatedClients), evs, "repl2", "pipeline to 1 follower", "e2e", atLeast09)
	add("replicated, 30% client retries", evs, "repl2_dup30", "pipeline to 1 follower, 30% retries", "e2e_dup30", atLeast09)
	add("replicated, 100% client retries", evs, "repl2_dup100", "pipeline to 1 follower, 100% retries", "e2e_dup100", atLeast09)
	add("replicated, 1 client", evs, "repl2_1client", fmt.Sprintf("%d clients", bench.ReplicatedClients), "repl2", nil)
	add("replicated: CPU per event", "ns", "repl2_cpu", "pipeline to 1 follower", "e2e_cpu", nil)
	add("replicated: what the cores allow (all cores ÷ its CPU per event)", evs, "repl2_core_bound", "pipeline to 1 follower", "e2e", nil)
	add("node of 4 shards, Sync", evs, "shards4_sync", "the same without fsync", "shards4_nosync",
		func(v, ref float64) (string, bool) { return ">= 0.8x no fsync", v >= 0.8*ref })
	add("30%-duplicate mix", evs, "dup30", "raw Pebble ingest (all rows)", "raw_ingest", nil)
	add("naive dedup, every key in Pebble (fresh)", evs, "naive_fresh", "oncewal fresh apply", "fresh", nil)
	add("fresh apply, 10-event bursts per session", evs, "burst_fresh", "raw Pebble ingest of the same rows", "burst_raw_ingest", nil)
	add("leader CPU per event, 3 followers", "ns", "leader_ship_3_cpu", "the same with 1 follower", "leader_ship_1_cpu",
		func(v, ref float64) (string, bool) { return "<= 1.3x 1 follower", v <= 1.3*ref })
	add("sync replication, WaitAcked(majority) of 3", evs, "leader_quorum_3", "WaitAcked of 1 follower", "leader_quorum_1", nil)
	add("leader, 16 concurrent appenders of one shard (group commit)", evs, "leader_append_16", "1 appender", "leader_append_1", nil)
	// Issue 28's first target: what a leader adds to the apply it leads
	// (stamping, ledger, WAL, group commit). leader_append_1 syncs every
	// 100 events, the fresh row every 1000: the second row compares the
	// same batches, the first includes ten times the per-batch work.
	followerCPU := "a follower's fresh apply CPU per event (1000-event batches)"
	atMost11 := func(v, ref float64) (string, bool) { return "<= 1.1x the follower's", v <= 1.1*ref }
	add("leader CPU per event, 1 appender, 100-event batches", "ns", "leader_append_1_cpu", followerCPU, "fresh_cpu", atMost11)
	add("leader CPU per event, 1 appender, 1000-event batches", "ns", "leader_append_1_batch1000_cpu", followerCPU, "fresh_cpu", atMost11)
	// Its floor: the WAL alone (the same events written and synced per
	// batch). At 100-event batches it is a share of the follower's whole
	// apply that a 1.1x bound cannot hold.
	add("leader WAL alone, 100-event batches (write + fsync)", "ns", "leader_wal_1_cpu", followerCPU, "fresh_cpu", nil)
	add("leader WAL alone, 1000-event batches", "ns", "leader_wal_1_batch1000_cpu", followerCPU, "fresh_cpu", nil)
	// The front door (issue 26): bench.ClientNetwork against
	// bench.ClientInProcess, the client service's work without the network.
	const reqs = "requests/s"
	inProcess := "in-process Shard.Claim/Commit, same workload"
	atLeast07 := func(v, ref float64) (string, bool) { return ">= 0.7x in-process", v >= 0.7*ref }
	add(fmt.Sprintf("client over the network (gRPC, mutual TLS; %d callers, 30%% retries)", bench.ClientCallers), reqs,
		"client_network", inProcess, "client_inprocess", atLeast07)
	add("client over the network, majority acks, 1 follower", reqs, "client_network_majority_1", inProcess, "client_inprocess_majority_1", atLeast07)
	add("client over the network, majority acks, 2 followers", reqs, "client_network_majority_2", inProcess, "client_inprocess_majority_2", atLeast07)
	add("client over the network, majority acks of 2 followers", reqs, "client_network_majority_2", "the same with 1 follower", "client_network_majority_1", nil)
	// Reads over the same stack (bench.ClientReads): a linearizable Get on
	// the leader (acknowledged under majority before it answers), and a Get
	// at a MinLSN answered by a follower from its own store.
	add(fmt.Sprintf("client Get on the leader (linearizable; %d callers, 1 follower, majority)", bench.ClientCallers), reqs,
		"client_get_leader", "client Submit, majority acks, 1 follower", "client_network_majority_1", nil)
	add("client Get on a follower at a MinLSN (read-your-writes)", reqs, "client_get_follower", "linearizable Get on the leader", "client_get_leader", nil)
	atMost := func(bound float64, unit string) func(v, _ float64) (string, bool) {
		return func(v, _ float64) (string, bool) { return fmt.Sprintf("<= %g %s", bound, unit), v <= bound }
	}
	add("window heap, freshly filled (100K keys)", "B/entry", "window_heap_fresh", "golang-lru/v2", "window_heap_lru_fresh", atMost(32, "B/entry"))
	add("window heap, after churn", "B/entry", "window_heap_churned", "golang-lru/v2", "window_heap_lru_churned", atMost(32, "B/entry"))
	add("DeriveKey, 64-byte op", "ns", "derive64", "blake3.Sum256 of the same bytes", "derive64_sum256", nil)
	add("window check, duplicate", "ns", "window_dup", "golang-lru/v2 Get", "window_dup_lru", atMost(60, "ns"))
	add("window check, new key (evicts)", "ns", "window_new", "golang-lru/v2 Get+Add", "window_new_lru", atMost(100, "ns"))
	return rows
}

func printBenchTable(w io.Writer, rep *benchReport) {
	m := rep.Machine
	mode := fmt.Sprintf("%d rounds, medians", rep.Rounds)
	if rep.Quick {
		mode = "--quick, 1 round"
	}
	fmt.Fprintf(w, "oncewal bench — %s/%s, %d CPUs, %s, %s; %s; %.0f s", m.OS, m.Arch, m.CPUs,
		orUnknown(m.CPUModel), m.Go, mode, rep.Seconds)
	if m.LoadStart > 0 || m.LoadEnd > 0 {
		fmt.Fprintf(w, "; load average %.1f → %.1f", m.LoadStart, m.LoadEnd)
	}
	if m.CPUHog {
		fmt.Fprint(w, "; beside a one-core CPU hog")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w)
	cells := [][]string{{"measurement", "oncewal", "reference", "", "ratio", "target"}}
	for _, r := range rep.Rows {
		ratio, target := "", r.Target
		if r.RefName != "" {
			ratio = fmt.Sprintf("%.2fx", r.Ratio)
		}
		if r.TargetMet != nil {
			if *r.TargetMet {
				target += " (met)"
			} else {
				target += " (MISSED)"
			}
		}
		ref := ""
		if r.RefName != "" {
			ref = formatFigure(r.RefValue, r.Unit)
		}
		cells = append(cells, []string{r.Name, formatFigure(r.Value, r.Unit), ref, r.RefName, ratio, target})
	}
	width := make([]int, len(cells[0]))
	for _, row := range cells {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	bw := bufio.NewWriter(w)
	for _, row := range cells {
		var line strings.Builder
		for i, c := range row {
			pad := width[i] - len([]rune(c))
			if i == 1 || i == 2 || i == 4 { // numbers right-aligned
				line.WriteString(strings.Repeat(" ", pad) + c)
			} else {
				line.WriteString(c + strings.Repeat(" ", pad))
			}
			line.WriteString("  ")
		}
		fmt.Fprintln(bw, strings.TrimRight(line.String(), " "))
	}
	_ = bw.Flush()
	if len(rep.CPUNanos) > 0 {
		fmt.Fprint(w, "\nCPU per event (whole process, Pebble background work included):")
		names := make([]string, 0, len(rep.CPUNanos))
		for n := range rep.CPUNanos {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			fmt.Fprintf(w, " %s %.0f ns;", n, rep.CPUNanos[n])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "Reproduce: go run ./cmd/oncewal bench; per figure: go test ./bench -run '^$' -bench . -count 3")
}

func formatFigure(v float64, unit string) string {
	switch unit {
	case "events/s":
		return siRate(v) + " ev/s"
	case "requests/s":
		return siRate(v) + " req/s"
	case "ns":
		return fmt.Sprintf("%.1f ns", v)
	case "B/entry":
		return fmt.Sprintf("%.1f B", v)
	}
	return fmt.Sprintf("%g %s", v, unit)
}

// siRate renders a rate with a K/M suffix and three significant digits.
func siRate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.3gK", v/1e3)
	}
	return fmt.Sprintf("%.3g", v)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func orUnknown(s string) string {
	if s == "" {
		return "CPU model unknown"
	}
	return s
}

func machineInfo() benchMachine {
	return benchMachine{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(),
		CPUModel: cpuModel(), Go: runtime.Version()}
}

// cpuModel reads the first "model name" of /proc/cpuinfo ("" elsewhere).
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// loadAverage returns the 1-minute load average from /proc/loadavg (0
// elsewhere): how busy the shared machine was while the suite ran.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	if _, err := fmt.Sscan(string(b), &l); err != nil {
		return 0
	}
	return l
}

// addCoreBound adds NAME_core_bound: per round, the events per second the
// machine's cores could serve at NAME's CPU per event, were its work spread
// over all of them and nothing else running — the ceiling a CPU-bound row
// such as the replicated one cannot pass here. (Beside --cpu-hog the
// scheduler shares the cores three ways, so no whole number of them is the
// suite's: the bound stays that of the idle machine.)
func addCoreBound(s map[string][]float64, name string, cpus int) {
	for _, c := range s[name+"_cpu"] {
		if c > 0 && cpus > 0 {
			s[name+"_core_bound"] = append(s[name+"_core_bound"], float64(cpus)*1e9/c)
		}
	}
}

// startCPUHog starts this binary as `bench --spin`, a process that keeps
// one core busy (outside this process, so the suite's CPU per event does
// not count it), and returns the func that ends it.
func startCPUHog() (stop func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "bench", "--spin")
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// Closing its stdin ends it; so does this process's death.
	return func() { _ = in.Close(); _ = cmd.Wait() }, nil
}

// spinUntilEOF keeps one core busy until r reaches EOF or fails.
func spinUntilEOF(r io.Reader) {
	var done atomic.Bool
	go func() {
		_, _ = io.Copy(io.Discard, r)
		done.Store(true)
	}()
	for n := 0; !done.Load(); n++ {
	}
}

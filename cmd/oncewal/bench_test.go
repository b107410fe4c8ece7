package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestBenchArgs(t *testing.T) {
	_, errOut, code := runCmd(t, "bench", "extra")
	if code != exitUsage || !strings.Contains(errOut, `unexpected argument "extra"`) {
		t.Errorf("positional argument: code %d, stderr %q", code, errOut)
	}
	_, errOut, code = runCmd(t, "bench", "--fast")
	if code != exitUsage || !strings.Contains(errOut, "flag provided but not defined") {
		t.Errorf("unknown flag: code %d, stderr %q", code, errOut)
	}
	out, _, code := runCmd(t, "bench", "-h")
	if code != exitOK || !strings.Contains(out, "usage: oncewal bench [--json] [--quick]") {
		t.Errorf("-h: code %d, stdout %q", code, out)
	}
}

// TestBenchTable checks the table and the JSON built from known samples.
func TestBenchTable(t *testing.T) {
	samples := map[string][]float64{
		"raw_ingest": {1e6, 2e6, 1.5e6}, "fresh": {1.2e6, 1.3e6, 1.25e6},
		"dup100": {3e6}, "dup100_pipelined": {6e6}, "naive_dup100": {1e6}, "dup30": {1.4e6}, "naive_fresh": {5e5},
		"window_heap_fresh": {24}, "window_heap_lru_fresh": {115},
		"derive64": {200}, "derive64_sum256": {300},
		"window_dup": {50}, "window_dup_lru": {100},
		"dup100_window": {0.5e6}, "dup100_window_pipelined": {0.9e6}, "e2e": {4e5}, "e2e_raw": {4.5e5}, "e2e_nosync": {6e5},
		"client_network": {2000, 2400, 2200}, "client_inprocess": {3000},
		// window_heap_churned, window_new, burst_* missing: their rows are left out.
	}
	rep := &benchReport{Machine: benchMachine{OS: "linux", Arch: "amd64", CPUs: 2, CPUModel: "Test CPU", Go: "go1.26"},
		Rounds: 3, Seconds: 12, Samples: samples, Rows: benchRows(samples, false)}
	var out bytes.Buffer
	printBenchTable(&out, rep)
	text := out.String()
	for _, want := range []string{
		"linux/amd64, 2 CPUs, Test CPU, go1.26; 3 rounds, medians",
		"fresh apply (1000-event batches, Sync)",
		"1.25M ev/s", "1.5M ev/s", "0.83x", ">= 0.95x raw ingest (MISSED)",
		"6M ev/s", "4.00x", ">= 25x raw ingest (MISSED)", ">= 5x raw ingest (MISSED)",
		"24.0 B", "115.0 B", "0.21x", "<= 32 B/entry (met)", "<= 60 ns (met)",
		"200.0 ns", "300.0 ns", "0.67x",
		"0.89x", ">= 0.8x at-least-once (met)", ">= 0.8x no fsync (MISSED)",
		"client over the network (gRPC, mutual TLS; 16 callers, 30% retries)", "2.2K req/s", "3K req/s", "0.73x", ">= 0.7x in-process (met)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}
	for _, absent := range []string{"after churn", "new key", "bursts", "30% client retries", "4 shards", "majority acks"} {
		if strings.Contains(text, absent) {
			t.Errorf("table has a row %q without samples:\n%s", absent, text)
		}
	}

	// Every data line lines up: the ratio column starts at the same offset.
	lines := strings.Split(text, "\n")
	header := lines[2]
	col := strings.Index(header, "ratio")
	if col < 0 {
		t.Fatalf("no header line:\n%s", text)
	}
	for _, l := range lines[3 : 3+len(rep.Rows)] {
		// A row without a reference ends before the ratio column.
		if r := []rune(l); len(r) >= col && r[col-1] != ' ' {
			t.Errorf("misaligned line %q", l)
		}
	}

	rows := benchRows(map[string][]float64{"fresh": {1}, "raw_ingest": {2}}, false)
	if len(rows) != 1 || rows[0].TargetMet == nil || *rows[0].TargetMet {
		t.Errorf("missed target not reported: %+v", rows)
	}
	// The replicated row's core bound: the cores over its CPU per event,
	// per round.
	bound := map[string][]float64{"repl2_cpu": {10_000, 8_000}}
	addCoreBound(bound, "repl2", 2)
	addCoreBound(bound, "repl3", 2) // no samples: no bound
	if got := bound["repl2_core_bound"]; len(got) != 2 || got[0] != 200_000 || got[1] != 250_000 || len(bound["repl3_core_bound"]) != 0 {
		t.Errorf("core bound on 2 CPUs: %v", bound)
	}
	// Beside a CPU hog fresh apply's target is 0.8x raw ingest.
	for _, hog := range []bool{false, true} {
		rows := benchRows(map[string][]float64{"fresh": {0.85}, "raw_ingest": {1}}, hog)
		if len(rows) != 1 || rows[0].TargetMet == nil || *rows[0].TargetMet != hog {
			t.Errorf("hog %v: fresh at 0.85x raw ingest: %+v", hog, rows)
		}
	}
	rep.Machine.CPUHog = true
	out.Reset()
	printBenchTable(&out, rep)
	if !strings.Contains(out.String(), "beside a one-core CPU hog") {
		t.Errorf("a loaded run's header does not say so:\n%s", out.String())
	}
	if m := median([]float64{3, 1, 2, 10}); m != 2.5 {
		t.Errorf("median = %v", m)
	}
}

// TestBenchQuickJSON runs the real quick suite in-process. It takes about
// half a minute, so it runs only with ONCEWAL_LONG=1.
func TestBenchQuickJSON(t *testing.T) {
	if os.Getenv("ONCEWAL_LONG") == "" {
		t.Skip("set ONCEWAL_LONG=1 to run the benchmark suite")
	}
	out, errOut, code := runCmd(t, "bench", "--quick", "--json")
	if code != exitOK {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	var rep benchReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if !rep.Quick || rep.Machine.CPUs == 0 || rep.Machine.Go == "" || len(rep.Failed) > 0 {
		t.Errorf("report: %+v", rep)
	}
	names := map[string]bool{}
	for _, r := range rep.Rows {
		names[r.Name] = true
		if !(r.Value > 0) || (r.RefName != "" && !(r.RefValue > 0)) {
			t.Errorf("row without a figure: %+v", r)
		}
	}
	for _, want := range []string{"fresh apply (1000-event batches, Sync)", "100%-duplicate batches, pipelined as Serve applies them",
		"100%-duplicate batches, one at a time", "30%-duplicate mix",
		"naive dedup, every key in Pebble (fresh)", "window heap, freshly filled (100K keys)", "window heap, after churn",
		"DeriveKey, 64-byte op", "window check, duplicate", "window check, new key (evicts)",
		"leader CPU per event, 3 followers", "sync replication, WaitAcked(majority) of 3",
		"100%-retry batches (fresh SeqNo, known key), pipelined", "100%-retry batches, one at a time",
		"leader, 16 concurrent appenders of one shard (group commit)", "pipeline, client requests (leader WAL → follower, Sync both)",
		"pipeline, 30% client retries", "pipeline, client requests (fsync hidden?)", "node of 4 shards, Sync",
		"pipeline, client requests: its leader-WAL ceiling", "raw ingest of everything fresh apply writes",
		"fresh apply against its write set's ingest"} {
		if !names[want] {
			t.Errorf("no row %q", want)
		}
	}
}

// TestBenchCPUHog runs the real binary's hog process (what bench
// --cpu-hog starts): it keeps a core busy until its standard input closes,
// then exits.
func TestBenchCPUHog(t *testing.T) {
	rp := newRealProcs(t)
	cmd := exec.Command(rp.bin, "bench", "--spin")
	in, err := cmd.StdinPipe()
	must(t, err)
	must(t, cmd.Start())
	start := time.Now()
	time.Sleep(500 * time.Millisecond)
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err == nil {
		// utime is field 14; the command name (field 2) has no spaces here.
		f := strings.Fields(string(stat))
		utime, _ := strconv.ParseFloat(f[13], 64)
		if busy := utime / 100 / time.Since(start).Seconds(); busy < 0.2 {
			t.Errorf("the hog used %.0f%% of a core", 100*busy)
		}
	}
	must(t, in.Close())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("hog exit: %v", err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the hog did not exit when its standard input closed")
	}
}

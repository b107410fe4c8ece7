package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
)

// TestShardedDirs runs a small sharded deployment (a leader with three
// shards, their WALs in one directory, and a follower node with three
// stores; sim.Run) and checks that waldump reads every shard of the
// leader's WAL directory and inspect reports every shard's position of the
// node directory.
func TestShardedDirs(t *testing.T) {
	dir := t.TempDir()
	res, err := sim.Run(context.Background(), sim.Config{
		Dir: dir, Seed: 4,
		Workload: sim.WorkloadConfig{Sessions: 9, Requests: 300, BatchSize: 20},
		Follower: follower.Options{Logger: slog.New(slog.DiscardHandler)},
		Timeout:  time.Minute,
		Shards:   3,
	})
	if err != nil || !res.Verified {
		t.Fatalf("run: %v / %v", err, res)
	}

	// waldump: every shard's events, each shard's LSNs 1..LastLSN.
	stdout, stderr, code := runCmd(t, "waldump", "--json", filepath.Join(dir, "leader", leader.WALDirName))
	if code != 0 {
		t.Fatalf("waldump exit %d: %s", code, stderr)
	}
	perShard := map[uint32]uint64{}
	for _, d := range parseJSONLines(t, stdout) {
		if d.LSN != perShard[d.Shard]+1 {
			t.Fatalf("shard %d: LSN %d after %d", d.Shard, d.LSN, perShard[d.Shard])
		}
		perShard[d.Shard] = d.LSN
		if want := res.Shards[d.Shard].Sessions; want == 0 {
			t.Fatalf("event in shard %d, which has no sessions", d.Shard)
		}
		if r, _ := replication.NewShardRouter(3); r.Shard(d.Session) != d.Shard {
			t.Fatalf("session %s logged in shard %d, routes to %d", d.Session, d.Shard, r.Shard(d.Session))
		}
	}
	for _, sr := range res.Shards {
		if perShard[sr.Shard] != sr.LastLSN {
			t.Fatalf("waldump shard %d: last LSN %d, leader logged %d", sr.Shard, perShard[sr.Shard], sr.LastLSN)
		}
	}

	// inspect on the node directory: one row per shard.
	node := filepath.Join(dir, res.Followers[0].ID)
	stdout, stderr, code = runCmd(t, "inspect", "--json", node)
	if code != 0 {
		t.Fatalf("inspect exit %d: %s", code, stderr)
	}
	var got struct {
		Node   string             `json:"node"`
		Shards []inspectNodeShard `json:"shards"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("inspect --json: %v: %s", err, stdout)
	}
	if len(got.Shards) != 3 {
		t.Fatalf("inspect: %d shards, want 3: %s", len(got.Shards), stdout)
	}
	for i, s := range got.Shards {
		sr := res.Shards[i]
		if s.Shard != sr.Shard || s.AppliedLSN != sr.LastLSN || s.Epoch != 1 || s.Sessions != sr.Sessions || s.Error != "" {
			t.Fatalf("inspect shard %d: %+v, want applied %d, %d sessions", i, s, sr.LastLSN, sr.Sessions)
		}
	}
	stdout, _, code = runCmd(t, "inspect", node)
	if code != 0 || !strings.Contains(stdout, "3 shards") {
		t.Fatalf("inspect text exit %d: %s", code, stdout)
	}
	for _, sr := range res.Shards {
		if !strings.Contains(stdout, strconv.FormatUint(sr.LastLSN, 10)) {
			t.Fatalf("inspect text lacks shard %d's position %d:\n%s", sr.Shard, sr.LastLSN, stdout)
		}
	}
	// One shard's store, inspected on its own, is an ordinary store.
	stdout, _, code = runCmd(t, "inspect", "--json", follower.ShardDir(node, 1))
	if code != 0 || !strings.Contains(stdout, `"applied_lsn":`+strconv.FormatUint(res.Shards[1].LastLSN, 10)) {
		t.Fatalf("inspect shard dir exit %d: %s", code, stdout)
	}
}

func TestDemoShards(t *testing.T) {
	stdout, stderr, code := runCmd(t, "demo", "--shards", "3", "--events", "2000", "--sessions", "12", "--faults", "heavy", "--restarts", "2", "--json")
	if code != 0 {
		t.Fatalf("demo exit %d: %s\n%s", code, stderr, stdout)
	}
	var rep demoReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Verified || len(rep.Shards) != 3 {
		t.Fatalf("demo --shards 3: verified %v, %d shard rows", rep.Verified, len(rep.Shards))
	}
	var applied uint64
	for _, s := range rep.Shards {
		applied += s.Applied
	}
	if applied != rep.Applied || applied != uint64(rep.Distinct) {
		t.Fatalf("shards applied %d in total, demo reports %d applied, %d distinct", applied, rep.Applied, rep.Distinct)
	}
	if _, _, code := runCmd(t, "demo", "--shards", "0"); code != 2 {
		t.Fatalf("--shards 0: exit %d, want 2", code)
	}
	if _, _, code := runCmd(t, "demo", "--shards", "2", "--network"); code != 2 {
		t.Fatalf("--shards 2 --network: exit %d, want 2", code)
	}
}

// TestDemoFollowers: three followers per shard of two shards, each on its
// own faulty links with restarts, a leader restart and a promotion; one row
// and one --json entry per follower, every one accounted for.
func TestDemoFollowers(t *testing.T) {
	stdout, stderr, code := runCmd(t, "demo", "--followers", "3", "--shards", "2", "--events", "1500", "--sessions", "12",
		"--faults", "heavy", "--restarts", "3", "--leader-restarts", "1", "--promote", "--json")
	if code != 0 {
		t.Fatalf("demo exit %d: %s\n%s", code, stderr, stdout)
	}
	var rep demoReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Verified || len(rep.Followers) != 3 || rep.Promoted == "" {
		t.Fatalf("demo --followers 3 --promote: verified %v, %d follower entries, promoted %q", rep.Verified, len(rep.Followers), rep.Promoted)
	}
	promoted := 0
	for _, f := range rep.Followers {
		switch {
		case f.Promoted:
			promoted++
		case len(f.Refused) == 0 && !f.Verified:
			t.Fatalf("follower %s neither verified nor refused: %+v", f.ID, f)
		}
		if len(f.LSNs) != 2 || f.Delivered == 0 {
			t.Fatalf("follower %s: %+v", f.ID, f)
		}
	}
	if promoted != 1 {
		t.Fatalf("%d followers promoted", promoted)
	}
	stdout, _, code = runCmd(t, "demo", "--followers", "2", "--events", "500", "--sessions", "5")
	if code != 0 || !strings.Contains(stdout, "f1 ") || !strings.Contains(stdout, "f2 ") || !strings.Contains(stdout, "verified: every follower") {
		t.Fatalf("demo --followers 2 exit %d:\n%s", code, stdout)
	}
}

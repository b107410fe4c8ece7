package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// TestShardedDirs runs a small sharded deployment — a leader.Leader of
// three shards (one WAL directory, a store per shard) shipping over seeded
// lossy in-process links to a follower.Node with three stores — and checks
// that waldump reads every shard of the leader's WAL directory and inspect
// reports every shard's position of the node directory, and of the
// leader's, which has the same layout.
func TestShardedDirs(t *testing.T) {
	dir := t.TempDir()
	const shards = 3
	links := make([]*inprocess.Transport, shards)
	for s := range links {
		links[s] = inprocess.New(inprocess.FaultsLight, uint64(s)+4)
	}
	quiet := slog.New(slog.DiscardHandler)
	leaderDir := filepath.Join(dir, "leader")
	l, err := leader.Open(leaderDir, &leader.Options{
		Shards: shards, Followers: []string{"node"}, Logger: quiet, Store: store.Options{Logger: quiet},
		Listener: func(s uint32) replication.Listener { return links[s] },
		Shipping: leader.ShipperOptions{RetransmitTimeout: 20 * time.Millisecond, PollInterval: time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	node := filepath.Join(dir, "follower")
	n, err := follower.OpenNode(node, []uint32{0, 1, 2}, &follower.NodeOptions{
		Follower: follower.Options{Store: store.Options{ID: "node", Logger: quiet}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Run(ctx) })
	wg.Go(func() { _ = n.Serve(ctx, func(s uint32) replication.Dialer { return links[s] }) })

	rng := rand.New(rand.NewPCG(4, 4))
	sessions := make([]session.ID, 9)
	perShard := map[uint32]int{}
	for i := range sessions {
		for j := range sessions[i] {
			sessions[i][j] = byte(rng.Uint32())
		}
		perShard[l.Router().Shard(sessions[i])]++
		if _, err := l.Append(wal.Event{Op: wal.OpOpen, Session: sessions[i]}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 300 {
		id := sessions[i%len(sessions)]
		if _, err := l.Append(wal.Event{Op: wal.OpPut, Session: id, Key: fmt.Appendf(nil, "k%d", i%5), Value: fmt.Appendf(nil, "v%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.WaitAcked(ctx, leader.AckAll); err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	last := make([]uint64, shards)
	for s := range last {
		sh, _ := l.Shard(uint32(s))
		last[s] = sh.NextLSN() - 1
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// waldump: every shard's events, each shard's LSNs 1..last.
	stdout, stderr, code := runCmd(t, "waldump", "--json", filepath.Join(leaderDir, leader.WALDirName))
	if code != 0 {
		t.Fatalf("waldump exit %d: %s", code, stderr)
	}
	seen := map[uint32]uint64{}
	for _, d := range parseJSONLines(t, stdout) {
		if d.LSN != seen[d.Shard]+1 {
			t.Fatalf("shard %d: LSN %d after %d", d.Shard, d.LSN, seen[d.Shard])
		}
		seen[d.Shard] = d.LSN
		if perShard[d.Shard] == 0 {
			t.Fatalf("event in shard %d, which has no sessions", d.Shard)
		}
		if r, _ := leader.NewShardRouter(shards); r.Shard(d.Session) != d.Shard {
			t.Fatalf("session %s logged in shard %d, routes to %d", d.Session, d.Shard, r.Shard(d.Session))
		}
	}
	for s := range uint32(shards) {
		if seen[s] != last[s] {
			t.Fatalf("waldump shard %d: last LSN %d, leader logged %d", s, seen[s], last[s])
		}
	}

	// inspect on the node directories (follower and leader): one row per
	// shard.
	for _, nd := range []string{node, leaderDir} {
		stdout, stderr, code = runCmd(t, "inspect", "--json", nd)
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
		if len(got.Shards) != shards {
			t.Fatalf("inspect: %d shards, want 3: %s", len(got.Shards), stdout)
		}
		for i, s := range got.Shards {
			if s.Shard != uint32(i) || s.AppliedLSN != last[i] || s.Epoch != 1 || s.Sessions != perShard[uint32(i)] ||
				s.Error != "" || s.LastBatch == nil || s.LastBatch.Epoch != 1 {
				t.Fatalf("inspect %s shard %d: %+v, want applied %d, %d sessions", nd, i, s, last[i], perShard[uint32(i)])
			}
		}
	}
	stdout, _, code = runCmd(t, "inspect", node)
	if code != 0 || !strings.Contains(stdout, "3 shards") {
		t.Fatalf("inspect text exit %d: %s", code, stdout)
	}
	for _, lsn := range last {
		if !strings.Contains(stdout, strconv.FormatUint(lsn, 10)) {
			t.Fatalf("inspect text lacks position %d:\n%s", lsn, stdout)
		}
	}
	// One shard's store, inspected on its own, is an ordinary store.
	stdout, _, code = runCmd(t, "inspect", "--json", store.ShardDir(node, 1))
	if code != 0 || !strings.Contains(stdout, `"applied_lsn":`+strconv.FormatUint(last[1], 10)) {
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

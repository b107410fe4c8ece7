package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/sim"
)

// writeNodeUpTo writes a follower node directory of shards 0 and 1 from one
// recorded log: shard s gets its first upTo[s] batches (-1: all), then the
// node closes cleanly.
func writeNodeUpTo(t *testing.T, dir string, upTo [2]int) {
	t.Helper()
	n, err := follower.OpenNode(dir, []uint32{0, 1}, nil)
	must(t, err)
	log, err := sim.Record(sim.GenerateWorkload(sim.WorkloadOptions{Seed: 9, Sessions: 6, Requests: 120, BatchSize: 6}), 1)
	must(t, err)
	for _, s := range []uint32{0, 1} {
		batches, err := log.Encode(0, s, 1)
		must(t, err)
		if upTo[s] >= 0 {
			batches = batches[:upTo[s]]
		}
		for _, b := range batches {
			if _, err := n.Apply(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	must(t, n.Close())
}

// storeSessions is the "sessions" of inspect --json on a store: every
// session's HWM, closed flag and state.
func storeSessions(t *testing.T, dir string) any {
	t.Helper()
	var v struct {
		Sessions any `json:"sessions"`
	}
	must(t, json.Unmarshal([]byte(inspectStore(t, dir)), &v))
	return v.Sessions
}

// TestRealProcessCatchUpPromotion: two follower nodes, each ahead on a
// different shard (no node is the most advanced everywhere). inspect says
// so once with the catch-up command; promote refuses either directory with
// that same command for it — never "promote the other instead" — changing
// nothing; promote --catch-up copies the peer's store of the shard it leads
// and promotes; the new leader serves, and the peer, rebuilt on the shard
// it was behind on, ends equal to the oracle of every batch on both shards.
func TestRealProcessCatchUpPromotion(t *testing.T) {
	rp := newRealProcs(t)
	f1, f2, full := filepath.Join(rp.dir, "f1"), filepath.Join(rp.dir, "f2"), filepath.Join(rp.dir, "full")
	writeNodeUpTo(t, f1, [2]int{-1, 5})
	writeNodeUpTo(t, f2, [2]int{5, -1})
	writeNodeUpTo(t, full, [2]int{-1, -1})

	out, stderr, err := rp.run("inspect", f1, f2)
	if exitCode(err) != exitOK || !strings.Contains(out, "most advanced: none (no directory is ahead on every shard)") ||
		strings.Count(out, "oncewal promote --dir "+f1+" --peers "+f2+" --catch-up") != 1 {
		t.Fatalf("inspect f1 f2: %v\n%s%s", err, out, stderr)
	}
	b1, b2 := contentDigest(t, f1), contentDigest(t, f2)
	for _, c := range [][2]string{{f1, f2}, {f2, f1}} {
		_, stderr, err := rp.run("promote", "--dir", c[0], "--peers", c[1])
		if exitCode(err) != exitFailure || !strings.Contains(stderr, errNotMostAdvanced.Error()) ||
			!strings.Contains(stderr, "oncewal promote --dir "+c[0]+" --peers "+c[1]+" --catch-up") || strings.Contains(stderr, "instead") {
			t.Fatalf("promote --dir %s --peers %s: %v\n%s", c[0], c[1], err, stderr)
		}
	}
	if !maps.Equal(b1, contentDigest(t, f1)) || !maps.Equal(b2, contentDigest(t, f2)) {
		t.Fatal("a refused promotion changed a store")
	}

	out, stderr, err = rp.run("promote", "--dir", f1, "--peers", f2, "--catch-up")
	if err != nil || !strings.Contains(out, "shard 1: caught up from "+store.ShardDir(f2, 1)) || !strings.Contains(out, "at epoch 2") {
		t.Fatalf("promote --catch-up: %v\n%s%s", err, out, stderr)
	}
	for _, s := range inspectPositionsJSON(t, f1, full).Stores {
		if s.Node == f1 && s.Epoch != 2 {
			t.Fatalf("promoted f1: %+v", s)
		}
	}
	oracle := func(who, node string) {
		t.Helper()
		for s := range uint32(2) {
			if got, want := storeSessions(t, store.ShardDir(node, s)), storeSessions(t, store.ShardDir(full, s)); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s shard %d differs from the oracle:\n%v\nwant\n%v", who, s, got, want)
			}
		}
	}
	oracle("the promoted f1", f1)

	// The new leader serves f1; f2 continues on shard 1 and is rebuilt on
	// shard 0, which it was behind on (the new log starts after f1's).
	addr := fmt.Sprintf("127.0.0.1:%d", rp.port)
	ld := &proc{name: "leader", log: filepath.Join(rp.dir, "leader.log"), args: []string{"leader", "--dir", f1, "--shards", "2",
		"--followers", "f2", "--insecure", "--listen", addr, "--stats-interval", "0s"}}
	fl := &proc{name: "f2", log: filepath.Join(rp.dir, "f2.log"), args: []string{"follower", "--dir", f2, "--shards", "2",
		"--id", "f2", "--insecure", "--leader", addr, "--rebuild", "auto", "--stats-interval", "0s"}}
	reapProcs(t, []*proc{ld, fl})
	ld.start(t, rp.bin)
	waitFile(t, ld.log, "epoch=2")
	fl.start(t, rp.bin)
	waitFile(t, fl.log, "shard store rebuilt from a snapshot", "shard=0")
	must(t, fl.stop(t))
	must(t, ld.stop(t))
	oracle("f2", f2)
	oracle("the leader", f1)
}

package main

import (
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/testutil"
)

// writeNode writes a follower node directory of shards 0 and 1, each with
// the batches of a workload of sessions sessions, closed cleanly: every
// store is flushed to an sstable.
func writeNode(t *testing.T, dir string, sessions int) {
	t.Helper()
	n, err := follower.OpenNode(dir, []uint32{0, 1}, nil)
	must(t, err)
	log, err := sim.Record(sim.GenerateWorkload(sim.WorkloadOptions{Seed: 5, Sessions: sessions, Requests: 10 * sessions, BatchSize: 5}), 1)
	must(t, err)
	for _, s := range []uint32{0, 1} {
		batches, err := log.Encode(0, s, 1)
		must(t, err)
		for _, b := range batches {
			if _, err := n.Apply(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	must(t, n.Close())
}

// flipSSTBytes flips one byte in the first data block of every sstable of
// the store in dir, as a bad disk sector would.
func flipSSTBytes(t *testing.T, dir string) {
	t.Helper()
	ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	must(t, err)
	if len(ssts) == 0 {
		t.Fatalf("no sstable in %s", dir)
	}
	for _, p := range ssts {
		b, err := os.ReadFile(p)
		must(t, err)
		b[16] ^= 0xff
		must(t, os.WriteFile(p, b, 0o644))
	}
}

// contentDigest is a tree's digest without the stores' LOCK files, whose
// mtime moves when a command takes the lock (the one trace a refused open
// leaves).
func contentDigest(t *testing.T, dir string) map[string]string {
	d := testutil.TreeDigest(t, dir)
	for k := range d {
		if filepath.Base(k) == "LOCK" {
			delete(d, k)
		}
	}
	return d
}

// waitFile waits until the file holds every part (a process's log).
func waitFile(t *testing.T, path string, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(string(b), p)
		}
		if ok {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never held %q:\n%s", path, parts, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRealProcessDamagedStore runs the built binary on stores with one
// flipped byte in an sstable, as an operator would: inspect (node and
// store), follower (store), leader and promote exit 1 — not a Go panic
// (exit 2) — with store.ErrCorrupt's text naming the damaged store
// and the remedy, and change nothing on disk (promote --out creates
// nothing); a node follower keeps serving its healthy shard and logs the
// damaged one once. A running node's stores are refused as locked
// (store.ErrLocked), naming the lock file.
func TestRealProcessDamagedStore(t *testing.T) {
	rp := newRealProcs(t)
	node, leaderDir := filepath.Join(rp.dir, "node"), filepath.Join(rp.dir, "leader")
	writeNode(t, node, 3)
	testutil.CopyDir(t, node, leaderDir)
	if _, e, err := rp.run("promote", "--dir", leaderDir); err != nil {
		t.Fatalf("promote: %v\n%s", err, e)
	}
	bad := store.ShardDir(node, 1)
	flipSSTBytes(t, bad)
	flipSSTBytes(t, store.ShardDir(leaderDir, 1))
	promoted := filepath.Join(rp.dir, "promoted")

	for _, tc := range []struct {
		name  string
		args  []string
		store string // the damaged store the error names
	}{
		{"inspect node", []string{"inspect", node}, bad},
		{"inspect store", []string{"inspect", bad}, bad},
		{"inspect positions", []string{"inspect", node, node}, bad},
		{"follower store", []string{"follower", "--dir", bad, "--shard", "1", "--id", "a", "--insecure", "--leader", "127.0.0.1:1",
			"--rebuild", "never"}, bad},
		{"leader", []string{"leader", "--dir", leaderDir, "--shards", "2", "--followers", "a", "--insecure", "--listen", "127.0.0.1:0"},
			store.ShardDir(leaderDir, 1)},
		{"promote", []string{"promote", "--dir", node, "--out", promoted}, bad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, lbefore := contentDigest(t, node), contentDigest(t, tc.store)
			_, stderr, err := rp.run(tc.args...)
			if code := exitCode(err); code != exitFailure || strings.Contains(stderr, "panic") ||
				!strings.Contains(stderr, store.ErrCorrupt.Error()+": "+tc.store) ||
				!strings.Contains(stderr, "checksum mismatch") || !strings.Contains(stderr, "--rebuild=auto") {
				t.Fatalf("exit %d, want %d with %q naming %s:\n%s", code, exitFailure, store.ErrCorrupt, tc.store, stderr)
			}
			// The leader opens its shards one by one (shard 0's Pebble
			// files churn before shard 1 fails); the damaged store itself is
			// never changed, and nothing else is by the other commands.
			if !maps.Equal(lbefore, contentDigest(t, tc.store)) || (tc.name != "leader" && !maps.Equal(before, contentDigest(t, node))) {
				t.Fatal("the refused command changed a store")
			}
			if _, err := os.Stat(promoted); !os.IsNotExist(err) {
				t.Fatalf("the refused command created %s", promoted)
			}
		})
	}

	// A damaged block that reading the positions does not meet (the first
	// of many blocks of HWM rows; the metadata rows sort later): promote
	// still refuses before it moves or writes anything.
	wide := filepath.Join(rp.dir, "wide")
	writeNode(t, wide, 400)
	flipSSTBytes(t, store.ShardDir(wide, 1))
	if _, stderr, err := rp.run("inspect", wide, wide); err != nil {
		t.Fatalf("inspect of the positions should not meet the damaged block: %v\n%s", err, stderr)
	}
	before := contentDigest(t, wide)
	_, stderr, err := rp.run("promote", "--dir", wide, "--out", promoted)
	if exitCode(err) != exitFailure || !strings.Contains(stderr, store.ErrCorrupt.Error()+": "+store.ShardDir(wide, 1)) {
		t.Fatalf("promote of a node with a damaged HWM block: %v\n%s", err, stderr)
	}
	if _, err := os.Stat(promoted); !os.IsNotExist(err) || !maps.Equal(before, contentDigest(t, wide)) {
		t.Fatalf("the refused promotion moved or changed %s (%v)", wide, err)
	}

	// A single store with --rebuild=auto (the default) is rebuilt from the
	// leader's snapshot (follower.TestRunRebuildsDamagedStore): with no
	// leader to give one, the follower says so, keeps the damaged store as
	// it was and retries, instead of exiting.
	before = contentDigest(t, bad)
	single := &proc{name: "single", log: filepath.Join(rp.dir, "single.log"), args: []string{"follower", "--dir", bad, "--shard", "1",
		"--id", "a", "--insecure", "--leader", "127.0.0.1:1", "--stats-interval", "0s"}}
	reapProcs(t, []*proc{single})
	single.start(t, rp.bin)
	log := waitFile(t, single.log, "the store is damaged; rebuilding it from the leader's snapshot before serving",
		store.ErrCorrupt.Error(), "rebuild failed; the old store is kept, retrying")
	if strings.Contains(log, "panic") {
		t.Fatalf("the single store follower:\n%s", log)
	}
	if err := single.stop(t); err != nil || !maps.Equal(before, contentDigest(t, bad)) {
		t.Fatalf("the single store follower: stop %v, or its failed rebuilds changed the damaged store:\n%s", err, readFile(t, single.log))
	}

	// The node keeps serving shard 0 and reports shard 1 once.
	fl := &proc{name: "node", log: filepath.Join(rp.dir, "node.log"), args: []string{"follower", "--dir", node, "--shards", "2",
		"--id", "a", "--insecure", "--leader", "127.0.0.1:1", "--rebuild", "never", "--stats-interval", "0s",
		"--metrics-addr", "127.0.0.1:0"}}
	reapProcs(t, []*proc{fl})
	fl.start(t, rp.bin)
	// The line says why the shard is not rebuilt and which flag decides.
	log = waitFile(t, fl.log, "shard store is damaged", "shard=1", store.ErrCorrupt.Error(), "replicating", "serving metrics",
		"Rebuild is never (Options.Rebuild, oncewal follower --rebuild)")
	if strings.Count(log, "shard store is damaged") != 1 || strings.Contains(log, "panic") {
		t.Fatalf("the damaged shard should be logged once:\n%s", log)
	}
	// /readyz names the shard and why; store_down says which shard is down.
	m := regexp.MustCompile(`serving metrics" addr=(\S+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no metrics address in the log:\n%s", log)
	}
	if code, body := get(t, "http://"+m[1]+"/readyz"); code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "shard 1: store down: ") || !strings.Contains(body, store.ErrCorrupt.Error()) {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	if _, body := get(t, "http://"+m[1]+"/metrics"); !strings.Contains(body, `oncewal_follower_store_down{shard="1"} 1`) ||
		!strings.Contains(body, `oncewal_follower_store_down{shard="0"} 0`) {
		t.Fatalf("/metrics store_down:\n%s", body)
	}

	// Its healthy store is locked: inspect and a second follower say so.
	locked := store.ShardDir(node, 0)
	_, stderr, err = rp.run("inspect", locked)
	if exitCode(err) != exitFailure || !strings.Contains(stderr, store.ErrLocked.Error()) ||
		!strings.Contains(stderr, filepath.Join(locked, "LOCK")) || !strings.Contains(stderr, "stop the follower or leader running on") {
		t.Fatalf("inspect of a locked store: %v\n%s", err, stderr)
	}
	_, stderr, err = rp.run("inspect", node)
	if exitCode(err) != exitFailure || !strings.Contains(stderr, "shard 0: "+locked+": "+store.ErrLocked.Error()) ||
		!strings.Contains(stderr, "shard 1: "+store.ErrCorrupt.Error()) {
		t.Fatalf("inspect of a running node: %v\n%s", err, stderr)
	}
	_, stderr, err = rp.run("follower", "--dir", locked, "--shard", "0", "--id", "b", "--insecure", "--leader", "127.0.0.1:1")
	if exitCode(err) != exitFailure || !strings.Contains(stderr, store.ErrLocked.Error()) ||
		!strings.Contains(stderr, filepath.Join(locked, "LOCK")) {
		t.Fatalf("a second follower on a locked store: %v\n%s", err, stderr)
	}
	if err := fl.stop(t); err != nil {
		t.Fatalf("node stop: %v\n%s", err, waitFile(t, fl.log))
	}
}

package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/wal"
)

// TestRealProcessRebuildKilled SIGKILLs a follower process
// again and again while it rebuilds its store from the leader's snapshot,
// over mutual TLS between real processes. A leader of one shard with small
// segments and a small retention bound generates a workload while a live
// follower keeps up; a late follower joins after retention deleted the
// log's start, so it must be rebuilt (--rebuild=auto), throttled with
// --rebuild-rate so that a transfer lasts seconds. It is killed at a random
// moment of its transfer (the staging directory is there), some kills
// aimed at the install (the marker is there), and restarted each time; a
// kill that came after the install wipes the store, so the next start
// rebuilds again. Then the leader stops generating, both followers catch
// up, everything stops cleanly, and: no staging, old-store or marker
// directory is left beside the late store; the leader's store, the live
// and the late follower equal the oracle of the whole log (the test links
// every WAL segment into an archive as it appears, so retention's
// deletions do not hide the log's start from waldump); and the leader
// released the killed fetches' snapshots at their successors' Begin
// (snapshots_superseded). ONCEWAL_SEED replays a schedule, ONCEWAL_KILLS
// sets the kills (default 3; 10 with ONCEWAL_LONG=1).
func TestRealProcessRebuildKilled(t *testing.T) {
	seed, kills := realProcSeed(t), realProcKills(t, 10, 3)
	t.Logf("seed %d (ONCEWAL_SEED=%d replays the schedule), %d kills", seed, seed, kills)
	rng := rand.New(rand.NewPCG(seed, 13))
	rp := newRealProcs(t, "live", "late")
	dir := rp.dir

	leaderDir := filepath.Join(dir, "leader")
	walDir := filepath.Join(leaderDir, leader.WALDirName)
	archive := filepath.Join(dir, "archive")
	must(t, os.MkdirAll(archive, 0o755))
	stopArchive := archiveSegments(t, walDir, archive)

	leaderArgs := func(rate int) []string {
		return []string{"leader", "--dir", leaderDir, "--shards", "1", "--followers", "live,late",
			"--listen", fmt.Sprintf("127.0.0.1:%d", rp.port),
			"--tls-ca", rp.cert(pki.FileCA), "--tls-cert", rp.cert(pki.FileLeader), "--tls-key", rp.cert(pki.FileLeaderKey),
			"--generate", strconv.Itoa(rate), "--sessions", "30", "--batch", "32", "--retry-rate", "0.03",
			"--segment-size", strconv.Itoa(64 << 10), "--max-retained-bytes", strconv.Itoa(256 << 10),
			"--retention-interval", "50ms", "--stats-interval", "200ms"}
	}
	followerArgs := func(id string, extra ...string) []string {
		return append(append([]string{"follower", "--dir", filepath.Join(dir, id), "--shard", "0", "--id", id,
			"--leader", fmt.Sprintf("localhost:%d", rp.port), "--stats-interval", "100ms"}, rp.followerTLS(id)...), extra...)
	}
	ld := &proc{name: "leader", args: leaderArgs(600), log: filepath.Join(dir, "leader.log")}
	live := &proc{name: "live", args: followerArgs("live"), log: filepath.Join(dir, "live.log")}
	late := &proc{name: "late", log: filepath.Join(dir, "late.log")}
	all := []*proc{ld, live, late}
	t.Cleanup(stopArchive)
	reapProcs(t, all) // runs first: the processes stop before the archive
	waitFor := func(what string, limit time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	ld.start(t, rp.bin)
	waitFor("the leader to serve", time.Minute, func() bool { return strings.Contains(readFile(t, ld.log), "oncewal leader: serving") })
	live.start(t, rp.bin)
	waitFor("retention to delete the log's start", 2*time.Minute, func() bool { return lastInt(readFile(t, ld.log), firstRetained) > 1 })

	// A transfer of the leader's store should take about 3 s.
	rate := max(dirBytes(t, store.ShardDir(leaderDir, 0))/3, 32<<10)
	late.args = followerArgs("late", "--rebuild", "auto", "--rebuild-rate", strconv.FormatInt(rate, 10))
	lateDir := filepath.Join(dir, "late")
	staging, marker := snapshot.StagingDir(lateDir), lateDir+".rebuild-marker"
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	var midTransfer, midInstall, after, wiped int
	applied := func() uint64 { // the late store's applied LSN, read from its files
		if !exists(lateDir) {
			return 0
		}
		out, e, err := rp.run("inspect", "--json", lateDir)
		if err != nil {
			t.Fatalf("inspect %s: %v %s", lateDir, err, e)
		}
		var got inspected
		must(t, json.Unmarshal([]byte(out), &got))
		return got.AppliedLSN
	}
	for i := range kills {
		started := len(readFile(t, late.log))
		late.start(t, rp.bin)
		waitFor("the late follower to stage a snapshot", 2*time.Minute, func() bool { return exists(staging) })
		if i%3 == 2 {
			// Aim at the install: kill the moment its marker appears.
			deadline := time.Now().Add(30 * time.Second)
			for !exists(marker) && time.Now().Before(deadline) && !strings.Contains(readFile(t, late.log)[started:], "oncewal follower: rebuilt") {
				time.Sleep(200 * time.Microsecond)
			}
		} else {
			time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
		}
		installing, transferring := exists(marker), exists(staging)
		late.kill(t)
		switch {
		case installing:
			midInstall++
			// The marker is the install's commit point: the next open
			// finishes it and opens the rebuilt store.
			started = len(readFile(t, late.log))
			late.start(t, rp.bin)
			waitFor("the interrupted install to be finished", time.Minute, func() bool {
				return lastApplied(readFile(t, late.log)[started:])[0] > 0
			})
			late.kill(t)
			if exists(marker) || applied() == 0 {
				t.Fatalf("kill %d: the install interrupted after its marker did not roll forward", i)
			}
		case transferring:
			midTransfer++
		default:
			after++
		}
		if applied() > 0 {
			// Installed: wipe it, so that the next start must rebuild
			// again (a wiped follower).
			must(t, os.RemoveAll(lateDir))
			wiped++
		}
	}
	t.Logf("kills: %d mid-transfer, %d mid-install, %d after the install (%d stores wiped); rebuild rate %d B/s", midTransfer, midInstall, after, wiped, rate)

	// The last start rebuilds to the end; then the leader stops generating
	// and both followers catch up with the log's end.
	started := len(readFile(t, late.log))
	late.start(t, rp.bin)
	waitFor("the late follower's rebuild", 2*time.Minute, func() bool {
		return strings.Contains(readFile(t, late.log)[started:], "oncewal follower: rebuilt")
	})
	superseded := lastInt(readFile(t, ld.log), supersededLine)
	if err := ld.stop(t); err != nil {
		t.Fatalf("leader: clean stop: %v", err)
	}
	ld.args = leaderArgs(0)
	served := strings.Count(readFile(t, ld.log), "oncewal leader: serving")
	ld.start(t, rp.bin)
	waitFor("the serving-only leader", time.Minute, func() bool {
		return strings.Count(readFile(t, ld.log), "oncewal leader: serving") > served
	})
	dumped, e, err := rp.run("waldump", "--json", archive)
	if err != nil {
		t.Fatalf("waldump of the archived log: %v %s", err, e)
	}
	var end uint64
	dec := json.NewDecoder(strings.NewReader(dumped))
	for dec.More() {
		var ev eventJSON
		must(t, dec.Decode(&ev))
		end = max(end, ev.LSN)
	}
	for _, p := range []*proc{live, late} {
		waitFor(p.name+" to catch up", 2*time.Minute, func() bool { return lastApplied(readFile(t, p.log))[0] >= end })
	}
	for _, p := range all {
		if err := p.stop(t); err != nil {
			t.Fatalf("%s: clean stop: %v", p.name, err)
		}
	}
	stopArchive()

	for _, p := range []string{staging, lateDir + ".rebuild-old", marker, marker + ".tmp"} {
		if exists(p) {
			t.Errorf("%s is left after the rebuilds", p)
		}
	}
	o := newWALOracle()
	events, retried := o.feed(t, dumped, nil)
	for name, d := range map[string]string{"leader": store.ShardDir(leaderDir, 0), "live": filepath.Join(dir, "live"), "late": lateDir} {
		out, e, err := rp.run("inspect", "--json", d)
		if err != nil {
			t.Fatalf("inspect %s: %v %s", d, err, e)
		}
		o.check(t, name, out, func(session.ID) bool { return true })
		var got inspected
		must(t, json.Unmarshal([]byte(out), &got))
		if got.AppliedLSN != end {
			t.Errorf("%s applied LSN %d, the log ends at %d", name, got.AppliedLSN, end)
		}
	}
	if midTransfer > 0 && superseded == 0 {
		t.Errorf("%d fetches killed mid-transfer, none of their snapshots superseded on the leader", midTransfer)
	}
	rebuilds := strings.Count(readFile(t, late.log), "oncewal follower: rebuilt")
	t.Logf("%d events (%d retried requests), log ends at %d; %d kills; late follower rebuilt %d times; leader superseded %d killed fetches' snapshots",
		events, retried, end, kills, rebuilds, superseded)
}

var (
	firstRetained  = regexp.MustCompile(`first_retained_lsn=(\d+)`)
	supersededLine = regexp.MustCompile(`snapshots_superseded=(\d+)`)
)

// lastInt is the number in re's last match in log (0 without one).
func lastInt(log string, re *regexp.Regexp) uint64 {
	m := re.FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return 0
	}
	v, _ := strconv.ParseUint(m[len(m)-1][1], 10, 64)
	return v
}

// dirBytes is the size of the files in dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && !fi.IsDir() {
			n += fi.Size()
		}
	}
	return n
}

// archiveSegments hard-links every WAL segment that appears in walDir into
// archive until stop is called: the links keep each segment's inode — and
// so every byte the leader appends to it — after retention deletes it.
func archiveSegments(t *testing.T, walDir, archive string) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			ents, _ := os.ReadDir(walDir)
			for _, e := range ents {
				if _, _, err := wal.ParseSegmentName(e.Name()); err != nil {
					continue
				}
				dst := filepath.Join(archive, e.Name())
				if _, err := os.Stat(dst); err == nil {
					continue
				}
				_ = os.Link(filepath.Join(walDir, e.Name()), dst)
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

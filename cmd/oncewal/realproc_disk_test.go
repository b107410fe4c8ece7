package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
)

// tinyDisk mounts a tmpfs of size bytes at dir (root only; the test is
// skipped where mounting is not allowed) and returns a function that
// resizes it.
func tinyDisk(t *testing.T, dir string, size int64) (resize func(size int64)) {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o755))
	opt := func(n int64) string { return fmt.Sprintf("size=%dk", n>>10) }
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, opt(size)); err != nil {
		t.Skipf("mounting a small tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return func(n int64) {
		t.Helper()
		must(t, syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT, opt(n)))
	}
}

// TestRealProcessesFullDisk (root: it mounts small tmpfs
// disks) runs the built binary as an operator would on disks that fill up.
// The leader's disk fills while it generates: the leader stops logging at
// --min-free-bytes (the generator is refused with ErrDiskFull and retries)
// and keeps serving; the follower's disk fills: it stops applying and
// waits. Neither exits, hangs or panics, and once each disk has room again
// everything resumes by itself; both stores end equal to the oracle of the
// leader's WAL.
func TestRealProcessesFullDisk(t *testing.T) {
	rp := newRealProcs(t)
	dir, bin := rp.dir, rp.bin
	growLeader := tinyDisk(t, filepath.Join(dir, "ldisk"), 16<<20)
	growFollower := tinyDisk(t, filepath.Join(dir, "fdisk"), 1<<30)
	run := func(args ...string) string {
		t.Helper()
		o, e, err := rp.run(args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, e)
		}
		return o
	}
	addr := fmt.Sprintf("127.0.0.1:%d", rp.port)

	const minFree = 4 << 20
	leaderDir := filepath.Join(dir, "ldisk", "leader")
	followerDir := filepath.Join(dir, "fdisk", "f1")
	leaderArgs := func(rate int) []string {
		return []string{"leader", "--dir", leaderDir, "--followers", "f1", "--listen", addr, "--insecure",
			"--segment-size", "1073741824", "--min-free-bytes", fmt.Sprint(minFree),
			"--generate", fmt.Sprint(rate), "--sessions", "1000", "--batch", "256",
			"--retry-rate", "0.02", "--ack", "one", "--stats-interval", "200ms"}
	}
	ld := &proc{name: "leader", args: leaderArgs(20000), log: filepath.Join(dir, "leader.log")}
	fl := &proc{name: "f1", log: filepath.Join(dir, "f1.log"), args: []string{"follower", "--dir", followerDir,
		"--id", "f1", "--leader", addr, "--insecure", "--stats-interval", "200ms", "--min-free-bytes", fmt.Sprint(minFree)}}
	all := []*proc{ld, fl}
	reapProcs(t, all)
	alive := func() {
		t.Helper()
		for _, p := range all {
			select {
			case err := <-p.done:
				t.Fatalf("%s exited: %v", p.name, err)
			default:
			}
			if l := readFile(t, p.log); strings.Contains(l, "panic:") || strings.Contains(l, "fatal error") {
				t.Fatalf("%s panicked", p.name)
			}
		}
	}
	waitLog := func(p *proc, what string, cond func(string) bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for !cond(readFile(t, p.log)) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	generated := func() uint64 { return lastInt(readFile(t, ld.log), generatedLine) }
	used := func(disk string) int64 {
		var st syscall.Statfs_t
		must(t, syscall.Statfs(filepath.Join(dir, disk), &st))
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}

	// 1. The leader's disk fills up: it stops logging and keeps serving;
	// the follower applies everything logged.
	ld.start(t, bin)
	fl.start(t, bin)
	waitLog(ld, "the leader to refuse appends on its full disk", func(l string) bool {
		return strings.Contains(l, "the disk is nearly full")
	})
	time.Sleep(time.Second)
	alive()
	stuck := generated()
	time.Sleep(time.Second)
	if g := generated(); g != stuck {
		t.Fatalf("the leader went on logging on a full disk: %d then %d events", stuck, g)
	}

	// 2. Room again: generation resumes by itself.
	growLeader(1 << 30)
	waitLog(ld, "the leader to log again", func(string) bool { return generated() > stuck })
	alive()

	// 3. The follower's disk fills up: it stops applying and waits.
	growFollower(used("fdisk") + minFree + 2<<20)
	waitLog(fl, "the follower to stop on its full disk", func(l string) bool {
		return strings.Contains(l, "not applying: the disk is nearly full")
	})
	time.Sleep(time.Second)
	alive()
	held := lastApplied(readFile(t, fl.log))[0]
	time.Sleep(time.Second)
	if got := lastApplied(readFile(t, fl.log))[0]; got != held {
		t.Fatalf("the follower went on applying on a full disk: LSN %d then %d", held, got)
	}

	// 4. Room again: the follower catches up with a serving-only leader,
	// and both stores equal the oracle.
	growFollower(1 << 30)
	waitLog(fl, "the follower to apply again", func(l string) bool { return lastApplied(l)[0] > held })
	alive()
	ld.kill(t)
	ld.args = leaderArgs(0)
	ld.start(t, bin)
	waitLog(ld, "the serving-only leader", func(l string) bool { return strings.Contains(l, "oncewal leader: serving") })
	dumped := run("waldump", "--json", filepath.Join(leaderDir, leader.WALDirName))
	var end uint64
	dec := json.NewDecoder(strings.NewReader(dumped))
	for dec.More() {
		var ev eventJSON
		must(t, dec.Decode(&ev))
		end = max(end, ev.LSN)
	}
	waitLog(fl, "the follower to catch up", func(l string) bool { return lastApplied(l)[0] >= end })
	for _, p := range all {
		if err := p.stop(t); err != nil {
			t.Fatalf("%s: clean stop: %v", p.name, err)
		}
	}
	o := newWALOracle()
	events, _ := o.feed(t, dumped, nil)
	every := func(session.ID) bool { return true }
	o.check(t, "leader", run("inspect", "--json", store.ShardDir(leaderDir, 0)), every)
	o.check(t, "f1", run("inspect", "--json", followerDir), every)
	t.Logf("%d events in the leader's WAL (ends at LSN %d); the leader and f1 equal its oracle", events, end)
}

var generatedLine = regexp.MustCompile(`oncewal leader: shard" shard=0 .* generated=(\d+)`)

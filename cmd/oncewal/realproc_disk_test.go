package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncewal/oncewal/follower"
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

// exitCode waits up to d for p to exit by itself and returns its exit code.
func (p *proc) exitCode(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case err := <-p.done:
		var ee *exec.ExitError
		if err == nil {
			return 0
		}
		if !errors.As(err, &ee) {
			t.Fatalf("%s: %v", p.name, err)
		}
		return ee.ExitCode()
	case <-time.After(d):
		t.Fatalf("%s did not exit within %v", p.name, d)
		return -1
	}
}

// TestRealProcessesFullDisk (ONCEWAL_LONG=1, root: it mounts small tmpfs
// disks) runs the built binary as an operator would on disks that fill up.
// The leader's disk fills while it generates: it exits 1 naming ENOSPC, and
// again when restarted on the still-full disk. The follower's disk fills:
// it exits 1 by itself (a failed WAL write) or, while Pebble stalls its
// writes, stops on SIGTERM within bounded time — never hangs. Once both
// disks have room, they restart, the follower catches up, and both stores
// equal the oracle of the leader's WAL. No process panics.
func TestRealProcessesFullDisk(t *testing.T) {
	if os.Getenv("ONCEWAL_LONG") == "" {
		t.Skip("real processes on full disks: ONCEWAL_LONG=1")
	}
	dir := t.TempDir()
	growLeader := tinyDisk(t, filepath.Join(dir, "ldisk"), 8<<20)
	growFollower := tinyDisk(t, filepath.Join(dir, "fdisk"), 64<<20)
	bin := filepath.Join(dir, "oncewal")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(args ...string) string {
		t.Helper()
		var o, e strings.Builder
		c := exec.Command(bin, args...)
		c.Stdout, c.Stderr = &o, &e
		if err := c.Run(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, e.String())
		}
		return o.String()
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := lis.Addr().String()
	lis.Close()

	leaderDir := filepath.Join(dir, "ldisk", "leader")
	followerDir := filepath.Join(dir, "fdisk", "f1")
	leaderArgs := func(rate int) []string {
		return []string{"leader", "--dir", leaderDir, "--followers", "f1", "--listen", addr, "--insecure",
			"--segment-size", "1073741824", "--generate", fmt.Sprint(rate), "--sessions", "1000", "--batch", "256",
			"--retry-rate", "0.02", "--ack", "one", "--stats-interval", "1s"}
	}
	ld := &proc{name: "leader", args: leaderArgs(20000), log: filepath.Join(dir, "leader.log")}
	fl := &proc{name: "f1", log: filepath.Join(dir, "f1.log"), args: []string{"follower", "--dir", followerDir,
		"--id", "f1", "--leader", addr, "--insecure", "--stats-interval", "200ms"}}
	all := []*proc{ld, fl}
	t.Cleanup(func() {
		for _, p := range all {
			if p.cmd != nil && p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Signal(syscall.SIGKILL)
				<-p.done
			}
		}
		if t.Failed() {
			for _, p := range all {
				b, _ := os.ReadFile(p.log)
				if len(b) > 20000 {
					b = b[len(b)-20000:]
				}
				t.Logf("--- %s (tail):\n%s", p.name, b)
			}
		}
	})
	noPanic := func() {
		t.Helper()
		for _, p := range all {
			if l := readFile(t, p.log); strings.Contains(l, "panic:") || strings.Contains(l, "goroutine 1 [") {
				t.Fatalf("%s panicked", p.name)
			}
		}
	}

	// 1. The leader's disk fills up: exit 1, naming the cause; again on restart.
	ld.start(t, bin)
	fl.start(t, bin)
	for i := range 2 {
		if code := ld.exitCode(t, 3*time.Minute); code != exitFailure {
			t.Fatalf("leader on a full disk (start %d): exit %d, want %d", i+1, code, exitFailure)
		}
		if !strings.Contains(readFile(t, ld.log), "no space left on device") {
			t.Fatalf("the leader's log does not name the full disk")
		}
		if i == 0 {
			ld.start(t, bin)
		}
	}
	noPanic()

	// 2. Room again: the leader recovers its WAL and stores and goes on.
	growLeader(1 << 30)
	ld.start(t, bin)
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
	waitLog(fl, "the follower to apply after the leader's recovery", func(l string) bool { return lastApplied(l)[0] > 0 })

	// 3. The follower's disk fills up: it exits 1 by itself, or stops
	// within bounded time when asked.
	used := func() int64 {
		var st syscall.Statfs_t
		must(t, syscall.Statfs(filepath.Join(dir, "fdisk"), &st))
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}
	growFollower(used() + 2<<20)
	waitLog(fl, "the follower's disk to fill up", func(l string) bool {
		return strings.Contains(l, "no space left on device")
	})
	select {
	case <-time.After(5 * time.Second):
		start := time.Now()
		_ = fl.cmd.Process.Signal(syscall.SIGTERM)
		code := fl.exitCode(t, 45*time.Second)
		t.Logf("follower on a full disk stopped on SIGTERM in %v, exit %d", time.Since(start).Round(time.Millisecond), code)
	case err := <-fl.done:
		t.Logf("follower on a full disk exited by itself: %v", err)
	}
	noPanic()

	// 4. Room again: the follower catches up with a serving-only leader,
	// and both stores equal the oracle.
	growFollower(1 << 30)
	ld.kill(t)
	ld.args = leaderArgs(0)
	ld.start(t, bin)
	fl.start(t, bin)
	dumped := ""
	var end uint64
	waitLog(ld, "the serving-only leader", func(l string) bool { return strings.Contains(l, "oncewal leader: serving") })
	dumped = run("waldump", "--json", filepath.Join(leaderDir, leader.WALDirName))
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
	noPanic()
	o := newWALOracle()
	events, _ := o.feed(t, dumped, nil)
	every := func(session.ID) bool { return true }
	o.check(t, "leader", run("inspect", "--json", follower.ShardDir(leaderDir, 0)), every)
	o.check(t, "f1", run("inspect", "--json", followerDir), every)
	t.Logf("%d events in the leader's WAL (ends at LSN %d); the leader and f1 equal its oracle", events, end)
}

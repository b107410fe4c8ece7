package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/testutil"
)

// promotedState is what a finished promotion leaves: each shard's applied
// LSN and epoch, and whether anything but a leader node directory remains.
func promotedState(t *testing.T, target string, shards int) map[string]uint64 {
	t.Helper()
	st := map[string]uint64{}
	for _, s := range inspectPositionsJSON(t, target, target).Stores[:shards] {
		st[s.Dir+" lsn"], st[s.Dir+" epoch"] = s.AppliedLSN, s.Epoch
	}
	if _, err := os.Stat(filepath.Join(target, promoteIntentName)); !os.IsNotExist(err) {
		t.Fatalf("the intent is left in %s: %v", target, err)
	}
	if _, err := os.Stat(filepath.Join(target, leader.WALDirName)); err != nil {
		t.Fatalf("no WAL in %s: %v", target, err)
	}
	return st
}

// TestPromoteErrorSweep fails promote at every operation that changes the
// disk in turn (the intent, the move, each shard's store taking the epoch,
// its log starting, closing, removing the intent), for a node promoted in
// place, a node moved with --out, a single store moved with --out and a
// node caught up from a peer ahead on shard 1 (--catch-up) then moved. After
// each failure either nothing changed (the directory is as it was, --out
// absent or empty) or the same command, run again, finishes the promotion
// (a Pebble panic the fault causes counts as a crash there);
// either way the result equals that of a promotion never interrupted: every
// shard at the same epoch and applied LSN, a WAL, no intent left.
func TestPromoteErrorSweep(t *testing.T) {
	rp := newRealProcs(t)
	base := t.TempDir()
	pristine := filepath.Join(base, "pristine")
	writeNode(t, pristine, 3)
	single := filepath.Join(base, "single")
	testutil.CopyDir(t, store.ShardDir(pristine, 0), single)
	ahead0, ahead1 := filepath.Join(base, "ahead0"), filepath.Join(base, "ahead1")
	writeNodeUpTo(t, ahead0, [2]int{-1, 5})
	writeNodeUpTo(t, ahead1, [2]int{5, -1})
	for _, tc := range []struct {
		name   string
		src    string
		peer   string // with --catch-up
		out    bool
		shards int
	}{
		{"node in place", pristine, "", false, 2},
		{"node --out", pristine, "", true, 2},
		{"store --out", single, "", true, 1},
		{"node --catch-up --out", ahead0, ahead1, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caseDir := func(name string) promoteConfig {
				d := filepath.Join(t.TempDir(), name)
				testutil.CopyDir(t, tc.src, filepath.Join(d, "f"))
				c := promoteConfig{dir: filepath.Join(d, "f")}
				if tc.peer != "" {
					testutil.CopyDir(t, tc.peer, filepath.Join(d, "p"))
					c.peers, c.catchUp = []string{filepath.Join(d, "p")}, true
				}
				if tc.out {
					c.out = filepath.Join(d, "out")
				}
				return c
			}
			target := func(c promoteConfig) string {
				if c.out != "" {
					return c.out
				}
				return c.dir
			}
			clean := caseDir("clean")
			if err := promote(clean, io.Discard, io.Discard); err != nil {
				t.Fatal(err)
			}
			want := promotedState(t, target(clean), tc.shards)
			rel := func(m map[string]uint64, root string) map[string]uint64 {
				out := map[string]uint64{}
				for k, v := range m {
					r, _ := filepath.Rel(root, k)
					out[r] = v
				}
				return out
			}
			want = rel(want, target(clean))
			// Every operation with ONCEWAL_LONG=1 (~390 child processes,
			// minutes under -race); otherwise every 12th from an offset the
			// seed picks, so that runs cover different operations
			// (ONCEWAL_SEED replays one).
			stride, first := 12, int(realProcSeed(t)%12)
			if os.Getenv("ONCEWAL_LONG") != "" {
				stride, first = 1, 0
			}
			t.Logf("failing every %d-th operation from the %d-th", stride, first)
			untouched, leaderRefused := 0, false
			for n := first; ; n += stride {
				c := caseDir("run")
				before := contentDigest(t, c.dir)
				args := []string{"promote", "--dir", c.dir}
				if c.out != "" {
					args = append(args, "--out", c.out)
				}
				if c.catchUp {
					args = append(args, "--peers", c.peers[0], "--catch-up")
				}
				fired, err := promoteWithFault(t, n, c)
				if !fired {
					if err != nil {
						t.Fatalf("no fault injected, promote failed: %v", err)
					}
					t.Logf("%d operations (every %d-th failed); %d failures left everything as it was", n, stride, untouched)
					if !leaderRefused {
						t.Fatal("no failure left a half-promoted directory to offer oncewal leader")
					}
					break
				}
				if err != nil {
					names, _ := os.ReadDir(c.out)
					if _, serr := os.Stat(c.dir); serr == nil && len(names) == 0 && maps.Equal(before, contentDigest(t, c.dir)) {
						untouched++
					}
					// oncewal leader refuses a half-promoted directory.
					if _, serr := os.Stat(filepath.Join(target(c), promoteIntentName)); serr == nil && !leaderRefused {
						leaderRefused = true
						_, stderr, lerr := rp.run("leader", "--dir", target(c), "--shards", strconv.Itoa(tc.shards), "--followers", "a",
							"--insecure", "--listen", "127.0.0.1:0")
						if exitCode(lerr) != exitFailure || !strings.Contains(stderr, errPromoteInterrupted.Error()) ||
							!strings.Contains(stderr, "oncewal promote --dir "+c.dir) {
							t.Fatalf("oncewal leader on a half-promoted directory: %v\n%s", lerr, stderr)
						}
						if tc.shards > 1 {
							_, stderr, ferr := rp.run("follower", "--dir", target(c), "--shards", "2", "--id", "a", "--insecure",
								"--leader", "127.0.0.1:1")
							if exitCode(ferr) != exitFailure || !strings.Contains(stderr, errPromoteInterrupted.Error()) {
								t.Fatalf("oncewal follower on a half-promoted directory: %v\n%s", ferr, stderr)
							}
						}
					}
					// Run again as the operator would, in a new process.
					if _, stderr, rerr := rp.run(args...); rerr != nil {
						t.Fatalf("operation %d failed (%v); running promote again: %v\n%s", n, err, rerr, stderr)
					}
				} // else: the failed operation was retried (Pebble's background work)
				if got := rel(promotedState(t, target(c), tc.shards), target(c)); !maps.Equal(want, got) {
					t.Fatalf("operation %d failed (%v), then promote again: %v, want %v", n, err, got, want)
				}
			}
		})
	}
}

// promoteWithFault runs promote on c in a child process (this test binary,
// TestPromoteFaultChild) whose filesystem fails the n-th operation that
// changes the disk: a store whose open Pebble declared fatal stays locked
// until its process exits, as after a real crash. It reports whether the
// fault fired and promote's error.
func promoteWithFault(t *testing.T, n int, c promoteConfig) (bool, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPromoteFaultChild$")
	cmd.Env = append(os.Environ(), "ONCEWAL_FAULT_N="+strconv.Itoa(n), "ONCEWAL_FAULT_DIR="+c.dir, "ONCEWAL_FAULT_OUT="+c.out,
		"ONCEWAL_FAULT_PEERS="+strings.Join(c.peers, ","))
	out, err := cmd.CombinedOutput()
	fired := strings.Contains(string(out), "FAULT FIRED")
	if i := strings.Index(string(out), "PROMOTE ERROR: "); i >= 0 {
		return fired, errors.New(strings.SplitN(string(out[i:]), "\n", 2)[0])
	}
	if err != nil && (strings.Contains(string(out), "panic: ") || strings.Contains(string(out), "fatal error: ")) {
		// Pebble panics on some failures (a MANIFEST marker that cannot
		// move): the process dies there, as in a crash. (Only the one
		// injected fault can cause it: the run past the last operation
		// does not crash.)
		return true, fmt.Errorf("crashed: %v", err)
	}
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	return fired, nil
}

// TestPromoteFaultChild is promoteWithFault's child; it does nothing
// unless ONCEWAL_FAULT_N is set.
func TestPromoteFaultChild(t *testing.T) {
	ns := os.Getenv("ONCEWAL_FAULT_N")
	if ns == "" {
		t.Skip("the child of TestPromoteErrorSweep")
	}
	n, err := strconv.Atoi(ns)
	must(t, err)
	inj := &testutil.FailNth{N: int64(n), Match: testutil.Mutations}
	c := promoteConfig{dir: os.Getenv("ONCEWAL_FAULT_DIR"), out: os.Getenv("ONCEWAL_FAULT_OUT"), fs: errorfs.Wrap(vfs.Default, inj)}
	if p := os.Getenv("ONCEWAL_FAULT_PEERS"); p != "" {
		c.peers, c.catchUp = strings.Split(p, ","), true
	}
	err = promote(c, io.Discard, io.Discard)
	if inj.Fired() {
		fmt.Println("FAULT FIRED")
	}
	if err != nil {
		fmt.Println("PROMOTE ERROR: " + strings.ReplaceAll(err.Error(), "\n", " "))
	}
}

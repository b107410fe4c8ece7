package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

// TestRealEpochsAndDirs runs the built binary as an operator would on the
// cases of issue 24's epoch and directory findings; each subtest asserts
// the exit code, the stderr text and what is on disk.
func TestRealEpochsAndDirs(t *testing.T) {
	rp := newRealProcs(t)
	quiet := slog.New(slog.DiscardHandler)
	// leaderDir builds a leader directory in-process: for each epoch in
	// epochs, a leader opened at it appends n events of one session.
	leaderDir := func(t *testing.T, dir string, shards int, n int, epochs ...uint64) {
		t.Helper()
		id := session.ID{4, 2}
		for i, e := range epochs {
			l, err := leader.Open(dir, &leader.Options{Shards: shards, Epoch: e, Logger: quiet, Store: store.Options{Logger: quiet}})
			must(t, err)
			if i == 0 {
				_, err = l.Append(wal.Event{Op: wal.OpOpen, Session: id})
				must(t, err)
			}
			for range n {
				_, err = l.Append(wal.Event{Op: wal.OpPut, Session: id, Key: []byte("k"), Value: []byte("v")})
				must(t, err)
			}
			must(t, l.Close())
		}
	}
	// followerNode applies shard 0's log of leader directory src to a
	// follower node directory of one shard.
	followerNode := func(t *testing.T, dir, src string) {
		t.Helper()
		n, err := follower.OpenNode(dir, []uint32{0}, &follower.NodeOptions{ShardCount: 1, Follower: follower.Options{Store: store.Options{Logger: quiet}}})
		must(t, err)
		r, err := wal.OpenReader(filepath.Join(src, leader.WALDirName), 0)
		must(t, err)
		for {
			_, raw, err := r.Next()
			if err != nil {
				break
			}
			_, err = n.Apply(append([]byte(nil), raw...))
			must(t, err)
		}
		must(t, r.Close())
		must(t, n.Close())
	}
	// refused runs the binary, which must exit with code, every want in its
	// stderr, and dir exactly as it was (absent if it was).
	refused := func(t *testing.T, dir string, code int, want []string, args ...string) {
		t.Helper()
		_, statErr := os.Stat(dir)
		var before map[string]string
		if statErr == nil {
			before = testutil.TreeState(t, dir)
		}
		_, errOut, err := runWithin(rp.bin, 60*time.Second, args...)
		if got := exitCode(err); got != code {
			t.Fatalf("%v: exit %d, want %d:\n%s", args, got, code, errOut)
		}
		for _, w := range want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: stderr lacks %q:\n%s", args, w, errOut)
			}
		}
		if statErr != nil {
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("%v created %s", args, dir)
			}
		} else if after := testutil.TreeState(t, dir); !maps.Equal(before, after) {
			t.Errorf("%v changed %s:\nbefore %v\nafter  %v", args, dir, before, after)
		}
	}
	leaderArgs := func(dir string, more ...string) []string {
		return append([]string{"leader", "--dir", dir, "--followers", "a", "--insecure",
			"--listen", fmt.Sprintf("127.0.0.1:%d", rp.port), "--stats-interval", "0s"}, more...)
	}
	// serve starts the leader on dir, waits for its "opened" line, stops it
	// cleanly and returns its log.
	serve := func(t *testing.T, dir string, more ...string) string {
		t.Helper()
		p := &proc{name: "leader", args: leaderArgs(dir, more...), log: filepath.Join(t.TempDir(), "leader.log")}
		p.start(t, rp.bin)
		reapProcs(t, []*proc{p})
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(readFile(t, p.log), "oncewal leader opened") {
			select {
			case err := <-p.done:
				t.Fatalf("leader exited (%v) before it opened:\n%s", err, readFile(t, p.log))
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("leader did not open in 30s:\n%s", readFile(t, p.log))
			}
		}
		if err := p.stop(t); err != nil {
			t.Fatalf("leader stop: %v\n%s", err, readFile(t, p.log))
		}
		return readFile(t, p.log)
	}
	maxPlus := fmt.Sprint(uint64(replication.MaxEpoch) + 1)

	t.Run("epoch flags above the bound", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "l")
		for _, e := range []string{maxPlus, "18446744073709551615"} {
			want := []string{replication.ErrEpochExhausted.Error(), "--epoch " + e + " is above the highest epoch"}
			refused(t, dir, exitUsage, want, leaderArgs(dir, "--epoch", e)...)
			refused(t, dir, exitUsage, want, "promote", "--dir", dir, "--epoch", e)
		}
	})

	t.Run("promote a store at the maximum epoch", func(t *testing.T) {
		root := t.TempDir()
		src, f, g := filepath.Join(root, "src"), filepath.Join(root, "f"), filepath.Join(root, "g")
		leaderDir(t, src, 1, 2, replication.MaxEpoch)
		followerNode(t, f, src)
		followerNode(t, g, src)
		want := []string{replication.ErrEpochExhausted.Error(), "cannot be promoted again"}
		refused(t, f, exitFailure, append(want, f), "promote", "--dir", f)
		refused(t, g, exitFailure, want, "promote", "--dir", g, "--peers", f)
	})

	t.Run("lost store under a two-epoch WAL", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "l")
		leaderDir(t, dir, 1, 3, 0, 2)
		must(t, os.RemoveAll(store.ShardDir(dir, 0)))
		refused(t, dir, exitFailure, []string{replication.ErrStaleEpoch.Error(), "below epoch 2 of the last batch of the WAL"},
			leaderArgs(dir, "--epoch", "1")...)
		log := serve(t, dir, "--generate", "500", "--sessions", "2")
		if !strings.Contains(log, "epochs=[2]") {
			t.Errorf("the leader did not serve at the WAL's epoch 2:\n%s", log)
		}
		for _, noise := range []string{"follower opened", "follower promoted"} {
			if strings.Contains(log, noise) {
				t.Errorf("the leader logs %q:\n%s", noise, log)
			}
		}
		out, errOut, err := rp.run("waldump", filepath.Join(dir, leader.WALDirName))
		if err != nil {
			t.Fatalf("waldump after the restart: %v\n%s", err, errOut)
		}
		if strings.Contains(out, "epoch 1") && strings.LastIndex(out, "epoch 1") > strings.Index(out, "epoch 2") {
			t.Errorf("an epoch-1 batch after epoch 2:\n%s", out)
		}
		serve(t, dir, "--epoch", "3")
	})

	t.Run("a WAL whose epoch goes back", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "l")
		walDir := filepath.Join(dir, leader.WALDirName)
		leaderDir(t, dir, 1, 2, 0, 2)
		// The stale batch the old binary appended after the epoch-2 ones.
		segs, err := filepath.Glob(filepath.Join(walDir, "*.wal"))
		must(t, err)
		stale, err := wal.AppendBatch(nil, 0, 1, 6, []wal.Event{{Op: wal.OpPut, Session: session.ID{4, 2}, Seq: 6, Time: 1, Key: []byte("x")}})
		must(t, err)
		writeAtDataEnd(t, segs[len(segs)-1], stale)

		refused(t, dir, exitFailure, []string{"corrupt batch at LSN 6", "epoch 1, after a batch of epoch 2", "[wal.ErrEpochRegression]"},
			"waldump", walDir)
		cmd := "oncewal waldump --cut-epoch-regression --shard 0 " + walDir
		refused(t, dir, exitFailure, []string{leader.ErrEpochRegression.Error(), "LSN 6 holds a batch of epoch 1 after a batch of epoch 2", cmd},
			leaderArgs(dir)...)
		out, errOut, err := rp.run("waldump", "--cut-epoch-regression", "--shard", "0", walDir)
		if err != nil || !strings.Contains(out, "shard 0: cut the log at LSN 6 (a batch of epoch 1 after epoch 2)") {
			t.Fatalf("cut: %v\n%s%s", err, out, errOut)
		}
		side := filepath.Join(dir, "stale-epoch-shard-0000-from-lsn-6.walcut")
		if sideOut, errOut, err := rp.run("waldump", side); err != nil || !strings.Contains(sideOut, "epoch 1, lsn 6..6") {
			t.Errorf("waldump of the side file: %v\n%s%s", err, sideOut, errOut)
		}
		if _, errOut, err := rp.run("waldump", walDir); err != nil {
			t.Fatalf("waldump after the cut: %v\n%s", err, errOut)
		}
		if log := serve(t, dir); !strings.Contains(log, "epochs=[2]") {
			t.Errorf("after the cut the leader did not serve at epoch 2:\n%s", log)
		}
	})

	t.Run("leader on a follower's node directory", func(t *testing.T) {
		root := t.TempDir()
		src, f := filepath.Join(root, "src"), filepath.Join(root, "f")
		leaderDir(t, src, 1, 3, 0)
		followerNode(t, f, src)
		refused(t, f, exitFailure, []string{leader.ErrNotLeaderStore.Error(), "oncewal promote --dir " + f}, leaderArgs(f)...)
		refused(t, f, exitFailure, []string{leader.ErrNotLeaderStore.Error()}, leaderArgs(f, "--epoch", "5")...)
		out, errOut, err := rp.run("promote", "--dir", f)
		if err != nil || !strings.Contains(out, "at epoch 2") {
			t.Fatalf("promote: %v\n%s%s", err, out, errOut)
		}
		if log := serve(t, f); !strings.Contains(log, "epochs=[2]") {
			t.Errorf("the promoted directory did not serve at epoch 2:\n%s", log)
		}
	})

	t.Run("shard count changed", func(t *testing.T) {
		root := t.TempDir()
		l, fn := filepath.Join(root, "l"), filepath.Join(root, "f")
		leaderDir(t, l, 2, 1, 0)
		refused(t, l, exitFailure, []string{store.ErrShardCount.Error(), "holds a deployment of 2 shards", "--shards 2"},
			leaderArgs(l, "--shards", "3")...)
		refused(t, l, exitFailure, []string{leader.ErrForeignShard.Error()}, leaderArgs(l, "--shards", "1")...)
		n, err := follower.OpenNode(fn, []uint32{0, 1}, &follower.NodeOptions{ShardCount: 2, Follower: follower.Options{Store: store.Options{Logger: quiet}}})
		must(t, err)
		must(t, n.Close())
		refused(t, fn, exitFailure, []string{store.ErrShardCount.Error(), "--shards 2"},
			"follower", "--dir", fn, "--shards", "3", "--id", "a", "--insecure", "--leader", "127.0.0.1:1", "--stats-interval", "0s")
	})

	t.Run("failed starts leave nothing", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "l")
		l, err := leader.Open(dir, &leader.Options{Shards: 1, SegmentSize: 1, Logger: quiet, Store: store.Options{Logger: quiet}})
		must(t, err)
		for range 3 {
			_, err = l.Append(wal.Event{Op: wal.OpPut, Key: []byte("k")})
			must(t, err)
		}
		must(t, l.Close())
		segs, err := filepath.Glob(filepath.Join(dir, leader.WALDirName, "*.wal"))
		must(t, err)
		must(t, os.Remove(segs[0]))
		must(t, os.RemoveAll(store.ShardDir(dir, 0)))
		refused(t, dir, exitFailure, []string{wal.ErrCompacted.Error(), "starts at LSN 2"}, leaderArgs(dir)...)

		odd := filepath.Join(t.TempDir(), "odd")
		must(t, os.MkdirAll(filepath.Join(odd, "wal"), 0o755))
		refused(t, odd, exitFailure, []string{"is a directory of other files (wal/ (no WAL segments in it))"},
			"follower", "--dir", odd, "--shard", "0", "--id", "a", "--insecure", "--leader", "127.0.0.1:1", "--stats-interval", "0s")
	})
}

// runWithin runs bin to its end, or kills it after limit (a refusal that
// did not come: the command went on serving).
func runWithin(bin string, limit time.Duration, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var o, e strings.Builder
	c := exec.CommandContext(ctx, bin, args...)
	c.Stdout, c.Stderr = &o, &e
	err := c.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("still running after %v: %w", limit, err)
	}
	return o.String(), e.String(), err
}

// exitCode is the exit status of a finished command (0 for nil).
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

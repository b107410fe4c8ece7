package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

// TestFollowerRefusesWrongDirectory: oncewal follower refuses, exit 1 and
// the directory unchanged, a node directory or a WAL directory given as a
// single store (--shard), a single store given as a node directory
// (--shards), a store of another shard, and a directory of unrelated files
// (it used to create a Pebble store inside each, or leave a LOCK file).
func TestFollowerRefusesWrongDirectory(t *testing.T) {
	root := t.TempDir()
	node := filepath.Join(root, "node")
	n, err := follower.OpenNode(node, []uint32{0, 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	walDir := filepath.Join(root, "wal")
	w, err := wal.OpenWriter(walDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(1, []wal.Event{{Op: wal.OpPut, Key: []byte("k")}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	random := filepath.Join(root, "random")
	if err := os.MkdirAll(random, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(random, "photo.jpg"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"follower", "--id", "a", "--insecure", "--leader", "127.0.0.1:1", "--stats-interval", "0s"}
	for _, c := range []struct {
		dir  string
		args []string
		want string
	}{
		{node, []string{"--shard", "0"}, "is a follower node directory"},
		{walDir, []string{"--shard", "0"}, "is a WAL directory"},
		{store.ShardDir(node, 1), []string{"--shards", "2"}, "is a store"},
		{store.ShardDir(node, 1), []string{"--shard", "0"}, "shard 1, asked 0"},
		{random, []string{"--shard", "0"}, "is a directory of other files"},
	} {
		before := testutil.TreeDigest(t, c.dir)
		_, errOut, code := runCmd(t, append(append(base, "--dir", c.dir), c.args...)...)
		if code != exitFailure || !strings.Contains(errOut, c.want) {
			t.Errorf("%s %v: exit %d, want %d and %q in:\n%s", c.dir, c.args, code, exitFailure, c.want, errOut)
		}
		after := testutil.TreeDigest(t, c.dir)
		for name, d := range before {
			if filepath.Base(name) == "LOCK" { // the identity check locks an existing LOCK: its mtime moves
				continue
			}
			if after[name] != d {
				t.Errorf("%s: %s changed", c.dir, name)
			}
		}
		if len(after) != len(before) {
			t.Errorf("%s: %d entries before, %d after", c.dir, len(before), len(after))
		}
	}
}

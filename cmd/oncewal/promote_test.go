package main

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
)

// positions is inspect --json on several directories.
type positions struct {
	Stores []struct {
		Dir          string         `json:"dir"`
		Node         string         `json:"node"`
		Shard        *uint32        `json:"shard"`
		AppliedLSN   uint64         `json:"applied_lsn"`
		Epoch        uint64         `json:"epoch"`
		LastBatch    *lastBatchJSON `json:"last_batch"`
		MostAdvanced bool           `json:"most_advanced"`
	} `json:"stores"`
	MostAdvanced string `json:"most_advanced"`
}

func inspectPositionsJSON(t *testing.T, dirs ...string) positions {
	t.Helper()
	out, errOut, code := runCmd(t, append([]string{"inspect", "--json"}, dirs...)...)
	if code != exitOK {
		t.Fatalf("inspect %q: exit %d: %s", dirs, code, errOut)
	}
	var p positions
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("inspect --json: %v: %s", err, out)
	}
	return p
}

// TestPromoteMostAdvancedNode is the failover recipe of the README on two
// follower nodes of a two-shard deployment: b stops early, the leader dies,
// inspect names a as the most advanced, promote refuses b (naming a) and
// changes nothing, promotes a at epoch 2 in place, and refuses to promote it
// twice. The new leader serves a's directory; b, behind the new log's start,
// is refused as behind retention and says so; rebuilt from a copy of a taken
// before the promotion it catches up. b and the new leader's stores then
// equal the oracle of the old log up to a's position followed by the new
// log.
func TestPromoteMostAdvancedNode(t *testing.T) {
	dir := t.TempDir()
	oldDir, aDir, bDir := filepath.Join(dir, "old"), filepath.Join(dir, "a"), filepath.Join(dir, "b")
	lc := leaderConfig{dir: oldDir, shards: 2, followers: []string{"a", "b"},
		gen: genConfig{rate: 2000, sessions: 16, batch: 32, retryRate: 0.02}}
	l := startLeader(t, lc)
	fcfg := func(id, d string, l *runningLeader) followerConfig {
		return followerConfig{dir: d, leader: l.addr, id: id, shards: 2}
	}
	fa, fb := startFollower(t, fcfg("a", aDir, l)), startFollower(t, fcfg("b", bDir, l))
	waitApplied(t, 150, fa, fb)
	must(t, fb.stop())
	ends := l.ends()
	waitCaughtUp(t, []uint64{ends[0] + 50, ends[1] + 50}, fa)
	must(t, l.stop())
	must(t, fa.stop())

	p := inspectPositionsJSON(t, aDir, bDir)
	if p.MostAdvanced != aDir || len(p.Stores) != 4 {
		t.Fatalf("inspect a b: %+v", p)
	}
	promotedAt := make([]uint64, 2)
	for _, s := range p.Stores {
		if s.Node == aDir {
			promotedAt[*s.Shard] = s.AppliedLSN
			if !s.MostAdvanced || s.Epoch != 1 || s.LastBatch == nil || s.LastBatch.Epoch != 1 {
				t.Fatalf("a's row: %+v", s)
			}
		} else if s.MostAdvanced {
			t.Fatalf("b's row marked most advanced: %+v (a at %v)", s, promotedAt)
		}
	}
	text, _, code := runCmd(t, "inspect", aDir, bDir)
	if code != exitOK || !strings.Contains(text, "most advanced: "+aDir) {
		t.Fatalf("inspect text: exit %d\n%s", code, text)
	}

	// b is not the most advanced: refused, naming a, and left untouched.
	before := testutil.TreeDigest(t, bDir)
	_, errOut, code := runCmd(t, "promote", "--dir", bDir, "--peers", aDir)
	if code != exitFailure || !strings.Contains(errOut, errNotMostAdvanced.Error()) || !strings.Contains(errOut, "promote "+aDir+" instead") {
		t.Fatalf("promote b: exit %d: %s", code, errOut)
	}
	if !maps.Equal(before, testutil.TreeDigest(t, bDir)) {
		t.Fatal("the refused promotion changed b")
	}
	// A stale --epoch is refused before anything moves.
	if _, errOut, code := runCmd(t, "promote", "--dir", aDir, "--epoch", "1"); code != exitFailure ||
		!strings.Contains(errOut, replication.ErrStaleEpoch.Error()) {
		t.Fatalf("promote --epoch 1: exit %d: %s", code, errOut)
	}

	rebuild := filepath.Join(dir, "a-before-promotion")
	testutil.CopyDir(t, aDir, rebuild)
	out, errOut, code := runCmd(t, "promote", "--dir", aDir, "--peers", bDir)
	if code != exitOK || !strings.Contains(out, "at epoch 2") {
		t.Fatalf("promote a: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, s := range inspectPositionsJSON(t, aDir, bDir).Stores {
		if s.Node == aDir && (s.Epoch != 2 || s.AppliedLSN != promotedAt[*s.Shard]) {
			t.Fatalf("promoted a: %+v", s)
		}
	}
	if _, errOut, code := runCmd(t, "promote", "--dir", aDir); code != exitFailure || !strings.Contains(errOut, "already a leader node directory") {
		t.Fatalf("promote a twice: exit %d: %s", code, errOut)
	}

	// The new leader on a's directory keeps epoch 2. b is behind its log.
	lc2 := leaderConfig{dir: aDir, shards: 2, followers: []string{"b"},
		gen: genConfig{rate: 1000, sessions: 8, batch: 16, retryRate: 0.02}}
	l2 := startLeader(t, lc2)
	if !strings.Contains(l2.log.String(), "epoch=2") {
		t.Fatalf("new leader log:\n%s", l2.log)
	}
	lc2.listen = l2.addr
	fb = startFollower(t, fcfg("b", bDir, l2))
	waitLog(t, fb.log, "level=ERROR", "refused by the leader", replication.ErrBehindRetention.Error())
	must(t, fb.stop())
	must(t, os.RemoveAll(bDir))
	testutil.CopyDir(t, rebuild, bDir)
	fb = startFollower(t, fcfg("b", bDir, l2))
	waitApplied(t, promotedAt[0]+100, fb)
	must(t, l2.stop())
	lc2.gen.rate = 0
	l2 = startLeader(t, lc2)
	ends = l2.ends()
	waitCaughtUp(t, ends, fb)
	must(t, fb.stop())
	must(t, l2.stop())

	o := newWALOracle()
	o.feed(t, dump(t, filepath.Join(oldDir, leader.WALDirName)), promotedAt)
	o.feed(t, dump(t, filepath.Join(aDir, leader.WALDirName)), nil)
	router, _ := leader.NewShardRouter(2)
	for s := range uint32(2) {
		of := func(id session.ID) bool { return router.Shard(id) == s }
		o.check(t, "new leader", inspectStore(t, store.ShardDir(aDir, s)), of)
		o.check(t, "b", inspectStore(t, store.ShardDir(bDir, s)), of)
	}
}

// TestPromoteSingleStore: a single follower store (one-shard deployment)
// is promoted into a new leader node directory with --out, which oncewal
// leader then serves at epoch 2.
func TestPromoteSingleStore(t *testing.T) {
	dir := t.TempDir()
	storeDir, out := filepath.Join(dir, "s1"), filepath.Join(dir, "n1")
	l := startLeader(t, leaderConfig{dir: filepath.Join(dir, "old"), followers: []string{"s1"},
		gen: genConfig{rate: 1000, sessions: 4, batch: 16}})
	f := startFollower(t, followerConfig{dir: storeDir, leader: l.addr, id: "s1"})
	waitApplied(t, 100, f)
	must(t, l.stop())
	must(t, f.stop())
	applied := inspectPositionsJSON(t, storeDir, storeDir).Stores[0].AppliedLSN

	if _, errOut, code := runCmd(t, "promote", "--dir", storeDir); code != exitFailure || !strings.Contains(errOut, "give --out") {
		t.Fatalf("promote a store without --out: exit %d: %s", code, errOut)
	}
	// A store and a node directory do not compare (a store does not record
	// its shard).
	oldDir := filepath.Join(dir, "old")
	if _, errOut, code := runCmd(t, "inspect", storeDir, oldDir); code != exitFailure || !strings.Contains(errOut, errMixedLayouts.Error()) {
		t.Fatalf("inspect store node: exit %d: %s", code, errOut)
	}
	if _, errOut, code := runCmd(t, "promote", "--dir", storeDir, "--out", out, "--peers", oldDir); code != exitFailure ||
		!strings.Contains(errOut, errMixedLayouts.Error()) {
		t.Fatalf("promote with a node peer: exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a refused promotion created %s", out)
	}
	stdout, errOut, code := runCmd(t, "promote", "--dir", storeDir, "--out", out)
	if code != exitOK || !strings.Contains(stdout, "moved "+storeDir+" to "+store.ShardDir(out, 0)) {
		t.Fatalf("promote --out: exit %d\n%s\n%s", code, stdout, errOut)
	}
	if _, err := os.Stat(storeDir); !os.IsNotExist(err) {
		t.Fatalf("the store is still at %s: %v", storeDir, err)
	}
	l = startLeader(t, leaderConfig{dir: out, followers: []string{"x"}, gen: genConfig{rate: 1000, sessions: 4, batch: 16}})
	sh, _ := l.l.Shard(0)
	if sh.Epoch() != 2 {
		t.Fatalf("epoch %d, want 2", sh.Epoch())
	}
	deadline := time.Now().Add(30 * time.Second)
	for sh.NextLSN() <= applied+50 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	must(t, l.stop())
	for _, s := range inspectPositionsJSON(t, out, out).Stores {
		if s.Epoch != 2 || s.AppliedLSN <= applied || s.LastBatch == nil || s.LastBatch.Epoch != 2 {
			t.Fatalf("the new leader's store: %+v (promoted at %d)", s, applied)
		}
	}
}

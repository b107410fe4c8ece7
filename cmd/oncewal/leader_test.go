package main

import (
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

// TestLeaderThreeFollowersMTLS runs the CLI topology in-process over mutual
// TLS on 127.0.0.1 with certificates from gencerts: one leader of two
// shards generating a client workload (with retried requests) from four
// concurrent clients, each waiting for a majority of its three registered
// followers, each a node directory of both shards. A second leader on the directory is refused at once,
// naming it; an unregistered follower is refused and logs why; a follower
// and the leader restart on the same directories. Every follower store, and
// the leader's own, then equals the oracle computed from the leader's WAL
// (waldump --json) — state and HWM of every session — and inspect on the
// three node directories finds them equally advanced.
func TestLeaderThreeFollowersMTLS(t *testing.T) {
	dir := t.TempDir()
	srvTLS, cliTLS := tlsPair(t, filepath.Join(dir, "certs"), "f1", "f2", "f3", "stranger")
	ids := []string{"f1", "f2", "f3"}
	lc := leaderConfig{
		dir: filepath.Join(dir, "leader"), shards: 2, followers: ids, tls: srvTLS(), statsEvery: 50 * time.Millisecond,
		gen: genConfig{rate: 3000, sessions: 20, clients: 4, batch: 64, retryRate: 0.05, ack: leader.AckMajority},
	}
	l := startLeader(t, lc)
	lc.listen = l.addr // restarts come back on the same address
	fcfg := func(id string) followerConfig {
		return followerConfig{dir: filepath.Join(dir, id), leader: l.dialAddr(), id: id, shards: 2, tls: cliTLS(id)}
	}
	fs := map[string]*runningFollower{}
	for _, id := range ids {
		fs[id] = startFollower(t, fcfg(id))
	}

	// A second leader on the same directory fails at once, naming it.
	start := time.Now()
	_, errOut, code := runCmd(t, "leader", "--dir", lc.dir, "--shards", "2", "--followers", "f1,f2,f3",
		"--insecure", "--listen", "127.0.0.1:0")
	if code != exitFailure || !strings.Contains(errOut, filepath.Join(lc.dir, leader.LockFileName)) ||
		!strings.Contains(errOut, wal.ErrLocked.Error()) || time.Since(start) > 10*time.Second {
		t.Fatalf("second leader: exit %d after %v:\n%s", code, time.Since(start), errOut)
	}

	// A follower nobody registered is refused, and says why.
	stranger := startFollower(t, followerConfig{dir: filepath.Join(dir, "stranger"), leader: l.dialAddr(), id: "stranger",
		shards: 2, tls: cliTLS("stranger")})
	waitLog(t, stranger.log, "level=ERROR", "the leader refused this follower; retrying in", "unknown follower", "add stranger to the leader's --followers")
	if err := stranger.stop(); err != nil {
		t.Fatal(err)
	}

	waitApplied(t, 300, fs["f1"], fs["f2"], fs["f3"])
	// f2 restarts; then the leader restarts on the same directory.
	if err := fs["f2"].stop(); err != nil {
		t.Fatal(err)
	}
	fs["f2"] = startFollower(t, fcfg("f2"))
	if err := l.stop(); err != nil {
		t.Fatalf("leader: %v\n%s", err, l.log)
	}
	if !strings.Contains(l.log.String(), `msg="oncewal leader: follower" shard=1 follower=f3 connected=true`) ||
		!strings.Contains(l.log.String(), "mtls=true") {
		t.Errorf("leader log lacks per-follower stats or mtls:\n%s", l.log)
	}
	before := l.ends()
	l = startLeader(t, lc)
	waitApplied(t, before[0]+200, fs["f1"], fs["f2"], fs["f3"])
	if err := l.stop(); err != nil {
		t.Fatalf("leader: %v\n%s", err, l.log)
	}
	// Serving only, until every follower has everything.
	lc.gen.rate = 0
	l = startLeader(t, lc)
	ends := l.ends()
	waitCaughtUp(t, ends, fs["f1"], fs["f2"], fs["f3"])
	for _, id := range ids {
		if err := fs[id].stop(); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	if err := l.stop(); err != nil {
		t.Fatal(err)
	}

	o := newWALOracle()
	events, retried := o.feed(t, dump(t, filepath.Join(lc.dir, leader.WALDirName)), nil)
	if retried == 0 {
		t.Errorf("the workload retried no request (%d events)", events)
	}
	router, _ := leader.NewShardRouter(2)
	for s := range uint32(2) {
		of := func(id session.ID) bool { return router.Shard(id) == s }
		o.check(t, "leader", inspectStore(t, store.ShardDir(lc.dir, s)), of)
		for _, id := range ids {
			o.check(t, id, inspectStore(t, store.ShardDir(filepath.Join(dir, id), s)), of)
		}
	}
	out, errOut, code := runCmd(t, "inspect", "--json", filepath.Join(dir, "f1"), filepath.Join(dir, "f2"), filepath.Join(dir, "f3"))
	if code != exitOK {
		t.Fatalf("inspect: %d %s", code, errOut)
	}
	var cmp struct {
		Stores []struct {
			Shard        *uint32 `json:"shard"`
			AppliedLSN   uint64  `json:"applied_lsn"`
			MostAdvanced bool    `json:"most_advanced"`
		} `json:"stores"`
		MostAdvanced string `json:"most_advanced"`
	}
	if err := json.Unmarshal([]byte(out), &cmp); err != nil {
		t.Fatal(err)
	}
	if len(cmp.Stores) != 6 || cmp.MostAdvanced != filepath.Join(dir, "f1") {
		t.Fatalf("inspect of three equal nodes: %s", out)
	}
	for _, s := range cmp.Stores {
		if !s.MostAdvanced || s.Shard == nil || s.AppliedLSN != ends[*s.Shard] {
			t.Fatalf("inspect of three equal nodes: %s", out)
		}
	}
	t.Logf("%d events logged (%d retried requests), shards end at %v", events, retried, ends)
}

// waitLog waits until the log holds a line with every part.
func waitLog(t *testing.T, log *testutil.SyncBuffer, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, line := range strings.Split(log.String(), "\n") {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(line, p)
			}
			if ok {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q:\n%s", parts, log)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitApplied waits until every follower applied shard 0 up to lsn.
func waitApplied(t *testing.T, lsn uint64, fs ...*runningFollower) {
	t.Helper()
	waitCaughtUp(t, []uint64{lsn}, fs...)
}

// TestLeaderRefusesBadDirs: a directory the leader cannot serve — locked,
// not a directory, a non-WAL wal/, another deployment's shards, a corrupt
// log — fails at start with its typed error, exit 1, and is left as it was.
func TestLeaderRefusesBadDirs(t *testing.T) {
	leaderCmd := func(dir string, more ...string) []string {
		return append([]string{"leader", "--dir", dir, "--followers", "a", "--insecure", "--listen", "127.0.0.1:0"}, more...)
	}
	made := func(t *testing.T, shards int) string {
		dir := filepath.Join(t.TempDir(), "leader")
		l, err := leader.Open(dir, &leader.Options{Shards: shards, Store: store.Options{Logger: newLogger(&testutil.SyncBuffer{}, "text", slog.LevelInfo)}})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		for range 20 {
			var id session.ID
			for i := range id {
				id[i] = byte(rng.Uint32())
			}
			if _, err := l.Append(wal.Event{Op: wal.OpOpen, Session: id}); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) (dir string, args []string)
		want  string
	}{
		{"regular file", func(t *testing.T) (string, []string) {
			p := filepath.Join(t.TempDir(), "file")
			must(t, os.WriteFile(p, []byte("x"), 0o644))
			return p, leaderCmd(p)
		}, "is not a directory"},
		{"wal is a file", func(t *testing.T) (string, []string) {
			d := t.TempDir()
			must(t, os.WriteFile(filepath.Join(d, leader.WALDirName), []byte("x"), 0o644))
			return d, leaderCmd(d)
		}, wal.ErrNotWAL.Error()},
		{"wal holds other files", func(t *testing.T) (string, []string) {
			d := t.TempDir()
			must(t, os.Mkdir(filepath.Join(d, leader.WALDirName), 0o755))
			must(t, os.WriteFile(filepath.Join(d, leader.WALDirName, "notes.txt"), []byte("x"), 0o644))
			return d, leaderCmd(d)
		}, wal.ErrNotWAL.Error()},
		{"foreign shards", func(t *testing.T) (string, []string) {
			d := made(t, 3)
			return d, leaderCmd(d, "--shards", "2")
		}, leader.ErrForeignShard.Error()},
		{"corrupt log", func(t *testing.T) (string, []string) {
			d := made(t, 1)
			seg := filepath.Join(d, leader.WALDirName, wal.SegmentName(0, 1))
			b, err := os.ReadFile(seg)
			must(t, err)
			b[wal.HeaderSize+3] ^= 0x40
			must(t, os.WriteFile(seg, b, 0o644))
			return d, leaderCmd(d)
		}, wal.ErrChecksum.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, args := tc.setup(t)
			digest := func() map[string]string { return testutil.TreeDigest(t, filepath.Dir(dir)) }
			before := digest()
			start := time.Now()
			_, errOut, code := runCmd(t, args...)
			if code != exitFailure || !strings.Contains(errOut, tc.want) || time.Since(start) > 10*time.Second {
				t.Fatalf("exit %d after %v, want %d with %q:\n%s", code, time.Since(start), exitFailure, tc.want, errOut)
			}
			if after := digest(); !maps.Equal(before, after) {
				t.Fatalf("the refused start changed the directory:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestLeaderFollowerUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"leader", "--followers", "a", "--insecure"}, "--dir is required"},
		{[]string{"leader", "--dir", "x", "--insecure"}, "--followers is required"},
		{[]string{"leader", "--dir", "x", "--followers", "a,a", "--insecure"}, `"a" listed twice`},
		{[]string{"leader", "--dir", "x", "--followers", "a,,b", "--insecure"}, "empty ID"},
		{[]string{"leader", "--dir", "x", "--followers", "a b", "--insecure"}, "--followers"},
		{[]string{"leader", "--dir", "x", "--followers", "a"}, "mutual TLS needs"},
		{[]string{"leader", "--dir", "x", "--followers", "a", "--insecure", "--tls-ca", "f"}, "--insecure excludes"},
		{[]string{"follower", "--dir", "x", "--id", "a", "--insecure"}, "--dir and --leader are required"},
		{[]string{"follower", "--dir", "x", "--leader", "l:1", "--insecure"}, "--id is required"},
		{[]string{"follower", "--dir", "x", "--leader", "l:1", "--id", "a/b", "--insecure"}, "--id"},
		{[]string{"follower", "--dir", "x", "--leader", "l:1", "--id", "a", "--shard", "1", "--shards", "2", "--insecure"}, "exclude each other"},
		{[]string{"follower", "--dir", "x", "--leader", "l:1", "--id", "a"}, "mutual TLS needs"},
		{[]string{"promote"}, "--dir is required"},
		{[]string{"promote", "--dir", "x", "--peers", "y,,z"}, "empty entry"},
		{[]string{"promote", "--dir", "x", "--peers", "x/"}, "names --dir"},
		{[]string{"promote", "--dir", "x", "--out", "x"}, "--out is --dir"},
		{[]string{"gencerts"}, ""},
	} {
		_, errOut, code := runCmd(t, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, want %d with %q:\n%s", tc.args, code, exitUsage, tc.want, errOut)
		}
	}
}

// TestGencerts: gencerts writes one certificate per identity — the
// leader's naming its node, one per follower and per client, each file
// named after its holder and naming it as pki.IdentityOf reads
// it — with the keys 0600, prints commands that use them, and refuses to
// overwrite. Without --followers it issues the default follower f1's.
func TestGencerts(t *testing.T) {
	certDir := filepath.Join(t.TempDir(), "certs")
	out, errOut, code := runCmd(t, "gencerts", certDir, "--followers", "f1,f2", "--clients", "app1", "--node", "n7")
	if code != exitOK {
		t.Fatalf("gencerts: %d %s", code, errOut)
	}
	if !strings.Contains(out, "oncewal follower --dir /tmp/oncewal/f2 --id f2") || !strings.Contains(out, "oncewal leader --dir") ||
		!strings.Contains(out, filepath.Join(certDir, "follower-f2.pem")) {
		t.Errorf("gencerts output: %s", out)
	}
	f1, f1Key := pki.FollowerFiles("f1")
	f2, f2Key := pki.FollowerFiles("f2")
	app, appKey := pki.ClientFiles("app1")
	for _, k := range []string{pki.FileCAKey, pki.FileLeaderKey, f1Key, f2Key, appKey} {
		fi, err := os.Stat(filepath.Join(certDir, k))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", k, fi.Mode().Perm())
		}
	}
	for file, want := range map[string]pki.Identity{
		pki.FileLeader: {Role: pki.RoleNode, Name: "n7"},
		f1:             {Role: pki.RoleFollower, Name: "f1"},
		f2:             {Role: pki.RoleFollower, Name: "f2"},
		app:            {Role: pki.RoleClient, Name: "app1"},
	} {
		pair, err := tls.LoadX509KeyPair(filepath.Join(certDir, file), filepath.Join(certDir, strings.TrimSuffix(file, ".pem")+"-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := pki.IdentityOf(pair.Leaf); err != nil || got != want {
			t.Errorf("%s names %v (%v), want %v", file, got, err, want)
		}
	}
	// A second run uses the CA there: over an existing file it refuses
	// (exit 1), naming nothing to add is a usage error.
	if _, errOut, code := runCmd(t, "gencerts", certDir, "--clients", "app1"); code != exitFailure || !strings.Contains(errOut, "already exists") {
		t.Errorf("gencerts over existing files: exit %d, want %d: %s", code, exitFailure, errOut)
	}
	if _, errOut, code := runCmd(t, "gencerts", certDir); code != exitUsage || !strings.Contains(errOut, "already holds a CA") {
		t.Errorf("gencerts naming nothing to add: exit %d, want %d: %s", code, exitUsage, errOut)
	}
	defDir := filepath.Join(t.TempDir(), "default")
	if _, errOut, code := runCmd(t, "gencerts", defDir); code != exitOK {
		t.Fatalf("gencerts: %d %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(defDir, "follower-"+pki.DefaultFollower+".pem")); err != nil {
		t.Errorf("no default follower certificate: %v", err)
	}
}

// TestLeaderRetentionFlags: with small segments and a small
// --max-retained-bytes, retention deletes segments the live follower no
// longer needs, drops the registered follower that never came, and refuses
// it as behind retention when it does come — and it says why.
func TestLeaderRetentionFlags(t *testing.T) {
	dir := t.TempDir()
	const maxRetained = 32 << 10
	lc := leaderConfig{dir: filepath.Join(dir, "leader"), followers: []string{"live", "late"},
		segmentSize: minSegmentSize, maxRetained: maxRetained, retainEvery: 10 * time.Millisecond,
		gen: genConfig{rate: 5000, sessions: 8, batch: 16}}
	l := startLeader(t, lc)
	live := startFollower(t, followerConfig{dir: filepath.Join(dir, "live"), leader: l.addr, id: "live"})
	var st leader.ShardStats
	deadline := time.Now().Add(60 * time.Second)
	for {
		st = l.l.Stats()[0]
		dropped := slices.ContainsFunc(st.Retention.Slots, func(s leader.SlotStats) bool { return s.ID == "late" && s.Dropped })
		if dropped && st.Retention.SegmentsDeleted > 0 && st.Retention.FirstLSN > 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no retention: %+v", st.Retention)
		}
		time.Sleep(10 * time.Millisecond)
	}
	late := startFollower(t, followerConfig{dir: filepath.Join(dir, "late"), leader: l.addr, id: "late", rebuild: follower.RebuildNever})
	waitLog(t, late.log, "level=ERROR", "refused by the leader", replication.ErrBehindRetention.Error())
	must(t, late.stop())

	// --rebuild=auto: the same empty store is rebuilt from the leader's
	// snapshot (the Snapshot method on the leader's port), then follows
	// the log from the snapshot's LSN like the live follower.
	late = startFollower(t, followerConfig{dir: filepath.Join(dir, "late"), leader: l.addr, id: "late", rebuild: follower.RebuildAuto, rebuildRate: -1})
	waitLog(t, late.log, "oncewal follower: rebuilt", "reason=", "behind the leader's retained log")
	waitApplied(t, l.ends()[0], late, live)
	must(t, late.stop())
	must(t, live.stop())
	if !strings.Contains(l.log.String(), "follower dropped") {
		t.Errorf("no log line for the dropped follower:\n%s", l.log)
	}
	must(t, l.stop())
	// The rebuilt store holds what the live follower holds at the same
	// position: the leader restarts without generating, both catch up to
	// its log's end, and their sessions (state, HWM) are compared.
	lc.gen.rate = 0
	l = startLeader(t, lc)
	end := l.ends()[0]
	late = startFollower(t, followerConfig{dir: filepath.Join(dir, "late"), leader: l.addr, id: "late", rebuild: follower.RebuildAuto})
	// (With this tiny bound a slow machine drops the live follower too.)
	live = startFollower(t, followerConfig{dir: filepath.Join(dir, "live"), leader: l.addr, id: "live", rebuild: follower.RebuildAuto})
	waitApplied(t, end, late, live)
	must(t, late.stop())
	must(t, live.stop())
	must(t, l.stop())
	var leaderState inspected
	must(t, json.Unmarshal([]byte(inspectStore(t, store.ShardDir(lc.dir, 0))), &leaderState))
	for _, name := range []string{"late", "live"} {
		var got inspected
		must(t, json.Unmarshal([]byte(inspectStore(t, filepath.Join(dir, name))), &got))
		if got.AppliedLSN != end || !reflect.DeepEqual(got, leaderState) {
			t.Errorf("%s differs from the leader's store at LSN %d:\n%s %+v\nleader %+v", name, end, name, got, leaderState)
		}
	}
	t.Logf("retention %+v", st.Retention)
}

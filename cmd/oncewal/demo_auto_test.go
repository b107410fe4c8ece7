package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/internal/etcdtest"
)

// runAutoDemo runs demo --auto-failover with args and --json, and checks
// what every run must show: it verified; each fault deposed the leader and
// elected another at a higher epoch, measured; every replica holds every
// request once; a paused leader's own write was never acknowledged.
func runAutoDemo(t *testing.T, kills, pauses int, args ...string) autoReport {
	t.Helper()
	stdout, stderr, code := runCmd(t, append([]string{"demo", "--auto-failover", "--json"}, args...)...)
	var rep autoReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("demo --auto-failover: exit %d, %v\n%s\n%s", code, err, stdout, stderr)
	}
	if code != 0 || !rep.Verified {
		t.Fatalf("demo --auto-failover: exit %d, verified %v: %s\n%s\n%s", code, rep.Verified, rep.Error, stdout, stderr)
	}
	got := map[string]int{}
	epoch := rep.Elections[0].Epoch
	for _, f := range rep.Failovers {
		got[f.Fault]++
		if f.Epoch != epoch || f.NewEpoch <= f.Epoch || f.Successor == f.Leader {
			t.Errorf("failover %+v: want the leader of epoch %d succeeded by another member at a higher epoch", f, epoch)
		}
		if !(f.ElectedSec > 0 && f.FailoverSec >= f.ElectedSec) {
			t.Errorf("failover %+v: want an election, then a first acknowledged write, after the fault", f)
		}
		epoch = f.NewEpoch
	}
	if got["kill"] != kills || got["pause"] != pauses {
		t.Errorf("faults %v, want %d kills and %d pauses", got, kills, pauses)
	}
	if len(rep.Zombie) != pauses {
		t.Errorf("%d deposed leaders' writes tried, want one per pause (%d)", len(rep.Zombie), pauses)
	}
	for _, z := range rep.Zombie {
		if z.Acknowledged {
			t.Errorf("the paused leader %s (epoch %d) had its write acknowledged after its successor was elected", z.Leader, z.Epoch)
		}
	}
	if rep.Requests == 0 || rep.Acked == 0 || rep.Retries == 0 || rep.Replayed != rep.Retries {
		t.Errorf("requests %d, answered %d, retries %d of which replayed %d: want requests answered, and every retry replayed",
			rep.Requests, rep.Acked, rep.Retries, rep.Replayed)
	}
	if len(rep.Replicas) != len(autoMembers) {
		t.Fatalf("%d replicas checked, want %d", len(rep.Replicas), len(autoMembers))
	}
	for _, r := range rep.Replicas {
		if !r.Verified || r.Counters != rep.Requests {
			t.Errorf("replica %+v: want all %d requests, each applied once", r, rep.Requests)
		}
	}
	return rep
}

// TestDemoAutoFailover: on the in-process coordinator, the leader is
// killed twice and paused once; each time another member is elected and
// the clients carry on, and in the end every request is applied exactly
// once on every replica.
func TestDemoAutoFailover(t *testing.T) {
	runAutoDemo(t, 2, 1, "--shards", "2", "--seed", "3")
}

// TestDemoAutoFailoverOnEtcd: the same on a real etcd (--etcd), where a
// killed or paused member's lease expires in etcd because nothing of it
// reaches etcd any more.
func TestDemoAutoFailoverOnEtcd(t *testing.T) {
	ep := etcdtest.Start(t)
	rep := runAutoDemo(t, 1, 1, "--etcd", ep, "--kills", "1")
	if !strings.HasPrefix(rep.Coordinator, "etcd "+ep) {
		t.Errorf("coordinator %q, want etcd at %s", rep.Coordinator, ep)
	}
}

// TestDemoAutoFailoverFlags: a flag of one mode given to the other, or a
// value the mode cannot run, is a usage error, and nothing is created.
func TestDemoAutoFailoverFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "demo")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kills", "3"}, "--kills needs --auto-failover"},
		{[]string{"--etcd", "http://127.0.0.1:2379"}, "--etcd needs --auto-failover"},
		{[]string{"--auto-failover", "--followers", "3"}, "--followers does not combine with --auto-failover"},
		{[]string{"--auto-failover", "--kills", "0", "--pauses", "0"}, "--kills + --pauses must be >= 1"},
		{[]string{"--auto-failover", "--etcd", "https://127.0.0.1:2379"}, "the demo speaks plaintext to etcd"},
		{[]string{"--auto-failover", "--etcd", "127.0.0.1:2379", "--lease-ttl", "1500ms"}, "etcd takes whole seconds from 2s"},
		{[]string{"--auto-failover", "--lease-ttl", "10ms"}, "--lease-ttl 10ms is out of range"},
	} {
		_, stderr, code := runCmd(t, append([]string{"demo", "--dir", dir}, c.args...)...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("demo %v: exit %d, %q; want exit %d saying %q", c.args, code, stderr, exitUsage, c.want)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a refused demo touched %s: %v", dir, err)
	}
	used := t.TempDir()
	if err := os.WriteFile(filepath.Join(used, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := runCmd(t, "demo", "--auto-failover", "--dir", used); code != exitUsage || !strings.Contains(stderr, "is not empty") {
		t.Errorf("demo --auto-failover --dir (not empty): exit %d, %q; want a usage error", code, stderr)
	}
}

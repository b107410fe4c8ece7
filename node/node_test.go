package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

const testCluster = "test"

// quiet silences the nodes; ONCEWAL_TEST_LOG=1 shows their lines.
var quiet = func() *slog.Logger {
	if os.Getenv("ONCEWAL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.DiscardHandler)
}()

// cluster is members run in process on a coord.Memory and a MemoryNet.
type cluster struct {
	t      *testing.T
	c      coord.Coordinator
	net    *MemoryNet
	shards int
	dirs   map[string]string
	// coordFor, if set, is the coordinator member id sees; transportFor
	// its address and transport (default: the MemoryNet).
	coordFor     func(id string) coord.Coordinator
	transportFor func(id string) (string, Transport)
	// optionsFor, if set, changes every member's options before it starts.
	optionsFor func(*Options)
	mu         sync.Mutex
	nodes      map[string]*running
}

type running struct {
	n    *Node
	stop context.CancelFunc
	done chan error
}

func newCluster(t *testing.T, c coord.Coordinator, shards int, ids ...string) *cluster {
	t.Helper()
	cl := &cluster{t: t, c: c, net: NewMemoryNet(inprocess.FaultsNone, 1), shards: shards, dirs: map[string]string{}, nodes: map[string]*running{}}
	for _, id := range ids {
		if _, err := AddMember(context.Background(), c, testCluster, id); err != nil {
			t.Fatal(err)
		}
		cl.dirs[id] = t.TempDir()
	}
	t.Cleanup(cl.stopAll)
	return cl
}

func (cl *cluster) options(id string) *Options {
	return &Options{Coordinator: cl.c, Cluster: testCluster, ID: id, Dir: cl.dirs[id], Shards: cl.shards,
		Addr: "mem:" + id, Transport: cl.net.For("mem:" + id), FenceTimeout: 2 * time.Second, Logger: quiet,
		Leader: leader.Options{Shipping: leader.ShipperOptions{RetransmitTimeout: 20 * time.Millisecond, PollInterval: time.Millisecond},
			Store: store.Options{Logger: quiet}},
		Follower: follower.NodeOptions{Follower: follower.Options{ReconnectBackoff: 5 * time.Millisecond, MaxReconnectBackoff: 50 * time.Millisecond,
			Store: store.Options{Logger: quiet}}},
	}
}

func (cl *cluster) start(id string) {
	cl.t.Helper()
	o := cl.options(id)
	if cl.coordFor != nil {
		o.Coordinator = cl.coordFor(id)
	}
	if cl.transportFor != nil {
		o.Addr, o.Transport = cl.transportFor(id)
	}
	if cl.optionsFor != nil {
		cl.optionsFor(o)
	}
	n, err := Open(o)
	if err != nil {
		cl.t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &running{n: n, stop: stop, done: make(chan error, 1)}
	go func() { r.done <- n.Run(ctx) }()
	cl.mu.Lock()
	cl.nodes[id] = r
	cl.mu.Unlock()
}

// stop stops a member as a clean shutdown does (its term resigned).
func (cl *cluster) stop(id string) {
	cl.t.Helper()
	cl.mu.Lock()
	r := cl.nodes[id]
	delete(cl.nodes, id)
	cl.mu.Unlock()
	if r == nil {
		return
	}
	r.stop()
	if err := <-r.done; err != nil {
		cl.t.Errorf("node %s: Run: %v", id, err)
	}
	if err := r.n.Close(); err != nil {
		cl.t.Errorf("node %s: Close: %v", id, err)
	}
}

func (cl *cluster) stopAll() {
	cl.mu.Lock()
	ids := slicesOfKeys(cl.nodes)
	cl.mu.Unlock()
	for _, id := range ids {
		cl.stop(id)
	}
}

func slicesOfKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// waitLeader waits for a member other than except to lead, and returns it.
func (cl *cluster) waitLeader(except string) (string, *leader.Leader) {
	cl.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		cl.mu.Lock()
		for id, r := range cl.nodes {
			if id == except {
				continue
			}
			if l, err := r.n.Leader(); err == nil {
				cl.mu.Unlock()
				return id, l
			}
		}
		cl.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	cl.t.Fatalf("no member but %q led within 30s", except)
	return "", nil
}

// write appends n events (one put each, sessions spread over the shards)
// and waits until a majority acknowledged them; it returns what it wrote.
func write(t *testing.T, l *leader.Leader, sessions []session.ID, from, n int) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := from; i < from+n; i++ {
		id := sessions[i%len(sessions)]
		k, v := fmt.Sprintf("k%05d", i), fmt.Sprintf("v%d", i)
		if _, err := l.Append(wal.Event{Op: wal.OpPut, Session: id, Key: []byte(k), Value: []byte(v)}); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		out[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := l.WaitAcked(ctx, leader.AckMajority); err != nil {
		t.Fatalf("WaitAcked(majority): %v", err)
	}
	return out
}

// replicaState reads every shard's state rows and HWMs of a stopped
// member's replica.
func replicaState(t *testing.T, dir string, shards int) map[string]string {
	t.Helper()
	out := map[string]string{}
	for s := range uint32(shards) {
		d := store.ShardDir(vfs.Default.PathJoin(dir, ReplicaDirName), s)
		db, err := pebble.Open(d, &pebble.Options{ReadOnly: true, Logger: testutil.PanicLogger{}})
		if err != nil {
			t.Fatalf("opening %s: %v", d, err)
		}
		rows, err := testutil.SnapshotDB(db)
		_ = db.Close()
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range rows {
			if hasPrefix(k, keyspace.State) || hasPrefix(k, keyspace.HWM) {
				out[fmt.Sprintf("%d:%s", s, k)] = v
			}
		}
	}
	return out
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// TestFailoverOnMemory: three members elect one, which leads; the leader
// stops, another is elected and promoted with every write a majority
// acknowledged, and the old leader, restarted, rebuilds and follows: in the
// end every replica holds the same state (each write once).
func TestFailoverOnMemory(t *testing.T) {
	c := coord.NewMemory()
	t.Cleanup(func() { _ = c.Close() })
	cl := newCluster(t, c, 2, "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		cl.start(id)
	}
	first, l := cl.waitLeader("")
	sessions := []session.ID{session.NewID(), session.NewID(), session.NewID(), session.NewID()}
	want := write(t, l, sessions, 0, 200)

	cl.stop(first)
	second, l2 := cl.waitLeader(first)
	if second == first {
		t.Fatalf("the stopped leader %s leads again", first)
	}
	maps.Copy(want, write(t, l2, sessions, 200, 200))

	cl.start(first) // follows the new leader: its replica moved aside, rebuilt
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l2.WaitAcked(ctx, leader.AckAll); err != nil {
		t.Fatalf("the restarted member never caught up: %v", err)
	}
	cl.stopAll()
	var ref map[string]string
	for id, dir := range cl.dirs {
		got := replicaState(t, dir, 2)
		if ref == nil {
			ref = got
			continue
		}
		if !maps.Equal(ref, got) {
			t.Errorf("member %s: replica differs from the others (%d rows against %d)", id, len(got), len(ref))
		}
	}
	n := 0
	for k := range ref {
		if hasPrefix(k[2:], keyspace.State) {
			n++
		}
	}
	if n < len(want) {
		t.Errorf("replicas hold %d state rows, %d writes were acknowledged", n, len(want))
	}
}

func TestOpenRefusesAnotherMembersDir(t *testing.T) {
	c := coord.NewMemory()
	t.Cleanup(func() { _ = c.Close() })
	cl := newCluster(t, c, 1, "a", "b")
	n, err := Open(cl.options("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(cl.options("a")); !errors.Is(err, ErrLocked) {
		t.Errorf("a second Open of a's directory: %v, want ErrLocked", err)
	}
	_ = n.Close()
	o := cl.options("b")
	o.Dir = cl.dirs["a"]
	before := testutil.DirImage(t, vfs.Default, cl.dirs["a"])
	if _, err := Open(o); !errors.Is(err, ErrForeignDir) {
		t.Errorf("b opening a's directory: %v, want ErrForeignDir", err)
	}
	if after := testutil.DirImage(t, vfs.Default, cl.dirs["a"]); !maps.Equal(before, after) {
		t.Errorf("the refused Open changed a's directory")
	}
}

// TestMembershipWithoutRestart: a cluster of two takes a third member
// while it runs (the leader ships to it, it catches up), then drops one (the
// leader stops counting it, it stops following); a node that is no member
// never leads.
func TestMembershipWithoutRestart(t *testing.T) {
	c := coord.NewMemory()
	t.Cleanup(func() { _ = c.Close() })
	cl := newCluster(t, c, 1, "a", "b")
	cl.dirs["c"] = t.TempDir()
	for _, id := range []string{"a", "b", "c"} {
		cl.start(id)
	}
	lid, l := cl.waitLeader("")
	if lid == "c" {
		t.Fatalf("c led before it was a member")
	}
	sessions := []session.ID{session.NewID()}
	write(t, l, sessions, 0, 50)
	waitFor(t, "c to report it is no member", func() bool { return cl.status("c").NotMember })

	ctx := context.Background()
	if _, err := AddMember(ctx, c, testCluster, "c"); err != nil {
		t.Fatal(err)
	}
	// The leader ships to c: everything is on all three.
	waitFor(t, "the leader to count c", func() bool { return l.Quorum(leader.AckAll) == nil && len(l.Stats()[0].Shipping.Followers) == 2 })
	write(t, l, sessions, 50, 50)
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := l.WaitAcked(actx, leader.AckAll); err != nil {
		t.Fatalf("c never caught up: %v", err)
	}
	other := "a"
	if lid == "a" {
		other = "b"
	}
	if _, err := RemoveMember(ctx, c, testCluster, other); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the leader to drop "+other, func() bool { return len(l.Stats()[0].Shipping.Followers) == 1 })
	waitFor(t, other+" to stop following", func() bool { return cl.status(other).NotMember })
	write(t, l, sessions, 100, 10) // a majority of two: the leader and c
}

func (cl *cluster) status(id string) Status {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.nodes[id].n.Status()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCatchUpBeforeLeading: each follower misses one shard while the leader
// writes (a majority still acknowledges every write: the other follower has
// it), so when the leader stops nobody is the most advanced on every shard.
// The winner copies the shard it lacks from the member ahead on it, then
// leads; every acknowledged write survives on every replica.
func TestCatchUpBeforeLeading(t *testing.T) {
	c := coord.NewMemory()
	t.Cleanup(func() { _ = c.Close() })
	cl := newCluster(t, c, 2, "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		cl.start(id)
	}
	first, l := cl.waitLeader("")
	var fol []string
	for _, id := range []string{"a", "b", "c"} {
		if id != first {
			fol = append(fol, id)
		}
	}
	sessions := []session.ID{session.NewID(), session.NewID(), session.NewID(), session.NewID()}
	want := write(t, l, sessions, 0, 40)
	cl.net.Cut("mem:"+fol[0], 1, true)
	cl.net.Cut("mem:"+fol[1], 0, true)
	maps.Copy(want, write(t, l, sessions, 40, 80))
	cl.stop(first)
	cl.net.Cut("mem:"+fol[0], 1, false)
	cl.net.Cut("mem:"+fol[1], 0, false)
	_, l2 := cl.waitLeader(first)
	maps.Copy(want, write(t, l2, sessions, 120, 40))
	cl.start(first)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l2.WaitAcked(ctx, leader.AckAll); err != nil {
		t.Fatalf("not every member caught up: %v", err)
	}
	cl.stopAll()
	for id, dir := range cl.dirs {
		got := replicaState(t, dir, 2)
		for k, v := range want {
			found := false
			for gk, gv := range got {
				if strings.HasSuffix(gk, k) && strings.HasSuffix(gv, v) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("member %s lost the acknowledged write %s=%s", id, k, v)
				break
			}
		}
	}
}

// TestElectsPastStoredEpochs: an etcd rebuilt empty (a new coordinator)
// over members whose stores hold epochs far above its revisions still
// elects, at an epoch above every stored one (invariant 1), with every
// acknowledged write.
func TestElectsPastStoredEpochs(t *testing.T) {
	c1 := coord.NewMemory()
	cl := newCluster(t, c1, 1, "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		cl.start(id)
	}
	sessions := []session.ID{session.NewID()}
	var epoch uint64
	var want map[string]string
	for round := range 4 { // a few terms: the stores' epochs climb
		id, l := cl.waitLeader("")
		want = write(t, l, sessions, round*10, 10)
		epoch = cl.status(id).Epoch
		cl.stop(id)
		cl.start(id)
	}
	cl.stopAll()
	_ = c1.Close()

	c2 := coord.NewMemory() // etcd rebuilt empty: revisions start again
	t.Cleanup(func() { _ = c2.Close() })
	cl.c = c2
	for _, id := range []string{"a", "b", "c"} {
		if _, err := AddMember(context.Background(), c2, testCluster, id); err != nil {
			t.Fatal(err)
		}
		cl.start(id)
	}
	id, l := cl.waitLeader("")
	if got := cl.status(id).Epoch; got <= epoch {
		t.Fatalf("elected at epoch %d on the new coordinator; the stores held epoch %d", got, epoch)
	}
	sh, _ := l.Shard(0)
	if sh.NextLSN() <= uint64(len(want)) {
		t.Errorf("the new leader's log ends at LSN %d, below the %d writes acknowledged", sh.NextLSN()-1, len(want))
	}
	write(t, l, sessions, 100, 5)
	cl.stopAll() // before c2 closes
}

// TestFailoverFreesClaimsInFlight: a request the leader was running when it
// stopped (its claim logged and replicated, its commit never made) is run
// at once on the next leader — the claim's owner is gone — instead of
// after the claim lease (an hour here); the retry commits once, and the
// dead owner's token settles nothing.
func TestFailoverFreesClaimsInFlight(t *testing.T) {
	c := coord.NewMemory()
	t.Cleanup(func() { _ = c.Close() })
	cl := newCluster(t, c, 1, "a", "b", "c")
	cl.optionsFor = func(o *Options) { o.Leader.Ledger.Lease = time.Hour }
	for _, id := range []string{"a", "b", "c"} {
		cl.start(id)
	}
	first, l := cl.waitLeader("")
	sid := session.NewID()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sh, err := l.Shard(0)
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := sh.Claim(ctx, sid, "client", "req-1", []byte("add 5"), idempotency.ClaimOptions{})
	if err != nil || orphan.Status != idempotency.Fresh {
		t.Fatalf("claim on the first leader: %v, %v", orphan, err)
	}
	if err := sh.WaitAcked(ctx, sh.NextLSN()-1, leader.AckAll); err != nil {
		t.Fatal(err)
	}
	cl.stop(first)
	_, l2 := cl.waitLeader(first)
	sh2, err := l2.Shard(0)
	if err != nil {
		t.Fatal(err)
	}
	retry, err := sh2.Claim(ctx, sid, "client", "req-1", []byte("add 5"), idempotency.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if retry.Status != idempotency.Fresh {
		t.Fatalf("the retry on the new leader is %v (lease end in %v), not run at once", retry.Status, time.Duration(retry.LeaseEnd-sh2.Now()))
	}
	if _, err := sh2.Commit(orphan, []byte("late")); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Fatalf("the dead owner's commit on the new leader: %v, want ErrNotOwner", err)
	}
	if _, err := sh2.Commit(retry, []byte("once"), wal.Event{Op: wal.OpAdd, Session: sid, Key: []byte("n"), Delta: 5}); err != nil {
		t.Fatal(err)
	}
	again, err := sh2.Claim(ctx, sid, "client", "req-1", []byte("add 5"), idempotency.ClaimOptions{})
	if err != nil || again.Status != idempotency.Replay || string(again.Outcome) != "once" {
		t.Fatalf("a second retry: %+v, %v; want the outcome replayed", again, err)
	}
}

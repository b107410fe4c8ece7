package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// buildEtcd builds etcd from the module graph (the server module's own
// main, the version the coordinator's client speaks to) into dir. The
// module's go.sum lacks the checksums of etcd's command-line packages
// (cobra), which no package of oncewal imports, so the build records them
// in a copy of go.mod and go.sum (-modfile) and leaves the module's own
// untouched.
func buildEtcd(t *testing.T, dir string) string {
	t.Helper()
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	must(t, err)
	mod := filepath.Join(dir, "etcd.mod")
	for from, to := range map[string]string{"go.mod": mod, "go.sum": filepath.Join(dir, "etcd.sum")} {
		b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(root)), from))
		must(t, err)
		must(t, os.WriteFile(to, b, 0o644))
	}
	bin := filepath.Join(dir, "etcd")
	if out, err := exec.Command("go", "build", "-mod=mod", "-modfile="+mod, "-o", bin, "go.etcd.io/etcd/server/v3").CombinedOutput(); err != nil {
		t.Fatalf("building etcd: %v\n%s", err, out)
	}
	return bin
}

// startEtcd runs a single-member etcd process on loopback ports and
// returns its client URL once it answers /health.
func startEtcd(t *testing.T, bin, dir string) (*proc, string) {
	t.Helper()
	client, peer := "http://"+freeAddr(t), "http://"+freeAddr(t)
	p := &proc{name: "etcd", log: filepath.Join(dir, "etcd.log"), args: []string{"--name", "e1", "--data-dir", filepath.Join(dir, "etcd-data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "e1=" + peer, "--log-level", "error"}}
	reapProcs(t, []*proc{p})
	p.start(t, bin)
	waitHTTP(t, "etcd", client+"/health", 200, time.Minute)
	return p, client
}

// TestRealProcessesNodeFailover runs a cluster as it is deployed: an etcd
// process built from the module graph, three oncewal node processes over
// mutual TLS (gencerts --nodes), members added with oncewal members add,
// and a Go client writing with request IDs (each an add to a counter of
// its own) to all three addresses. The leader is SIGKILLed: a new one is
// published (members list) within the lease TTL (--lease-ttl 2s) and a
// bound, and the client's writes continue; the killed node, restarted,
// rejoins as a follower (its replica moved to DIR/deposed and rebuilt).
// A node whose ID is not a member refuses to campaign, says so, and its
// /readyz answers 503 saying so. At the end every acknowledged request ID
// replays, and every member's replica holds every counter at 1: no request
// ran twice, none was lost. ONCEWAL_LONG=1 kills the leader 4 times (1
// otherwise; ONCEWAL_KILLS sets it).
func TestRealProcessesNodeFailover(t *testing.T) {
	kills := realProcKills(t, 4, 1)
	rp := newRealProcs(t)
	dir := rp.dir
	etcdBin := buildEtcd(t, dir)
	certs := filepath.Join(dir, "nodecerts")
	if _, e, err := rp.run("gencerts", certs, "--nodes", "a,b,c,d", "--clients", "app", "--hosts", "127.0.0.1"); err != nil {
		t.Fatalf("gencerts: %v %s", err, e)
	}
	_, ep := startEtcd(t, etcdBin, dir)
	ids := []string{"a", "b", "c"}
	procs := map[string]*proc{}
	addrs, metricsAddrs := map[string]string{}, map[string]string{}
	var all []*proc
	for _, id := range append(ids, "d") {
		addrs[id], metricsAddrs[id] = freeAddr(t), freeAddr(t)
		cert, key := pki.NodeFiles(id)
		procs[id] = &proc{name: id, log: filepath.Join(dir, id+".log"), args: []string{"node", "--etcd", ep, "--cluster", "test",
			"--id", id, "--dir", filepath.Join(dir, id), "--listen", addrs[id], "--shards", "2", "--lease-ttl", "2s", "--claim-lease", "3s",
			"--metrics-addr", metricsAddrs[id],
			"--tls-ca", filepath.Join(certs, pki.FileCA), "--tls-cert", filepath.Join(certs, cert), "--tls-key", filepath.Join(certs, key)}}
		all = append(all, procs[id])
	}
	reapProcs(t, all)

	// Misconfiguration is refused before anything starts.
	for _, bad := range [][]string{
		{"node", "--cluster", "test", "--id", "a", "--dir", filepath.Join(dir, "x"), "--listen", freeAddr(t), "--insecure"},
		{"node", "--etcd", ep, "--cluster", "test", "--id", "a", "--dir", filepath.Join(dir, "x"), "--listen", freeAddr(t), "--insecure", "--ack", "leader"},
	} {
		_, e, err := rp.run(bad...)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitUsage || !strings.Contains(e, "oncewal node: ") {
			t.Fatalf("%q: %v %s, want exit %d with a usage error", bad, err, e, exitUsage)
		}
	}
	for _, id := range ids {
		if out, e, err := rp.run("members", "add", "--etcd", ep, "--cluster", "test", id); err != nil || !strings.Contains(out, "added "+id) {
			t.Fatalf("members add %s: %v %s %s", id, err, out, e)
		}
	}
	for _, id := range ids {
		procs[id].start(t, rp.bin)
	}
	leaderID := waitNodeLeader(t, rp, ep, "", time.Minute)

	tlsCfg, err := grpctransport.LoadClientTLS(filepath.Join(certs, pki.FileCA), filepath.Join(certs, "client-app.pem"), filepath.Join(certs, "client-app-key.pem"))
	must(t, err)
	c, err := client.New(&client.Options{Addrs: []string{addrs["a"], addrs["b"], addrs["c"]}, TLS: tlsCfg, Logger: slog.New(slog.DiscardHandler)})
	must(t, err)
	defer c.Close()
	w := startNodeWriter(c)
	defer w.stop()
	w.waitAcked(t, 20)

	for k := range kills {
		killed := procs[leaderID]
		killed.kill(t)
		at := time.Now()
		newID := waitNodeLeader(t, rp, ep, leaderID, time.Minute)
		took := time.Since(at)
		t.Logf("kill %d: %s killed, %s leads after %v", k+1, leaderID, newID, took.Round(time.Millisecond))
		// The lease TTL, and a bound for the fencing round and a machine
		// shared with other tests.
		if took > 2*time.Second+10*time.Second {
			t.Errorf("kill %d: a new leader after %v, want within the 2s lease TTL + 10s", k+1, took)
		}
		w.waitAcked(t, w.acked()+20)
		// One follower of two is down: the majority holds.
		waitHTTP(t, newID+" leading", "http://"+metricsAddrs[newID]+"/readyz", 200, time.Minute)

		dirty := filepath.Join(dir, leaderID)
		killed.start(t, rp.bin)
		waitProcLog(t, killed, time.Minute, "node: moved the replica it led aside to rebuild it from the new leader")
		waitProcLog(t, killed, time.Minute, "node: following", "leader="+newID)
		if _, err := os.Stat(filepath.Join(dirty, node.DeposedDirName)); err != nil {
			t.Errorf("the killed leader's replica was not kept aside: %v", err)
		}
		waitHTTP(t, leaderID+" following", "http://"+metricsAddrs[leaderID]+"/readyz", 200, time.Minute)
		leaderID = newID
	}

	// A node that is not a member neither campaigns nor follows, and says
	// so; it stops cleanly.
	d := procs["d"]
	d.start(t, rp.bin)
	waitProcLog(t, d, time.Minute, "level=WARN", "node: not a member: neither campaigning nor following")
	if body := waitHTTP(t, "d, not a member", "http://"+metricsAddrs["d"]+"/readyz", 503, time.Minute); !strings.Contains(body, node.ErrNotMember.Error()) {
		t.Errorf("d's /readyz: %s", body)
	}
	if err := d.stop(t); err != nil {
		t.Errorf("d: %v", err)
	}

	w.waitAcked(t, w.acked()+20)
	sent := w.stop()
	// Every request the client sent, asked again: one it saw answered
	// replays; one that failed (its outcome unknown) may run now, once. A
	// request a killed leader was running is answered once its claim
	// (--claim-lease) has expired: until then, outcome unknown, and a
	// client retries, as it must.
	ctx := context.Background()
	for i := range sent {
		r, err := c.Submit(ctx, nodeReqID(i), nodeReqOps(i))
		if errors.Is(err, client.ErrOutcomeUnknown) {
			r, err = c.Submit(ctx, nodeReqID(i), nodeReqOps(i))
		}
		switch {
		case err != nil:
			t.Fatalf("request %d asked again: %v", i, err)
		case w.wasAcked(i) && !r.Replayed:
			t.Errorf("request %d ran again after the failovers (epoch %d)", i, r.Epoch)
		}
	}
	// A barrier every member acknowledges: from then on every replica
	// holds every request, so each can be read once its node stops.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := c.Submit(ctx, "barrier", client.Ops(client.Put([]byte("barrier"), []byte("x"))), client.WithAck(client.AckAll))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no member set acknowledged the barrier: %v", err)
		}
	}
	// SIGTERM stops the leader cleanly (exit 0): it resigns, and another
	// member leads.
	if err := procs[leaderID].stop(t); err != nil {
		t.Errorf("leader %s: stop: %v", leaderID, err)
	}
	at := time.Now()
	next := waitNodeLeader(t, rp, ep, leaderID, time.Minute)
	t.Logf("%s stopped (SIGTERM), %s leads after %v", leaderID, next, time.Since(at).Round(time.Millisecond))
	waitProcLog(t, procs[leaderID], time.Minute, "node: stepped down", "why=stopping")
	for _, id := range ids {
		if id == leaderID {
			continue
		}
		if err := procs[id].stop(t); err != nil {
			t.Errorf("%s: stop: %v", id, err)
		}
	}
	for _, id := range ids {
		counters := replicaCounters(t, filepath.Join(dir, id, node.ReplicaDirName), 2)
		if len(counters) != sent {
			t.Errorf("member %s holds %d counters, want %d", id, len(counters), sent)
		}
		for k, v := range counters {
			if v != 1 {
				t.Errorf("member %s: %s = %d, want 1 (applied once)", id, k, v)
			}
		}
	}
	t.Logf("%d requests, %d acknowledged before being asked again, %d kills", sent, w.acked(), kills)
}

// waitNodeLeader waits (at most limit) for members list to name a leader
// other than not, and returns its ID.
func waitNodeLeader(t *testing.T, rp *realProcs, ep, not string, limit time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		out, e, err := rp.run("members", "list", "--json", "--etcd", ep, "--cluster", "test")
		var got struct {
			Term *node.Term `json:"term"`
		}
		if err == nil && json.Unmarshal([]byte(out), &got) == nil && got.Term != nil && got.Term.Leading() && got.Term.ID != not {
			return got.Term.ID
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader but %q within %v: %v %s %s", not, limit, err, out, e)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func nodeReqID(i int) string  { return fmt.Sprintf("req-%05d", i) }
func nodeReqOps(i int) []byte { return client.Ops(client.Add([]byte(fmt.Sprintf("ctr-%05d", i)), 1)) }

// nodeWriter submits requests 0, 1, 2, … one after another until stopped,
// each a new request ID adding 1 to a counter of its own, and records
// which the client saw answered.
type nodeWriter struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	sent   int
	ok     map[int]bool
}

func startNodeWriter(c *client.Client) *nodeWriter {
	ctx, cancel := context.WithCancel(context.Background())
	w := &nodeWriter{cancel: cancel, done: make(chan struct{}), ok: map[int]bool{}}
	go func() {
		defer close(w.done)
		for i := 0; ctx.Err() == nil; i++ {
			w.mu.Lock()
			w.sent = i + 1
			w.mu.Unlock()
			if _, err := c.Submit(ctx, nodeReqID(i), nodeReqOps(i)); err == nil {
				w.mu.Lock()
				w.ok[i] = true
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *nodeWriter) acked() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ok)
}

func (w *nodeWriter) wasAcked(i int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ok[i]
}

// waitAcked waits for n acknowledged requests: the writes go on.
func (w *nodeWriter) waitAcked(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for w.acked() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests acknowledged after a minute, want %d: the writes stopped", w.acked(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop ends the writer and returns how many requests it sent.
func (w *nodeWriter) stop() int {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent
}

// replicaCounters reads the counters (ctr-*) of a stopped node's replica.
func replicaCounters(t *testing.T, replica string, shards int) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	eachStateRow(t, replica, shards, func(d, k, v string) {
		if strings.Contains(k, "ctr-") {
			out[k] = counterValue(t, d, k, v)
		}
	})
	return out
}

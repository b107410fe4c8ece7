package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/internal/clienthistory"
)

// TestRealProcessesReelectedLeaderTail is a finding of the nemesis
// (TestRealProcessesNemesis, etcd below quorum), made deterministic: a
// leader whose log holds batches its followers never received (cut from
// them: its acks time out) loses its lease to an etcd outage every member
// sees (each one's etcd proxies cut past the lease TTL). etcd answers it
// first, so it wins the next term, and its replica is the most advanced
// (with etcd below quorum any member may win; a winner hands the term to
// the most advanced): it leads at a higher epoch E and ships its log's
// tail, batches of its earlier epoch, to followers that promised E while
// it fenced. Every store refused them (store invariant 5,
// replication.ErrStaleEpoch: "batch epoch 5 is below epoch 16 this store
// promised"), each follower retried every 5 s forever, and the cluster
// stayed down (3 runs of 3 before the fix: no write acknowledged above the
// old epoch within a minute, or followers' /readyz 503 "no link to the
// leader"). Now each such shard is rebuilt from the leader's snapshot
// (node/doc.go, step 5): a leader at a higher epoch acknowledges writes,
// every member's /readyz answers 200, and the clients' answers stay
// exactly-once with epochs that only grow.
func TestRealProcessesReelectedLeaderTail(t *testing.T) {
	rp := newRealProcs(t)
	c := startNemesisCluster(t, rp, buildEtcd(t, rp.dir), 1)
	var h clienthistory.History
	tr := newEpochTracker()
	h.OnAnswer = tr.observe
	var drivers sync.WaitGroup
	for k := range nemesisClients {
		name := fmt.Sprintf("app%d", k)
		cl := c.newClient(name)
		defer cl.Close()
		drivers.Go(func() { h.Drive(context.Background(), cl, name, 0, uint64(k)) })
	}
	defer drivers.Wait()
	defer h.Stop()
	c.waitAcks(&h, 30)

	term := c.term()
	ld := c.nodes[term.ID]
	// The leader keeps logging requests; its followers get none of them.
	// One is sent after the cut, straight to the leader's listen address:
	// the app clients may all be retrying requests shipped before it (a
	// redirect names the advertised address, behind the cut), and then the
	// followers would hold the whole log and no tail would be left.
	c.in[term.ID].cut()
	tail := c.newClientAt("app0", c.listen[term.ID])
	defer tail.Close()
	tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, _ = tail.Submit(tctx, "tail-after-cut", client.Ops(client.Add([]byte("tail"), 1)))
	cancel()
	waitProcLog(t, ld, time.Minute, "request_id=tail-after-cut")
	// Every member loses etcd past the lease: the leader steps down, and
	// nobody can win meanwhile. etcd comes back to the leader first, so
	// that it wins the next term; then to the others, which promise it.
	won := strings.Count(readFile(t, ld.log), "node: won a term: fencing")
	for _, id := range c.ids {
		for _, p := range c.etcdIn[id] {
			p.cut()
		}
	}
	waitProcLog(t, ld, time.Minute, "node: stepped down")
	for _, p := range c.etcdIn[term.ID] {
		p.heal()
	}
	waitProcLogMore(t, ld, "node: won a term: fencing", won)
	for _, id := range c.ids {
		for _, p := range c.etcdIn[id] {
			p.heal()
		}
	}
	c.in[term.ID].heal()

	tr.waitAbove(t, term.Epoch, "after the outage")
	c.waitReady()
	c.waitAcks(&h, 20)
	h.Stop()
	drivers.Wait()
	h.CheckAnswers(t)
	h.CheckEpochsGrow(t)
	// Either way a follower takes the tail it may not apply: rebuilt before
	// it follows, as the leading term's first LSNs show it behind
	// (rebuildBehind), or once its store refuses the tail (rebuildFenced).
	rebuilt := 0
	for _, id := range c.ids {
		log := readFile(t, c.nodes[id].log)
		rebuilt += strings.Count(log, "node: rebuilt a shard from the leader") + strings.Count(log, "node: rebuilt a shard behind the leader's term")
	}
	if rebuilt == 0 {
		t.Error("no follower shard was rebuilt from the re-elected leader: the test did not build the tail it is about")
	}
	t.Logf("%s re-elected at a higher epoch; %d follower shards rebuilt from it", term.ID, rebuilt)
}

// waitProcLogMore waits (a minute at most) for p's output to hold more
// than n lines with part.
func waitProcLogMore(t *testing.T, p *proc, part string, n int) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%s to log %q", p.name, part), func() bool { return strings.Count(readFile(t, p.log), part) > n })
}

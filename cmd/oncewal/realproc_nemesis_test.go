package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/internal/clienthistory"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
)

// A nemesis fault: one at a time, the cluster recovering between faults.
const (
	faultKillLeader      = "kill -9 the leader"
	faultPauseLeader     = "SIGSTOP the leader past its lease"
	faultCutLeaderEtcd   = "cut the leader from etcd"
	faultCutLeaderPeers  = "cut the leader from its followers"
	faultEtcdQuorumLoss  = "stop 2 of 3 etcd members"
	faultKillFollower    = "kill -9 a follower"
	nemesisLeaseTTL      = 2 * time.Second
	nemesisShards        = 2
	nemesisClients       = 3
	nemesisRecoveryLimit = time.Minute
)

// TestRealProcessesNemesis runs three oncewal node processes over mutual
// TLS (--lease-ttl 2s) on one etcd process, and again on a real
// three-member etcd cluster, with network clients (package client, one
// principal each) writing requests with request IDs, each adding 1 to a
// counter of its own and to a shared total. A seeded nemesis injects one
// fault at a time on loopback and waits for the cluster to recover (a
// leader published, every member's /readyz 200, writes acknowledged again)
// before the next: kill -9 the leader (restarted); SIGSTOP it past its
// lease, then SIGCONT; cut it from etcd only (each node reaches etcd
// through proxies of its own); cut it from its followers (the address each
// node advertises is a proxy); take etcd below quorum (two of three
// members killed, then restarted; three-member cluster only); kill -9 a
// follower (restarted). At the end every request without an answer is
// asked again, every client's shard gets a barrier every member
// acknowledges, the nodes stop, and internal/clienthistory checks every
// replica: acknowledged ⇒ its counter at 1, nothing above 1, the total the
// number that took effect; at most one fresh answer per request; each
// client's answers linearizable (porcupine); no write acknowledged at an
// epoch below one acknowledged before it was sent. Failover time is the fault →
// the first write acknowledged at a higher epoch. ONCEWAL_SEED replays a
// schedule; ONCEWAL_LONG=1 runs until 20 failovers on one etcd and 10 on
// three, the kinds in seeded rounds that hold each once (ONCEWAL_FAILOVERS
// sets both); the default is a short run of a few faults each.
func TestRealProcessesNemesis(t *testing.T) {
	seed := realProcSeed(t)
	t.Logf("seed %d (ONCEWAL_SEED=%d replays the schedule)", seed, seed)
	rp := newRealProcs(t)
	etcdBin := buildEtcd(t, rp.dir)
	for _, tc := range []struct {
		etcds      int
		long       int
		shortKinds []string
	}{
		{1, 20, []string{faultKillLeader, faultPauseLeader, faultCutLeaderEtcd}},
		{3, 10, []string{faultEtcdQuorumLoss, faultCutLeaderPeers, faultKillFollower, faultKillLeader}},
	} {
		t.Run(fmt.Sprintf("etcd=%d", tc.etcds), func(t *testing.T) {
			failovers := realProcFailovers(t, tc.long)
			runNemesis(t, rp, etcdBin, tc.etcds, seed+uint64(tc.etcds), failovers, tc.shortKinds)
		})
	}
}

// realProcFailovers is the failovers a long run waits for: ONCEWAL_FAILOVERS,
// long under ONCEWAL_LONG=1, or 0 (a short run: each short kind once).
func realProcFailovers(t *testing.T, long int) int {
	if os.Getenv("ONCEWAL_FAILOVERS") != "" {
		return realProcEnvInt(t, "ONCEWAL_FAILOVERS")
	}
	if os.Getenv("ONCEWAL_LONG") != "" {
		return long
	}
	return 0
}

func realProcEnvInt(t *testing.T, name string) int {
	t.Helper()
	var v int
	if _, err := fmt.Sscan(os.Getenv(name), &v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// nemesisCluster is one run's processes and proxies.
type nemesisCluster struct {
	t        *testing.T
	rp       *realProcs
	dir      string
	ids      []string
	nodes    map[string]*proc
	metrics  map[string]string
	listen   map[string]string
	in       map[string]*cutProxy   // the address each node advertises
	etcdIn   map[string][]*cutProxy // each node's way to each etcd member
	etcds    []*proc
	etcdBin  string
	etcdURLs []string
	ep       string // every etcd member, for the test's own members commands
}

func runNemesis(t *testing.T, rp *realProcs, etcdBin string, etcds int, seed uint64, failovers int, shortKinds []string) {
	rng := rand.New(rand.NewPCG(seed, 0x6e656d))
	start := time.Now()
	c := startNemesisCluster(t, rp, etcdBin, etcds)

	var h clienthistory.History
	tr := newEpochTracker()
	h.OnAnswer = tr.observe
	var clients []*client.Client
	var drivers sync.WaitGroup
	for k := range nemesisClients {
		name := fmt.Sprintf("app%d", k)
		cl := c.newClient(name)
		clients = append(clients, cl)
		drivers.Go(func() { h.Drive(context.Background(), cl, name, 0, seed*16+uint64(k)) })
	}
	defer func() {
		h.Stop()
		drivers.Wait()
		for _, cl := range clients {
			cl.Close()
		}
	}()
	c.waitAcks(&h, 30)

	kinds := []string{faultKillLeader, faultPauseLeader, faultCutLeaderEtcd, faultCutLeaderPeers, faultKillFollower}
	if etcds == 3 {
		kinds = append(kinds, faultEtcdQuorumLoss)
	}
	var took []time.Duration
	counts := map[string]int{}
	var round []int // a long run's seeded order of the kinds, renewed every len(kinds) faults
	for i := 0; ; i++ {
		var kind string
		if failovers == 0 {
			if i == len(shortKinds) {
				break
			}
			kind = shortKinds[i]
		} else {
			if len(took) >= failovers {
				break
			}
			if i >= 6*failovers {
				t.Fatalf("%d faults gave %d failovers, want %d", i, len(took), failovers)
			}
			if i%len(kinds) == 0 {
				round = rng.Perm(len(kinds))
			}
			kind = kinds[round[i%len(kinds)]]
		}
		counts[kind]++
		term := c.term()
		at := time.Now()
		c.inject(kind, term, rng, tr)
		undone := time.Since(at)
		c.recover(&h)
		what := "no failover"
		// A failover: a write acknowledged at a higher epoch, timed from
		// the fault.
		if e, first, ok := tr.firstAbove(term.Epoch); ok {
			took = append(took, first.Sub(at))
			what = fmt.Sprintf("epoch %d acknowledged %v after the fault", e, first.Sub(at).Round(time.Millisecond))
		}
		t.Logf("fault %d: %s (%s led epoch %d): %s; undone after %v, recovered after %v", i+1, kind, term.ID, term.Epoch,
			what, undone.Round(time.Millisecond), time.Since(at).Round(time.Millisecond))
	}

	// Every request the clients were never told of, asked again until
	// told; then a barrier in every client's shard that every member
	// acknowledges, so that every replica holds everything.
	h.Stop()
	drivers.Wait()
	byName := map[string]*client.Client{}
	for k, cl := range clients {
		byName[fmt.Sprintf("app%d", k)] = cl
	}
	late := 0
	for _, r := range h.Requests() {
		if !r.Acked() {
			late++
		}
		for try := 0; !r.Acked() && try < 5; try++ {
			h.Submit(context.Background(), byName[r.Client], r)
		}
	}
	for k, cl := range clients {
		untilAcked(t, fmt.Sprintf("app%d", k), func() error {
			_, err := cl.Submit(context.Background(), "barrier", client.Ops(client.Put([]byte("barrier"), []byte("x"))), client.WithAck(client.AckAll))
			return err
		})
	}
	c.stopNodes(t)
	var v clienthistory.Verdict
	for _, id := range c.ids {
		v = h.Check(t, "member "+id, replicaEffects(t, filepath.Join(c.dir, id, node.ReplicaDirName), nemesisShards))
	}
	v.Replays = h.CheckAnswers(t)
	h.CheckLinearizable(t)
	epochs := h.CheckEpochsGrow(t)
	if v.Acked == 0 {
		t.Fatal("no request was acknowledged: the run proves nothing")
	}
	if failovers > 0 && len(took) < failovers {
		t.Fatalf("%d failovers, want %d", len(took), failovers)
	}
	rebuilt := 0
	for _, id := range c.ids {
		rebuilt += strings.Count(readFile(t, c.nodes[id].log), "node: rebuilt a shard from the leader")
	}
	t.Logf("seed %d, %d etcd member(s), lease TTL %v: %d faults %v, %d failovers, %d epochs acknowledged writes, "+
		"%d follower shards rebuilt from a re-elected leader; %v (%d of them unanswered when the writers stopped, asked again); "+
		"elapsed %v; failover times (fault → first write acknowledged at a higher epoch) %s",
		seed, etcds, nemesisLeaseTTL, sumCounts(counts), counts, len(took), len(epochs), rebuilt, v, late,
		time.Since(start).Round(time.Second), durationStats(took))
}

func startNemesisCluster(t *testing.T, rp *realProcs, etcdBin string, etcds int) *nemesisCluster {
	dir := t.TempDir()
	c := &nemesisCluster{t: t, rp: rp, dir: dir, ids: []string{"a", "b", "c"}, nodes: map[string]*proc{},
		metrics: map[string]string{}, listen: map[string]string{}, in: map[string]*cutProxy{}, etcdIn: map[string][]*cutProxy{}}
	certs := filepath.Join(dir, "certs")
	clientNames := make([]string, nemesisClients)
	for k := range clientNames {
		clientNames[k] = fmt.Sprintf("app%d", k)
	}
	if _, e, err := rp.run("gencerts", certs, "--nodes", strings.Join(c.ids, ","), "--clients", strings.Join(clientNames, ","),
		"--hosts", "127.0.0.1"); err != nil {
		t.Fatalf("gencerts: %v %s", err, e)
	}
	c.startEtcds(etcdBin, etcds)
	var all []*proc
	for _, id := range c.ids {
		c.listen[id], c.metrics[id] = freeAddr(t), freeAddr(t)
		c.in[id] = newCutProxy(t, c.listen[id])
		var eps []string
		for _, u := range c.etcdURLs {
			p := newCutProxy(t, strings.TrimPrefix(u, "http://"))
			c.etcdIn[id] = append(c.etcdIn[id], p)
			eps = append(eps, "http://"+p.Addr())
		}
		cert, key := pki.NodeFiles(id)
		c.nodes[id] = &proc{name: id, log: filepath.Join(dir, id+".log"), args: []string{"node", "--etcd", strings.Join(eps, ","),
			"--cluster", "test", "--id", id, "--dir", filepath.Join(dir, id), "--listen", c.listen[id], "--advertise", c.in[id].Addr(),
			"--shards", fmt.Sprint(nemesisShards), "--lease-ttl", nemesisLeaseTTL.String(), "--claim-lease", "3s",
			"--metrics-addr", c.metrics[id],
			"--tls-ca", filepath.Join(certs, pki.FileCA), "--tls-cert", filepath.Join(certs, cert), "--tls-key", filepath.Join(certs, key)}}
		all = append(all, c.nodes[id])
	}
	reapProcs(t, append(all, c.etcds...))
	for _, id := range c.ids {
		if out, e, err := rp.run("members", "add", "--etcd", c.ep, "--cluster", "test", id); err != nil {
			t.Fatalf("members add %s: %v %s %s", id, err, out, e)
		}
	}
	for _, id := range c.ids {
		c.nodes[id].start(t, rp.bin)
	}
	c.waitReady()
	return c
}

// startEtcds runs an etcd cluster of n member processes on loopback and
// waits for every member to answer /health.
// untilAcked retries barrier (a write every member must acknowledge) until
// it succeeds, failing the test after nemesisRecoveryLimit.
func untilAcked(t *testing.T, what string, barrier func() error) {
	t.Helper()
	deadline := time.Now().Add(nemesisRecoveryLimit)
	for {
		err := barrier()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no member set acknowledged the barrier: %v", what, err)
		}
	}
}

// stopNodes stops every member, the last first.
func (c *nemesisCluster) stopNodes(t *testing.T) {
	for _, id := range slices.Backward(c.ids) {
		if err := c.nodes[id].stop(t); err != nil {
			t.Errorf("%s: stop: %v", id, err)
		}
	}
}

func (c *nemesisCluster) startEtcds(bin string, n int) {
	t := c.t
	var peers, clients, initial []string
	for i := range n {
		clients = append(clients, "http://"+freeAddr(t))
		peers = append(peers, "http://"+freeAddr(t))
		initial = append(initial, fmt.Sprintf("e%d=%s", i, peers[i]))
	}
	for i := range n {
		p := &proc{name: fmt.Sprintf("etcd%d", i), log: filepath.Join(c.dir, fmt.Sprintf("etcd%d.log", i)), args: []string{
			"--name", fmt.Sprintf("e%d", i), "--data-dir", filepath.Join(c.dir, fmt.Sprintf("etcd%d-data", i)),
			"--listen-client-urls", clients[i], "--advertise-client-urls", clients[i],
			"--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new", "--log-level", "error"}}
		c.etcds = append(c.etcds, p)
		p.start(t, bin)
	}
	c.etcdURLs, c.ep, c.etcdBin = clients, strings.Join(clients, ","), bin
	c.waitEtcd()
}

func (c *nemesisCluster) waitEtcd() {
	for _, u := range c.etcdURLs {
		waitHTTP(c.t, "etcd "+u, u+"/health", 200, nemesisRecoveryLimit)
	}
}

func (c *nemesisCluster) newClient(name string) *client.Client {
	var addrs []string
	for _, id := range c.ids {
		addrs = append(addrs, c.listen[id])
	}
	return c.newClientAt(name, addrs...)
}

// newClientAt is newClient reaching only addrs.
func (c *nemesisCluster) newClientAt(name string, addrs ...string) *client.Client {
	certs := filepath.Join(c.dir, "certs")
	tlsCfg, err := grpctransport.LoadClientTLS(filepath.Join(certs, pki.FileCA), filepath.Join(certs, "client-"+name+".pem"),
		filepath.Join(certs, "client-"+name+"-key.pem"))
	must(c.t, err)
	// A budget that rides out a failover (the lease TTL, the fencing
	// round); an attempt caught by a paused leader gives up in seconds.
	cl, err := client.New(&client.Options{Addrs: addrs, TLS: tlsCfg, Attempts: 200, RetryTimeout: 20 * time.Second,
		AttemptTimeout: 3 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	must(c.t, err)
	return cl
}

// term is the published term (a leader's), waiting for one.
func (c *nemesisCluster) term() node.Term {
	deadline := time.Now().Add(nemesisRecoveryLimit)
	for {
		out, e, err := c.rp.run("members", "list", "--json", "--etcd", c.ep, "--cluster", "test")
		var got struct {
			Term *node.Term `json:"term"`
		}
		if err == nil && json.Unmarshal([]byte(out), &got) == nil && got.Term != nil && got.Term.Leading() {
			return *got.Term
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no leader published within %v: %v %s %s", nemesisRecoveryLimit, err, out, e)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// inject runs one fault against the cluster whose leader term names and
// undoes it: a fault that deposes the leader is undone once a write is
// acknowledged at a higher epoch (tr); the others after the lease TTL and
// a second, time enough for a wrong failover to show.
func (c *nemesisCluster) inject(kind string, term node.Term, rng *rand.Rand, tr *epochTracker) {
	t := c.t
	hold := nemesisLeaseTTL + time.Second
	ld := c.nodes[term.ID]
	switch kind {
	case faultKillLeader:
		ld.kill(t)
		tr.waitAbove(t, term.Epoch, kind)
		ld.start(t, c.rp.bin)
	case faultPauseLeader:
		must(t, ld.cmd.Process.Signal(syscall.SIGSTOP))
		tr.waitAbove(t, term.Epoch, kind)
		must(t, ld.cmd.Process.Signal(syscall.SIGCONT))
	case faultCutLeaderEtcd:
		for _, p := range c.etcdIn[term.ID] {
			p.cut()
		}
		tr.waitAbove(t, term.Epoch, kind)
		for _, p := range c.etcdIn[term.ID] {
			p.heal()
		}
	case faultCutLeaderPeers:
		c.in[term.ID].cut()
		time.Sleep(hold)
		c.in[term.ID].heal()
	case faultEtcdQuorumLoss:
		down := rng.Perm(len(c.etcds))[:2]
		for _, i := range down {
			c.etcds[i].kill(t)
		}
		time.Sleep(hold)
		for _, i := range down {
			c.etcds[i].start(t, c.etcdBin)
		}
		c.waitEtcd()
	case faultKillFollower:
		var fs []string
		for _, id := range c.ids {
			if id != term.ID {
				fs = append(fs, id)
			}
		}
		f := c.nodes[fs[rng.IntN(len(fs))]]
		f.kill(t)
		time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
		f.start(t, c.rp.bin)
	default:
		t.Fatalf("unknown fault %q", kind)
	}
}

// recover waits for the cluster to be whole again: every member's /readyz
// 200 (a leader with its quorum, followers linked to it) and writes
// acknowledged again.
func (c *nemesisCluster) recover(h *clienthistory.History) {
	c.waitReady()
	c.waitAcks(h, 20)
}

func (c *nemesisCluster) waitReady() {
	for _, id := range c.ids {
		waitHTTP(c.t, id+" ready", "http://"+c.metrics[id]+"/readyz", 200, nemesisRecoveryLimit)
	}
}

// waitAcks waits for n more acknowledged answers.
func (c *nemesisCluster) waitAcks(h *clienthistory.History, n int) {
	count := func() int {
		k := 0
		for _, r := range h.Requests() {
			if r.Acked() {
				k++
			}
		}
		return k
	}
	want := count() + n
	deadline := time.Now().Add(nemesisRecoveryLimit)
	for count() < want {
		if time.Now().After(deadline) {
			c.t.Fatalf("%d requests acknowledged after %v, want %d: the writes stopped", count(), nemesisRecoveryLimit, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// epochTracker records when each epoch first acknowledged a write.
type epochTracker struct {
	mu    sync.Mutex
	first map[uint64]time.Time
}

func newEpochTracker() *epochTracker { return &epochTracker{first: map[uint64]time.Time{}} }

func (tr *epochTracker) observe(_ *clienthistory.Request, a clienthistory.Answer) {
	if !a.OK() {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if f, ok := tr.first[a.Res.Epoch]; !ok || a.At.Before(f) {
		tr.first[a.Res.Epoch] = a.At
	}
}

// firstAbove is the lowest epoch above e that acknowledged a write, and
// when it first did.
func (tr *epochTracker) firstAbove(e uint64) (uint64, time.Time, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var best uint64
	for k := range tr.first {
		if k > e && (best == 0 || k < best) {
			best = k
		}
	}
	return best, tr.first[best], best != 0
}

// waitAbove waits for a write acknowledged at an epoch above e.
func (tr *epochTracker) waitAbove(t *testing.T, e uint64, what string) {
	t.Helper()
	deadline := time.Now().Add(nemesisRecoveryLimit)
	for {
		if _, _, ok := tr.firstAbove(e); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no write acknowledged above epoch %d within %v", what, e, nemesisRecoveryLimit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// replicaEffects sums the counters of a stopped node's replica by user
// key, over sessions (clienthistory's requests add to req/ID and total).
func replicaEffects(t *testing.T, replica string, shards int) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	eachStateRow(t, replica, shards, func(d, k, v string) {
		rest, _ := strings.CutPrefix(k, keyspace.State)
		if len(rest) < 16 {
			return
		}
		key := rest[16:] // after the session ID
		if !strings.HasPrefix(key, "req/") && key != clienthistory.Total {
			return
		}
		out[key] += int64(counterValue(t, d, key, v))
	})
	return out
}

// eachStateRow calls f with every state row (keyspace.State) of a stopped
// node's replica, and the directory of the shard's store it is in.
func eachStateRow(t *testing.T, replica string, shards int, f func(dir, key, value string)) {
	t.Helper()
	for s := range uint32(shards) {
		d := store.ShardDir(replica, s)
		db, err := pebble.Open(d, &pebble.Options{ReadOnly: true, Logger: testutil.PanicLogger{}})
		if err != nil {
			t.Fatalf("opening %s: %v", d, err)
		}
		rows, err := testutil.SnapshotDB(db)
		_ = db.Close()
		must(t, err)
		for k, v := range rows {
			if strings.HasPrefix(k, keyspace.State) {
				f(d, k, v)
			}
		}
	}
}

// counterValue decodes an Add counter's row value.
func counterValue(t *testing.T, dir, key, v string) uint64 {
	t.Helper()
	if len(v) != 9 {
		t.Fatalf("%s: counter %q is %x, not a counter", dir, key, v)
	}
	return binary.LittleEndian.Uint64([]byte(v)[1:])
}

func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// durationStats is min, median, max and the mean of ds.
func durationStats(ds []time.Duration) string {
	if len(ds) == 0 {
		return "(none)"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("min %v median %v max %v mean %v over %d", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]), r(sum/time.Duration(len(s))), len(s))
}

// cutProxy is a TCP proxy on 127.0.0.1 the test cuts and heals, as a
// network partition would: while cut, what either side sends is dropped
// (connections stay open, silent, and new ones are accepted and never
// forwarded), so that the peers learn of it by their own timeouts, not by
// a reset; heal aborts every connection made or alive during the cut (a
// stream missing bytes cannot continue) and forwards again.
type cutProxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	isCut  bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	p := &cutProxy{lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) Addr() string { return p.lis.Addr().String() }

func (p *cutProxy) cut() {
	p.mu.Lock()
	p.isCut = true
	p.mu.Unlock()
}

func (p *cutProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isCut = false
	for c := range p.conns {
		abortConn(c)
		delete(p.conns, c)
	}
}

func (p *cutProxy) cutNow() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.isCut
}

func (p *cutProxy) close() {
	p.lis.Close()
	p.heal()
	p.wg.Wait()
}

func (p *cutProxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.track(c)
		if p.cutNow() {
			p.wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			abortConn(c)
			continue
		}
		p.track(up)
		p.wg.Go(func() { p.pipe(c, up) })
		p.wg.Go(func() { p.pipe(up, c) })
	}
}

func (p *cutProxy) pipe(src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.cutNow() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			// Either side ending ends both: gRPC and etcd never
			// half-close a connection.
			abortConn(src)
			abortConn(dst)
			p.mu.Lock()
			delete(p.conns, src)
			delete(p.conns, dst)
			p.mu.Unlock()
			return
		}
	}
}

func abortConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

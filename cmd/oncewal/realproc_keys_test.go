package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/cockroachdb/pebble/v2"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/kvroute"
	"github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
)

const (
	// keysPrincipal is the one principal every client "process" of the
	// test is: gencerts' app0 of the nemesis cluster.
	keysPrincipal = "app0"
	keysGroups    = 6 // hash tags {g0}..{g5}, each with keys a and b
	keysWorkers   = 6
	// keysBudget is a worker client's RetryTimeout: shorter than a
	// failover (the 2s lease and the fencing), so calls caught by a kill
	// end with the outcome unknown and are retried later, by the same
	// request ID, often by the next client "process".
	keysBudget = 1500 * time.Millisecond
)

// keysKey is key k (0: a, 1: b) of hash tag group g: both keys of a group
// lie in one shard, so a transaction may add to both.
func keysKey(g, k int) []byte { return []byte(fmt.Sprintf("{g%d}/%c", g, 'a'+k)) }

// TestRealProcessesKeysOutliveFailover: a principal's keys outlive its
// client processes and the leader. Three oncewal node processes (mutual
// TLS, --lease-ttl 2s, 2 shards, --ack majority) on an etcd process; one
// principal's client "processes" — a client.Client each, closed and
// replaced by a new one (new connections, new sessions, the same
// certificate: what a restarted process is to the cluster), with its calls
// in flight cut by the close — run workers that each send a sequence of
// requests with unique request IDs: a Txn adding 1 to key a, to key b, or
// to both (one transaction on two keys of one shard) of one of 6 hash tag
// groups spread over both shards, and linearizable Gets (on the leader) of
// those keys. A request that ends with its outcome unknown (or cut by a
// restart) is retried later with the same request ID, by whichever client
// process is current, until it is answered: so every distinct request
// applies exactly once. The leader is killed with SIGKILL (twice; 6 times
// with ONCEWAL_LONG=1; ONCEWAL_KILLS sets it) and restarted; after each
// kill, a fault leaves the deposed leader running and reachable by the
// clients, where a read it must no longer answer could be: SIGSTOP past
// its lease, or cut from etcd (in turn). Each fault waits for a write
// answered at a higher epoch, and the clients restart before and after
// every fault. Then every request still
// unanswered is answered by a new client process, and a brand-new one
// reads every key (Get and Range): each counter equals the number of
// distinct add requests that touched it, and the adds that touched it
// answered exactly the values 1..n, each once. Every member's replica,
// read once a barrier every member acknowledged is in and the nodes
// stopped, holds the same. Porcupine checks the whole history, partitioned
// by hash tag group, against counters (an add answers the new values, a
// get the value and whether the key exists): a request retried under one
// ID is one operation, from its first call to its final answer (a replay
// answers the recorded values); the history is written as a porcupine
// visualization when it is not linearizable (under ONCEWAL_ARTIFACTS, or
// a new temporary directory that outlives the test). No write is answered
// at an epoch below one answered before it was sent. ONCEWAL_SEED replays
// the workload's choices.
func TestRealProcessesKeysOutliveFailover(t *testing.T) {
	kills := realProcKills(t, 6, 2)
	seed := realProcSeed(t)
	t.Logf("seed %d (ONCEWAL_SEED=%d replays the workload's choices), %d kills", seed, seed, kills)
	begin := time.Now()
	rp := newRealProcs(t)
	etcdBin := buildEtcd(t, rp.dir)
	c := startNemesisCluster(t, rp, etcdBin, 1)
	setup := time.Since(begin)

	shardsOf := map[uint32][]int{}
	for g := range keysGroups {
		s := kvroute.Shard(keysKey(g, 0), nemesisShards)
		if kvroute.Shard(keysKey(g, 1), nemesisShards) != s {
			t.Fatalf("keys of group %d in two shards", g)
		}
		shardsOf[s] = append(shardsOf[s], g)
	}
	if len(shardsOf) != nemesisShards {
		t.Fatalf("the groups lie in shards %v, want all %d", shardsOf, nemesisShards)
	}

	h := &keysHistory{start: time.Now(), epochs: newEpochTracker()}
	rng := rand.New(rand.NewPCG(seed, 0x6b6579))
	procs := &keysProcs{t: t, c: c}
	procs.restart("start")
	defer procs.close()
	var workers sync.WaitGroup
	var stop atomic.Bool
	for w := range keysWorkers {
		wk := &keysWorker{id: w, h: h, procs: procs, rng: rand.New(rand.NewPCG(seed, uint64(w)))}
		workers.Go(func() { wk.run(t, &stop) })
	}
	stopWorkers := func() {
		stop.Store(true)
		workers.Wait()
	}
	defer stopWorkers()

	// Every kill is followed by a fault that leaves the deposed leader
	// running, reachable by the clients, so that a read it should no
	// longer answer could be: paused past its lease, or cut from etcd.
	var faults []string
	for k := range kills {
		faults = append(faults, faultKillLeader, []string{faultPauseLeader, faultCutLeaderEtcd}[k%2])
	}
	h.waitAnswers(t, 100)
	var took []time.Duration
	for i, kind := range faults {
		procs.restart(fmt.Sprintf("before fault %d", i+1))
		h.waitAnswers(t, 50)
		term := c.term()
		at := time.Now()
		c.inject(kind, term, rng, h.epochs)
		e, first, _ := h.epochs.firstAbove(term.Epoch)
		took = append(took, first.Sub(at))
		c.waitReady()
		procs.restart(fmt.Sprintf("after fault %d", i+1))
		h.waitAnswers(t, 50)
		t.Logf("fault %d: %s (%s led epoch %d); epoch %d answered a write %v after it; the cluster ready again after %v",
			i+1, kind, term.ID, term.Epoch, e, first.Sub(at).Round(time.Millisecond), time.Since(at).Round(time.Millisecond))
	}
	stopWorkers()
	run := time.Since(begin) - setup

	// A new client process answers every request the earlier ones were
	// never told of, with the same request ID: it takes effect now, or
	// replays what an earlier attempt did — once either way.
	procs.restart("the end")
	resolver, gen := procs.current()
	unanswered := 0
	for _, op := range h.ops() {
		if op.get || op.answered() {
			continue
		}
		unanswered++
		deadline := time.Now().Add(nemesisRecoveryLimit)
		for !op.answered() {
			err := h.txn(resolver, op, gen)
			if errors.Is(err, errKeysAnswer) {
				t.Fatal(err)
			}
			if err != nil && time.Now().After(deadline) {
				t.Fatalf("request %s unanswered after %v: %v", op.id, nemesisRecoveryLimit, err)
			}
		}
	}

	// A brand-new client process reads every key; its Gets join the
	// history, and a Range over every shard must agree.
	want := h.expected()
	reader := c.keysClient(keysPrincipal, 20*time.Second)
	defer reader.Close()
	ctx := context.Background()
	for g := range keysGroups {
		for k := range 2 {
			op := h.get(reader, keysWorkers, g, k)
			if op == nil {
				t.Fatalf("the final read of %s failed", keysKey(g, k))
			}
			if got, w := op.vals[k], want[g][k]; got != w || op.found != (w > 0) {
				t.Errorf("%s: a new client reads %d (found %v), want %d: the distinct add requests that touched it",
					keysKey(g, k), got, op.found, w)
			}
		}
	}
	kvs, more, err := reader.Range(ctx, nil, 0)
	must(t, err)
	if more {
		t.Fatalf("Range of every key: more than one page")
	}
	got := map[string]int64{}
	for _, r := range kvs {
		got[string(r.Key)] = keysCounter(t, string(r.Key), r.Value)
	}
	checkKeysStore(t, "Range by a new client", got, want)

	// Every member's replica: a barrier in every shard that every member
	// acknowledges, then the nodes stop, and each store is read.
	for s, gs := range shardsOf {
		untilAcked(t, fmt.Sprintf("shard %d", s), func() error {
			_, err := reader.Txn(ctx, fmt.Sprintf("barrier-%d", s), client.Txn{Then: []client.TxnOp{
				client.OpPut([]byte(fmt.Sprintf("{g%d}/barrier", gs[0])), []byte("x"))}}, client.WithAck(client.AckAll))
			return err
		})
	}
	c.stopNodes(t)
	for _, id := range c.ids {
		checkKeysStore(t, "member "+id, replicaKeys(t, filepath.Join(c.dir, id, node.ReplicaDirName), nemesisShards), want)
	}

	checkedAt := time.Now()
	st := h.checkAnswers(t, want)
	h.checkEpochsGrow(t)
	h.checkLinearizable(t)
	t.Logf("%d distinct add requests (%d on two keys), %d gets, over %d client processes; %d calls ended with the outcome "+
		"unknown, %d cut by a client restart (closed), %d unavailable; %d requests answered by a later client process than the one that sent "+
		"them, %d answered as replays, %d still unanswered when the workers stopped; failover (fault → first write answered at a higher epoch) %s; "+
		"setup %v, run %v, checks %v (porcupine %v)",
		st.adds, st.pairs, st.gets, procs.generation()+1, h.unknown.Load(), h.closed.Load(), h.unavailable.Load(), st.carried,
		st.replayed, unanswered, durationStats(took), setup.Round(time.Second), run.Round(time.Second),
		time.Since(checkedAt).Round(time.Millisecond), h.porcupineTook.Round(time.Millisecond))
}

// keysClient is a client process of principal with its own connections and
// sessions, to every member, with a RetryTimeout of budget.
func (c *nemesisCluster) keysClient(principal string, budget time.Duration) *client.Client {
	certs := filepath.Join(c.dir, "certs")
	tlsCfg, err := grpctransport.LoadClientTLS(filepath.Join(certs, pki.FileCA), filepath.Join(certs, "client-"+principal+".pem"),
		filepath.Join(certs, "client-"+principal+"-key.pem"))
	must(c.t, err)
	var addrs []string
	for _, id := range c.ids {
		addrs = append(addrs, c.listen[id])
	}
	cl, err := client.New(&client.Options{Addrs: addrs, TLS: tlsCfg, Attempts: 200, RetryTimeout: budget,
		AttemptTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	must(c.t, err)
	return cl
}

// keysProcs is the principal's current client process: restart closes it
// (cutting its calls in flight) and starts another.
type keysProcs struct {
	t   *testing.T
	c   *nemesisCluster
	mu  sync.Mutex
	cl  *client.Client
	gen int
}

func (p *keysProcs) restart(why string) {
	cl := p.c.keysClient(keysPrincipal, keysBudget)
	p.mu.Lock()
	old := p.cl
	p.cl = cl
	if old != nil {
		p.gen++
	}
	p.mu.Unlock()
	if old != nil {
		_ = old.Close()
		p.t.Logf("client process %d started (%s)", p.generation(), why)
	}
}

// current is the current client process and its number.
func (p *keysProcs) current() (*client.Client, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cl, p.gen
}

func (p *keysProcs) generation() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gen
}

func (p *keysProcs) close() {
	cl, _ := p.current()
	_ = cl.Close()
}

// keysOp is one operation of the history: a Txn (one request ID, however
// many calls it took) or a Get.
type keysOp struct {
	id     string // a Txn's request ID
	get    bool
	group  int
	mask   uint8 // Txn: bit k set when it adds 1 to key k; Get: 1 << the key read
	gen    int   // the client process that first sent it
	worker int   // the worker (keysWorkers: the final reader), for the visualization

	// Set once answered (under keysHistory.mu).
	call, ret  int64    // nanoseconds since the history's start: the first call, the final answer
	vals       [2]int64 // Txn: the new counter of each key it added to; Get: [key] the value
	found      bool     // Get: the key exists
	replayed   bool     // the final answer was a replay
	epoch      uint64   // the epoch of the final answer
	answeredBy int      // the client process that got the final answer
	done       atomic.Bool
	next       time.Time // a pending Txn: not retried before then
}

func (o *keysOp) answered() bool { return o.done.Load() }

// keysHistory records every operation and the epochs writes were answered
// at.
type keysHistory struct {
	start time.Time
	mu    sync.Mutex
	all   []*keysOp
	ids   int
	// the first time each epoch answered a write
	epochs *epochTracker

	answers, unknown, closed, unavailable atomic.Int64
	porcupineTook                         time.Duration
}

func (h *keysHistory) now() int64 { return int64(time.Since(h.start)) }

func (h *keysHistory) ops() []*keysOp {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.all)
}

func (h *keysHistory) add(op *keysOp) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !op.get {
		op.id = fmt.Sprintf("add-%05d", h.ids)
		h.ids++
	}
	h.all = append(h.all, op)
}

// errKeysAnswer is an answer no request of the workload may get (a
// rejection, a refusal, a conflict, a malformed result): the test fails.
var errKeysAnswer = errors.New("an answer the workload must not get")

// txn sends op (a new request, or a pending one again under its request
// ID) through cl, the client process gen, and records the answer; nil when
// answered.
func (h *keysHistory) txn(cl *client.Client, op *keysOp, gen int) error {
	var then []client.TxnOp
	for k := range 2 {
		if op.mask&(1<<k) != 0 {
			then = append(then, client.OpAdd(keysKey(op.group, k), 1))
		}
	}
	call := h.now()
	res, err := cl.Txn(context.Background(), op.id, client.Txn{Then: then}, client.WithAction("add"))
	ret := h.now()
	switch {
	case err == nil:
	case errors.Is(err, client.ErrClosed):
		h.closed.Add(1)
	case errors.Is(err, client.ErrOutcomeUnknown):
		h.unknown.Add(1)
	case errors.Is(err, client.ErrUnavailable):
		h.unavailable.Add(1)
	default:
		// Rejected, refused, conflict, denied: no answer this workload
		// may get.
		return fmt.Errorf("%w: request %s: %w", errKeysAnswer, op.id, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if op.call == 0 {
		op.call = call
	}
	if err != nil {
		op.next = time.Now().Add(200 * time.Millisecond)
		return err
	}
	if !res.Succeeded || len(res.Ops) != len(then) {
		return fmt.Errorf("%w: request %s: %+v, want the Then branch's %d ops", errKeysAnswer, op.id, res, len(then))
	}
	i := 0
	for k := range 2 {
		if op.mask&(1<<k) != 0 {
			if len(res.Ops[i].Value) != 8 {
				return fmt.Errorf("%w: request %s: op %d answered %x, not a counter", errKeysAnswer, op.id, i, res.Ops[i].Value)
			}
			op.vals[k] = int64(binary.LittleEndian.Uint64(res.Ops[i].Value))
			i++
		}
	}
	op.ret, op.replayed, op.answeredBy, op.epoch = ret, res.Replayed, gen, res.Epoch
	h.epochs.mu.Lock()
	if _, ok := h.epochs.first[res.Epoch]; !ok {
		h.epochs.first[res.Epoch] = time.Now()
	}
	h.epochs.mu.Unlock()
	op.done.Store(true)
	h.answers.Add(1)
	return nil
}

// get reads key k of group g through cl for worker w and records it; nil
// if the read failed (it took no effect: left out of the history).
func (h *keysHistory) get(cl *client.Client, w, g, k int) *keysOp {
	op := &keysOp{get: true, group: g, mask: 1 << k, worker: w}
	op.call = h.now()
	kv, found, err := cl.Get(context.Background(), keysKey(g, k))
	op.ret = h.now()
	if err != nil {
		return nil
	}
	op.found = found
	if found {
		if len(kv.Value) != 8 {
			// Not a counter: an answer the model cannot hold, so it
			// fails porcupine.
			op.vals[k] = -1
		} else {
			op.vals[k] = int64(binary.LittleEndian.Uint64(kv.Value))
		}
	}
	op.done.Store(true)
	h.add(op)
	return op
}

// waitAnswers waits for n more answered Txns: the writes go on.
func (h *keysHistory) waitAnswers(t *testing.T, n int64) {
	t.Helper()
	want := h.answers.Load() + n
	deadline := time.Now().Add(nemesisRecoveryLimit)
	for h.answers.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes answered after %v, want %d: the writes stopped", h.answers.Load(), nemesisRecoveryLimit, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// expected is each key's counter: the number of distinct add requests
// that touched it (every one answered, so every one applied).
func (h *keysHistory) expected() [keysGroups][2]int64 {
	var want [keysGroups][2]int64
	for _, op := range h.ops() {
		if op.get {
			continue
		}
		for k := range 2 {
			if op.mask&(1<<k) != 0 {
				want[op.group][k]++
			}
		}
	}
	return want
}

type keysStats struct{ adds, pairs, gets, carried, replayed int }

// checkAnswers: the adds that touched a key answered the values 1..n, each
// exactly once (none lost, none applied twice, a replay answering the
// recorded value).
func (h *keysHistory) checkAnswers(t *testing.T, want [keysGroups][2]int64) keysStats {
	t.Helper()
	var st keysStats
	seen := map[string]string{} // key/value → the request that answered it
	for _, op := range h.ops() {
		if op.get {
			st.gets++
			continue
		}
		st.adds++
		if op.mask == 3 {
			st.pairs++
		}
		if op.answeredBy != op.gen {
			st.carried++
		}
		if op.replayed {
			st.replayed++
		}
		for k := range 2 {
			if op.mask&(1<<k) == 0 {
				continue
			}
			key := string(keysKey(op.group, k))
			v := op.vals[k]
			if v < 1 || v > want[op.group][k] {
				t.Errorf("request %s answered %s = %d, outside 1..%d (the distinct adds to it)", op.id, key, v, want[op.group][k])
			}
			at := fmt.Sprintf("%s=%d", key, v)
			if other, ok := seen[at]; ok {
				t.Errorf("requests %s and %s both answered %s: an add applied twice, or one lost", other, op.id, at)
			}
			seen[at] = op.id
		}
	}
	return st
}

// checkEpochsGrow: no write is answered at an epoch below one answered
// before it was first sent — once a successor has answered, a deposed
// leader (paused, cut from etcd) answers nothing.
func (h *keysHistory) checkEpochsGrow(t *testing.T) {
	t.Helper()
	var adds []*keysOp
	for _, op := range h.ops() {
		if !op.get {
			adds = append(adds, op)
		}
	}
	byRet := slices.Clone(adds)
	slices.SortFunc(byRet, func(a, b *keysOp) int { return cmp.Compare(a.ret, b.ret) })
	slices.SortFunc(adds, func(a, b *keysOp) int { return cmp.Compare(a.call, b.call) })
	var high *keysOp // the highest epoch among the answers returned so far
	j := 0
	for _, op := range adds {
		for ; j < len(byRet) && byRet[j].ret < op.call; j++ {
			if high == nil || byRet[j].epoch > high.epoch {
				high = byRet[j]
			}
		}
		if high != nil && op.epoch < high.epoch {
			t.Errorf("request %s was answered at epoch %d, sent after request %s had been answered at epoch %d: a deposed leader answered",
				op.id, op.epoch, high.id, high.epoch)
		}
	}
}

// checkKeysStore compares the counters a store or read holds with want.
func checkKeysStore(t *testing.T, where string, got map[string]int64, want [keysGroups][2]int64) {
	t.Helper()
	for g := range keysGroups {
		for k := range 2 {
			key := string(keysKey(g, k))
			v, ok := got[key]
			if want[g][k] == 0 {
				if ok {
					t.Errorf("%s: %s = %d, but no add touched it", where, key, v)
				}
				continue
			}
			if v != want[g][k] {
				t.Errorf("%s: %s = %d (present %v), want %d: the distinct add requests that touched it", where, key, v, ok, want[g][k])
			}
		}
	}
	for key := range got {
		if !strings.HasSuffix(key, "/a") && !strings.HasSuffix(key, "/b") && !strings.HasSuffix(key, "/barrier") {
			t.Errorf("%s: unexpected key %q", where, key)
		}
	}
}

// checkLinearizable runs porcupine over every Txn and Get, partitioned by
// hash tag group; an illegal history is written out as a visualization.
func (h *keysHistory) checkLinearizable(t *testing.T) {
	t.Helper()
	var ops []porcupine.Operation
	for _, op := range h.ops() {
		out := keysOut{vals: op.vals, found: op.found}
		ret := op.ret
		if !op.answered() {
			// Never answered: it may have applied, at any time after
			// its call.
			out, ret = keysOut{unknown: true}, math.MaxInt64
		}
		ops = append(ops, porcupine.Operation{ClientId: op.worker, Input: keysIn{id: op.id, group: op.group, get: op.get, mask: op.mask},
			Output: out, Call: op.call, Return: ret})
	}
	at := time.Now()
	res, info := porcupine.CheckOperationsVerbose(keysModel, ops, 2*time.Minute)
	h.porcupineTook = time.Since(at)
	if res == porcupine.Ok {
		return
	}
	dir := os.Getenv("ONCEWAL_ARTIFACTS")
	if dir == "" {
		var err error
		dir, err = os.MkdirTemp("", "oncewal-keys-porcupine-")
		must(t, err)
	}
	path := filepath.Join(dir, "keys-linearizability.html")
	if err := porcupine.VisualizePath(keysModel, info, path); err != nil {
		t.Errorf("writing the visualization: %v", err)
	}
	t.Fatalf("porcupine: the history of %d operations is %s against per-key counters; visualization: %s", len(ops), res, path)
}

// keysIn and keysOut are a porcupine operation of the counter model: a Txn
// adding 1 to the keys of mask, answered with their new values (unknown:
// never answered, it may have applied), or a Get of one key, answered with
// its value and whether it exists.
type (
	keysIn struct {
		id    string
		group int
		get   bool
		mask  uint8
	}
	keysOut struct {
		unknown bool
		vals    [2]int64
		found   bool
	}
)

// keysModel is one hash tag group's two counters, absent (0) at first: an
// add of 1 to some of them answers each one's new value; a get answers the
// key's value and whether it exists (it does once anything added to it).
var keysModel = porcupine.Model{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		by := make([][]porcupine.Operation, keysGroups)
		for _, op := range ops {
			g := op.Input.(keysIn).group
			by[g] = append(by[g], op)
		}
		return slices.DeleteFunc(by, func(p []porcupine.Operation) bool { return len(p) == 0 })
	},
	Init: func() any { return [2]int64{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.([2]int64), input.(keysIn), output.(keysOut)
		if in.get {
			k := 0
			if in.mask == 2 {
				k = 1
			}
			return out.found == (s[k] > 0) && out.vals[k] == s[k], s
		}
		for k := range 2 {
			if in.mask&(1<<k) != 0 {
				s[k]++
				if !out.unknown && out.vals[k] != s[k] {
					return false, state
				}
			}
		}
		return true, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(keysIn), output.(keysOut)
		if in.get {
			k := 0
			if in.mask == 2 {
				k = 1
			}
			if !out.found {
				return fmt.Sprintf("get %s → absent", keysKey(in.group, k))
			}
			return fmt.Sprintf("get %s → %d", keysKey(in.group, k), out.vals[k])
		}
		var parts []string
		for k := range 2 {
			if in.mask&(1<<k) != 0 {
				if out.unknown {
					parts = append(parts, fmt.Sprintf("%s+1 → ?", keysKey(in.group, k)))
				} else {
					parts = append(parts, fmt.Sprintf("%s+1 → %d", keysKey(in.group, k), out.vals[k]))
				}
			}
		}
		return in.id + ": " + strings.Join(parts, ", ")
	},
	DescribeState: func(state any) string {
		s := state.([2]int64)
		return fmt.Sprintf("a=%d b=%d", s[0], s[1])
	},
}

// keysWorker is one sequence of requests: adds with new request IDs (70%)
// and gets (30%); a request left unanswered is retried, under its request
// ID, once due, before anything new.
type keysWorker struct {
	id      int
	h       *keysHistory
	procs   *keysProcs
	rng     *rand.Rand
	pending []*keysOp
}

func (w *keysWorker) run(t *testing.T, stop *atomic.Bool) {
	for !stop.Load() {
		cl, gen := w.procs.current()
		var err error
		if i := slices.IndexFunc(w.pending, func(op *keysOp) bool { return time.Now().After(op.next) }); i >= 0 {
			op := w.pending[i]
			if err = w.h.txn(cl, op, gen); err == nil {
				w.pending = slices.Delete(w.pending, i, i+1)
			}
		} else if g := w.rng.IntN(keysGroups); w.rng.IntN(10) < 3 {
			w.h.get(cl, w.id, g, w.rng.IntN(2))
		} else {
			op := &keysOp{group: g, mask: uint8(1 + w.rng.IntN(3)), gen: gen, worker: w.id}
			w.h.add(op)
			if err = w.h.txn(cl, op, gen); err != nil {
				w.pending = append(w.pending, op)
			}
		}
		if errors.Is(err, errKeysAnswer) {
			t.Errorf("worker %d: %v", w.id, err)
			return
		}
	}
}

// replicaKeys reads the principal's counters from a stopped node's
// replica (package kv's rows, under keyspace.KV).
func replicaKeys(t *testing.T, replica string, shards int) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
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
			scoped, ok := strings.CutPrefix(k, keyspace.KV)
			if !ok {
				continue
			}
			principal, key, err := kv.SplitScoped([]byte(scoped))
			must(t, err)
			if principal != keysPrincipal {
				t.Errorf("%s: a key of principal %q", d, principal)
				continue
			}
			row, err := kv.DecodeRow([]byte(v))
			must(t, err)
			if strings.HasSuffix(string(key), "/barrier") {
				out[string(key)] = 0
				continue
			}
			out[string(key)] = keysCounter(t, d+" "+string(key), row.Value)
		}
	}
	return out
}

func keysCounter(t *testing.T, where string, v []byte) int64 {
	t.Helper()
	if strings.HasSuffix(where, "/barrier") {
		return 0
	}
	if len(v) != 8 {
		t.Fatalf("%s: %x is not a counter", where, v)
	}
	return int64(binary.LittleEndian.Uint64(v))
}

// TestKeysModelCatchesViolations: the counter model of
// TestRealProcessesKeysOutliveFailover is not vacuous. A sequential
// history passes, and so do concurrent adds answered in either order and
// an add never answered (it may have applied); an add applied twice (two
// answers of one value), an add lost (a value skipped, then read), a stale
// read after an acknowledged add, and a two-key add whose keys disagree
// with the reads fail; each history can be visualized.
func TestKeysModelCatchesViolations(t *testing.T) {
	add := func(id string, mask uint8, call, ret int64, a, b int64) porcupine.Operation {
		return porcupine.Operation{Input: keysIn{id: id, mask: mask}, Output: keysOut{vals: [2]int64{a, b}}, Call: call, Return: ret}
	}
	get := func(k int, call, ret int64, v int64) porcupine.Operation {
		var vals [2]int64
		vals[k] = v
		return porcupine.Operation{Input: keysIn{get: true, mask: 1 << k}, Output: keysOut{vals: vals, found: v > 0}, Call: call, Return: ret}
	}
	unknown := porcupine.Operation{Input: keysIn{id: "u", mask: 1}, Output: keysOut{unknown: true}, Call: 1, Return: math.MaxInt64}
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"sequential", []porcupine.Operation{get(0, 0, 1, 0), add("1", 1, 2, 3, 1, 0), add("2", 3, 4, 5, 2, 1), get(0, 6, 7, 2), get(1, 6, 7, 1)}, porcupine.Ok},
		{"concurrent adds", []porcupine.Operation{add("1", 1, 0, 10, 2, 0), add("2", 1, 1, 9, 1, 0), get(0, 11, 12, 2)}, porcupine.Ok},
		{"never answered", []porcupine.Operation{add("1", 1, 0, 1, 1, 0), unknown, get(0, 2, 3, 1), get(0, 4, 5, 2)}, porcupine.Ok},
		{"applied twice", []porcupine.Operation{add("1", 1, 0, 1, 1, 0), add("2", 1, 2, 3, 1, 0)}, porcupine.Illegal},
		{"lost", []porcupine.Operation{add("1", 1, 0, 1, 1, 0), add("2", 1, 2, 3, 3, 0)}, porcupine.Illegal},
		{"stale read", []porcupine.Operation{add("1", 1, 0, 1, 1, 0), add("2", 1, 2, 3, 2, 0), get(0, 4, 5, 1)}, porcupine.Illegal},
		{"absent after add", []porcupine.Operation{add("1", 2, 0, 1, 0, 1), get(1, 2, 3, 0)}, porcupine.Illegal},
		{"two keys apart", []porcupine.Operation{add("1", 3, 0, 1, 1, 1), add("2", 1, 2, 3, 2, 0), get(1, 4, 5, 2)}, porcupine.Illegal},
	} {
		got, info := porcupine.CheckOperationsVerbose(keysModel, tc.ops, 10*time.Second)
		if got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
		// What a failing run writes out.
		path := filepath.Join(t.TempDir(), "keys.html")
		must(t, porcupine.VisualizePath(keysModel, info, path))
		if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
			t.Errorf("%s: no visualization: %v", tc.name, err)
		}
	}
}

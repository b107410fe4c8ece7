package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
	"google.golang.org/grpc/backoff"
)

// autoConfig is what demo --auto-failover runs.
type autoConfig struct {
	root    string
	etcd    []string // empty: coord.Memory in process
	ttl     time.Duration
	kills   int
	pauses  int
	clients int
	shards  int
	seed    uint64
	asJSON  bool
	verbose io.Writer // the nodes' log lines go here (nil: nowhere)
}

// autoMembers are the demo's three nodes.
var autoMembers = []string{"n1", "n2", "n3"}

// autoWait bounds every wait of the demo (an election, a catch-up, the
// final checks): far above a failover at the longest TTL the flags allow, so
// that a demo that hangs fails instead.
func autoWait(ttl time.Duration) time.Duration { return 6*ttl + 30*time.Second }

// autoReport is demo --auto-failover --json.
type autoReport struct {
	Verified    bool            `json:"verified"`
	Error       string          `json:"error,omitempty"`
	Seed        uint64          `json:"seed"`
	Coordinator string          `json:"coordinator"`
	LeaseTTLSec float64         `json:"lease_ttl_s"`
	Shards      int             `json:"shards"`
	Failovers   []autoFailover  `json:"failovers"`
	FailoverMin float64         `json:"failover_min_s"`
	FailoverMed float64         `json:"failover_median_s"`
	FailoverMax float64         `json:"failover_max_s"`
	Requests    int             `json:"requests"`
	Acked       int             `json:"acknowledged"`
	Unknown     int             `json:"outcome_unknown"`
	Retries     int             `json:"retries"`
	LongestSec  float64         `json:"longest_request_s"`
	Replayed    int             `json:"retries_replayed"`
	Replicas    []autoReplica   `json:"replicas"`
	Seconds     float64         `json:"seconds"`
	Elections   []autoElection  `json:"elections"`
	Problems    []string        `json:"problems,omitempty"`
	Zombie      []autoZombieRun `json:"deposed_writes,omitempty"`
}

// autoElection is one term the demo saw a node lead.
type autoElection struct {
	AtSec  float64 `json:"at_s"`
	Leader string  `json:"leader"`
	Epoch  uint64  `json:"epoch"`
}

// autoFailover is one fault of the leader and what followed.
type autoFailover struct {
	Fault       string  `json:"fault"` // kill | pause
	Leader      string  `json:"leader"`
	Epoch       uint64  `json:"epoch"`
	AtSec       float64 `json:"at_s"`
	Successor   string  `json:"successor"`
	NewEpoch    uint64  `json:"new_epoch"`
	ElectedSec  float64 `json:"elected_after_s"`
	FailoverSec float64 `json:"failover_s"` // leader gone → first write acknowledged by the successor
}

// autoZombieRun is a write the paused (deposed) leader logged after its
// successor was elected: it must not be acknowledged.
type autoZombieRun struct {
	Leader       string `json:"leader"`
	Epoch        uint64 `json:"epoch"`
	Acknowledged bool   `json:"acknowledged"`
	Why          string `json:"why"`
}

// autoReplica is one node's replica at the end.
type autoReplica struct {
	ID         string `json:"id"`
	Counters   int    `json:"counters"`
	Missing    int    `json:"missing"`
	Duplicated int    `json:"applied_twice"`
	Verified   bool   `json:"verified"`
}

// autoMember is one node of the demo and what runs it.
type autoMember struct {
	id, addr, dir string
	view          *faultView
	n             *node.Node
	g             *node.GRPC
	stop          context.CancelFunc
	done          chan error
	closeCoord    func()
	stopOnce      sync.Once
	stopErr       error
}

// autoCluster is the demo's three nodes on one coordinator.
type autoCluster struct {
	cfg     autoConfig
	cluster string
	mem     *coord.Memory // nil on etcd
	admin   coord.Coordinator
	log     *slog.Logger
	relays  []*etcdRelay
	mu      sync.Mutex
	members map[string]*autoMember
	start   time.Time
}

func (c *autoCluster) since() float64 { return time.Since(c.start).Seconds() }

// coordFor makes the coordinator a new incarnation of a member runs on:
// the shared Memory, or its own etcd client through relays the demo can cut.
func (c *autoCluster) coordFor() (*faultView, func(), error) {
	if c.mem != nil {
		return newFaultView(c.mem, expireAtDeadline(c.mem)), func() {}, nil
	}
	var relays []*etcdRelay
	var urls []string
	for _, ep := range c.cfg.etcd {
		target, err := relayTarget(ep)
		if err != nil {
			return nil, nil, err
		}
		r, err := newEtcdRelay(target)
		if err != nil {
			return nil, nil, err
		}
		relays = append(relays, r)
		urls = append(urls, r.URL())
	}
	c.relays = append(c.relays, relays...)
	e, err := coord.NewEtcd(&coord.EtcdOptions{Endpoints: urls, LeaseTTL: c.cfg.ttl, Logger: c.log})
	if err != nil {
		return nil, nil, err
	}
	cut := func(_ []coord.Leadership, cut bool) {
		for _, r := range relays {
			r.setCut(cut)
		}
	}
	return newFaultView(e, cut), func() { _ = e.Close() }, nil
}

// startMember opens and runs a member on its directory.
func (c *autoCluster) startMember(id, addr string) error {
	view, closeCoord, err := c.coordFor()
	if err != nil {
		return err
	}
	g, err := node.NewGRPC(&node.GRPCOptions{Listen: addr, Insecure: true, Logger: c.log})
	if err != nil {
		closeCoord()
		return err
	}
	quietStore := store.Options{Logger: c.log}
	n, err := node.Open(&node.Options{Coordinator: view, Cluster: c.cluster, ID: id, Dir: filepath.Join(c.cfg.root, id),
		Shards: c.cfg.shards, Addr: addr, Transport: g, Logger: c.log,
		Leader:   leader.Options{Store: quietStore},
		Follower: follower.NodeOptions{Follower: follower.Options{Store: quietStore}}})
	if err != nil {
		_ = g.Close()
		closeCoord()
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	m := &autoMember{id: id, addr: addr, dir: filepath.Join(c.cfg.root, id), view: view, n: n, g: g, stop: stop, done: make(chan error, 1), closeCoord: closeCoord}
	go func() { m.done <- n.Run(ctx) }()
	c.mu.Lock()
	c.members[id] = m
	c.mu.Unlock()
	return nil
}

// stopMember ends a member's Run and releases what it holds, once (a
// failed demo stops everything, a killed member included). A killed member
// is deaf first, so its resignation never reaches the coordinator.
func (c *autoCluster) stopMember(m *autoMember) error {
	m.stopOnce.Do(func() {
		m.stop()
		select {
		case m.stopErr = <-m.done:
		case <-time.After(autoWait(c.cfg.ttl)):
			m.stopErr = fmt.Errorf("node %s: Run did not return within %v of its stop", m.id, autoWait(c.cfg.ttl))
			return
		}
		m.stopErr = errors.Join(m.stopErr, m.n.Close(), m.g.Close())
		m.closeCoord()
	})
	return m.stopErr
}

func (c *autoCluster) member(id string) *autoMember {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[id]
}

// leading returns the member that leads at an epoch above after (but not
// except), with its leader, once there is one.
func (c *autoCluster) leading(ctx context.Context, except string, after uint64) (string, uint64, *leader.Leader, error) {
	for {
		c.mu.Lock()
		for _, id := range autoMembers {
			m := c.members[id]
			if m == nil || id == except {
				continue
			}
			st := m.n.Status()
			if l, err := m.n.Leader(); err == nil && st.Role == node.RoleLeader && st.Epoch > after {
				c.mu.Unlock()
				return id, st.Epoch, l, nil
			}
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", 0, nil, fmt.Errorf("no node but %q led above epoch %d: %w", except, after, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// autoAck is one client request's last answer.
type autoAck struct {
	acked bool
	epoch uint64
}

// autoWriters are the demo's clients: each submits requests one after
// another under its own principal, each request adding 1 to a counter named
// after its ID, and sends every tenth answered request again with its ID, as
// after a lost answer (it must be answered Replay).
type autoWriters struct {
	clients []*client.Client
	mu      sync.Mutex
	reqs    []map[string]*autoAck // per client, by request ID
	probes  int                   // probe's requests so far
	retries int
	replays int
	longest time.Duration // the longest answered request
	bad     []string
	wg      sync.WaitGroup
	cancel  context.CancelFunc
}

func autoCounter(id string) []byte { return []byte("ctr/" + id) }

func (w *autoWriters) run(ctx context.Context, i int) {
	defer w.wg.Done()
	c := w.clients[i]
	for seq := 1; ctx.Err() == nil; seq++ {
		id := fmt.Sprintf("c%d-%06d", i, seq)
		a := &autoAck{}
		w.mu.Lock()
		w.reqs[i][id] = a
		w.mu.Unlock()
		start := time.Now()
		r, err := c.Submit(ctx, id, client.Ops(client.Add(autoCounter(id), 1)))
		if err != nil {
			continue // its outcome is settled by the final retry of every request
		}
		now := time.Now()
		w.mu.Lock()
		a.acked, a.epoch = true, r.Epoch
		w.longest = max(w.longest, now.Sub(start))
		w.mu.Unlock()
		if seq%10 == 0 {
			r2, err := c.Submit(ctx, id, client.Ops(client.Add(autoCounter(id), 1)))
			w.mu.Lock()
			if err == nil {
				w.retries++
				if r2.Replayed {
					w.replays++
				} else {
					w.bad = append(w.bad, fmt.Sprintf("the retry of %s ran it again (epoch %d)", id, r2.Epoch))
				}
			}
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// probe measures a failover from the clients' side: it sends fresh
// requests, each under a new ID and for at most probeBudget, until one is
// answered at an epoch above e, and returns when. A fresh ID per try, because
// the clients' own requests in flight at a kill may wait on the successor for
// their claim's lease (the claim was logged and shipped, the outcome not:
// idempotency.DefaultLease, 1 min), which is that request's wait, not the
// cluster's. Its requests are settled and checked as every other client's.
func (w *autoWriters) probe(ctx context.Context, e uint64) (time.Time, error) {
	p := len(w.clients) - 1
	for {
		w.probes++
		id := fmt.Sprintf("probe-%06d", w.probes)
		a := &autoAck{}
		w.mu.Lock()
		w.reqs[p][id] = a
		w.mu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, probeBudget)
		r, err := w.clients[p].Submit(pctx, id, client.Ops(client.Add(autoCounter(id), 1)))
		cancel()
		if ctx.Err() != nil {
			return time.Time{}, fmt.Errorf("no write acknowledged above epoch %d: %w", e, ctx.Err())
		}
		if err != nil {
			continue
		}
		now := time.Now()
		w.mu.Lock()
		a.acked, a.epoch = true, r.Epoch
		w.mu.Unlock()
		if r.Epoch > e {
			return now, nil
		}
	}
}

// probeBudget bounds one try of probe: an attempt that lands on the
// deposed leader waits out the clients' 1 s AttemptTimeout, then the
// client moves on.
const probeBudget = 2 * time.Second

func runAutoFailoverDemo(cfg autoConfig, stdout, stderr io.Writer) int {
	rep, err := runAuto(cfg, stdout)
	switch {
	case err != nil:
		rep.Verified = false
		rep.Error = err.Error()
	case !rep.Verified:
		rep.Error = strings.Join(rep.Problems, "; ")
	}
	if cfg.asJSON {
		_ = writeJSONReport(stdout, rep)
	} else {
		printAuto(stdout, &rep)
	}
	if !rep.Verified {
		if err != nil {
			fmt.Fprintln(stderr, "oncewal demo:", err)
		}
		return exitFailure
	}
	return exitOK
}

func freeLoopback() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// runAuto runs the demo: the nodes, the clients, the faults, the
// checks. Narration goes to out unless cfg.asJSON.
func runAuto(cfg autoConfig, out io.Writer) (autoReport, error) {
	rep := autoReport{Seed: cfg.seed, LeaseTTLSec: cfg.ttl.Seconds(), Shards: cfg.shards}
	say := func(format string, args ...any) {
		if !cfg.asJSON {
			fmt.Fprintf(out, format+"\n", args...)
		}
	}
	logger := slog.New(slog.DiscardHandler)
	if cfg.verbose != nil {
		logger = slog.New(slog.NewTextHandler(cfg.verbose, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	c := &autoCluster{cfg: cfg, cluster: fmt.Sprintf("demo-%x", time.Now().UnixNano()), log: logger, members: map[string]*autoMember{}}
	if len(cfg.etcd) == 0 {
		c.mem = coord.NewMemory()
		defer c.mem.Close()
		if err := c.mem.SetTTL(cfg.ttl); err != nil {
			return rep, err
		}
		c.admin = c.mem
		rep.Coordinator = "coord.Memory in process (no etcd; give --etcd ENDPOINTS for a real one)"
	} else {
		e, err := coord.NewEtcd(&coord.EtcdOptions{Endpoints: cfg.etcd, LeaseTTL: cfg.ttl, Logger: logger})
		if err != nil {
			return rep, err
		}
		defer e.Close()
		c.admin = e
		rep.Coordinator = fmt.Sprintf("etcd %s (cluster %s under %s)", strings.Join(cfg.etcd, ","), c.cluster, coord.DefaultPrefix)
	}
	defer func() {
		for _, r := range c.relays {
			r.Close()
		}
	}()
	c.start = time.Now()
	wait := autoWait(cfg.ttl)
	bg := context.Background()
	addrs := map[string]string{}
	var all []string
	for _, id := range autoMembers {
		actx, cancel := context.WithTimeout(bg, wait)
		_, err := node.AddMember(actx, c.admin, c.cluster, id)
		cancel()
		if err != nil {
			return rep, fmt.Errorf("adding member %s: %w", id, err)
		}
		a, err := freeLoopback()
		if err != nil {
			return rep, err
		}
		addrs[id] = a
		all = append(all, a)
	}
	say("oncewal demo --auto-failover: nodes %s on %s, lease TTL %v, %d shard(s);", strings.Join(autoMembers, " "), rep.Coordinator, cfg.ttl, cfg.shards)
	say("%d clients (package client) over gRPC on loopback (plaintext), seed %d\n", cfg.clients, cfg.seed)
	stopped := map[string]bool{}
	defer func() { // on an early return: stop whatever still runs
		for _, id := range autoMembers {
			if m := c.member(id); m != nil && !stopped[id] {
				_ = c.stopMember(m)
			}
		}
	}()
	for _, id := range autoMembers {
		if err := c.startMember(id, addrs[id]); err != nil {
			return rep, fmt.Errorf("starting %s: %w", id, err)
		}
	}
	ctx, cancel := context.WithTimeout(bg, wait)
	lid, epoch, _, err := c.leading(ctx, "", 0)
	cancel()
	if err != nil {
		return rep, err
	}
	rep.Elections = append(rep.Elections, autoElection{AtSec: c.since(), Leader: lid, Epoch: epoch})
	say("  +%6.2fs  %s elected (epoch %d)", c.since(), lid, epoch)

	w := &autoWriters{}
	defer func() {
		for _, cl := range w.clients {
			_ = cl.Close()
		}
	}()
	for i := range cfg.clients + 1 { // the writers, then probe's client
		// Short attempts and backoff: a client stuck on a deposed leader,
		// or waiting out an election, finds the successor within about
		// a second of its first answer, so the failover times measure the
		// cluster more than the client's pacing.
		cl, err := client.New(&client.Options{Addrs: all, Insecure: true, Principal: fmt.Sprintf("demo-%d", i),
			Attempts: 1 << 20, RetryTimeout: wait + idempotency.DefaultLease, AttemptTimeout: time.Second, Logger: logger,
			Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond}})
		if err != nil {
			return rep, err
		}
		w.clients = append(w.clients, cl)
		w.reqs = append(w.reqs, map[string]*autoAck{})
	}
	wctx, stopWriters := context.WithCancel(bg)
	defer stopWriters()
	for i := range cfg.clients {
		w.wg.Add(1)
		go w.run(wctx, i)
	}

	rng := rand.New(rand.NewPCG(cfg.seed, 0x0a17f0))
	faults := slices.Repeat([]string{"kill"}, cfg.kills)
	faults = append(faults, slices.Repeat([]string{"pause"}, cfg.pauses)...)
	rng.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	for k, fault := range faults {
		// Let the clients write a while under the current leader.
		time.Sleep(300*time.Millisecond + time.Duration(rng.IntN(500))*time.Millisecond)
		f, err := c.fault(k+1, fault, lid, epoch, w, say)
		if err != nil {
			return rep, err
		}
		rep.Failovers = append(rep.Failovers, f.autoFailover)
		rep.Elections = append(rep.Elections, autoElection{AtSec: f.AtSec + f.ElectedSec, Leader: f.Successor, Epoch: f.NewEpoch})
		if f.zombie != nil {
			rep.Zombie = append(rep.Zombie, *f.zombie)
			if f.zombie.Acknowledged {
				rep.Problems = append(rep.Problems, fmt.Sprintf("the deposed leader %s had a write acknowledged after %s was elected", f.Leader, f.Successor))
			}
		}
		lid, epoch = f.Successor, f.NewEpoch
	}
	time.Sleep(300 * time.Millisecond)
	stopWriters()
	w.wg.Wait()

	// Settle every request: each is sent once more with its ID. One that
	// was answered must be answered Replay; one whose outcome the client
	// never learned (in flight at a failover, or when the clients
	// stopped) runs now if it never did.
	say("\nchecking: every request sent again with its ID ...")
	// A request in flight at a kill whose claim reached the successor (its
	// outcome did not) runs at once: the successor freed the dead leader's
	// claims when it took over (node, "Requests in flight at a failover").
	sctx, cancel := context.WithTimeout(bg, 2*wait)
	defer cancel()
	for i, reqs := range w.reqs {
		for id, a := range reqs {
			rep.Requests++
			if !a.acked {
				rep.Unknown++
			} else {
				rep.Acked++
			}
			r, err := w.clients[i].Submit(sctx, id, client.Ops(client.Add(autoCounter(id), 1)))
			if err != nil {
				return rep, fmt.Errorf("settling request %s: %w", id, err)
			}
			if a.acked && !r.Replayed {
				rep.Problems = append(rep.Problems, fmt.Sprintf("request %s, answered at epoch %d, ran again at epoch %d", id, a.epoch, r.Epoch))
			}
		}
	}
	rep.Retries, rep.Replayed, rep.LongestSec = w.retries, w.replays, w.longest.Seconds()
	rep.Problems = append(rep.Problems, w.bad...)
	// Every replica must hold everything before the nodes stop.
	_, _, l, err := c.leading(sctx, "", epoch-1)
	if err != nil {
		return rep, err
	}
	if err := l.WaitAcked(sctx, leader.AckAll); err != nil {
		return rep, fmt.Errorf("not every replica caught up with the leader: %w", err)
	}
	for _, id := range autoMembers {
		stopped[id] = true
		if err := c.stopMember(c.member(id)); err != nil {
			return rep, err
		}
	}
	rep.Seconds = c.since()
	rep.Verified = len(rep.Problems) == 0
	for _, id := range autoMembers {
		r, err := c.checkReplica(id, w)
		if err != nil {
			return rep, err
		}
		rep.Replicas = append(rep.Replicas, r)
		if !r.Verified {
			rep.Verified = false
			rep.Problems = append(rep.Problems, fmt.Sprintf("replica %s: %d requests missing, %d applied more than once", id, r.Missing, r.Duplicated))
		}
	}
	var times []float64
	for _, f := range rep.Failovers {
		times = append(times, f.FailoverSec)
	}
	if len(times) > 0 {
		slices.Sort(times)
		rep.FailoverMin, rep.FailoverMed, rep.FailoverMax = times[0], times[len(times)/2], times[len(times)-1]
	}
	return rep, nil
}

// autoFault is a fault's row, and the deposed leader's write of a pause.
type autoFault struct {
	autoFailover
	zombie *autoZombieRun
}

// fault kills or pauses the leader lid, measures the election and the
// failover, and brings the member back.
func (c *autoCluster) fault(k int, fault, lid string, epoch uint64, w *autoWriters, say func(string, ...any)) (autoFault, error) {
	m := c.member(lid)
	f := autoFault{autoFailover: autoFailover{Fault: fault, Leader: lid, Epoch: epoch}}
	zombie, err := m.n.Leader()
	if err != nil {
		return f, fmt.Errorf("%s no longer leads: %w", lid, err)
	}
	t0 := time.Now()
	f.AtSec = c.since()
	m.view.silence()
	stopped := make(chan error, 1)
	switch fault {
	case "kill":
		// Its Run stops; deaf, it resigns nothing: its lease expires.
		go func() { stopped <- c.stopMember(m) }()
		say("  +%6.2fs  fault %d: %s (leader, epoch %d) killed: its Run stopped without resigning; its lease ends a TTL after its last renewal", f.AtSec, k, lid, epoch)
	default:
		say("  +%6.2fs  fault %d: %s (leader, epoch %d) paused: it hears nothing and still believes it leads; its lease ends a TTL after its last renewal", f.AtSec, k, lid, epoch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), autoWait(c.cfg.ttl))
	defer cancel()
	next, nepoch, _, err := c.leading(ctx, lid, epoch)
	if err != nil {
		return f, err
	}
	elected := time.Now()
	acked, err := w.probe(ctx, epoch)
	if err != nil {
		return f, err
	}
	f.Successor, f.NewEpoch = next, nepoch
	f.ElectedSec, f.FailoverSec = elected.Sub(t0).Seconds(), acked.Sub(t0).Seconds()
	say("  +%6.2fs  %s elected (epoch %d) %.2fs after; first write acknowledged by %s %.2fs after the leader went (failover time)",
		c.since(), next, nepoch, f.ElectedSec, next, f.FailoverSec)
	if fault == "pause" {
		f.zombie = deposedWrite(ctx, lid, epoch, nepoch, zombie)
		say("  +%6.2fs  %s, still paused, logs a write of its own: %s", c.since(), lid, f.zombie.Why)
		m.view.hear()
		say("  +%6.2fs  %s resumes: it learns of epoch %d, steps down and follows %s (its replica rebuilt)", c.since(), lid, nepoch, next)
	} else {
		if err := <-stopped; err != nil {
			return f, fmt.Errorf("killing %s: %w", lid, err)
		}
		if err := c.startMember(lid, m.addr); err != nil {
			return f, fmt.Errorf("restarting %s: %w", lid, err)
		}
		say("  +%6.2fs  %s restarted: it follows %s (its replica rebuilt)", c.since(), lid, next)
	}
	// Everything on every replica again before the next fault.
	_, _, l, err := c.leading(ctx, "", nepoch-1)
	if err != nil {
		return f, err
	}
	// The restarted member rebuilds its replica before it acknowledges,
	// which on a busy machine can outlast one AckTimeout: wait on until
	// this fault's deadline.
	for {
		err = l.WaitAcked(ctx, leader.AckAll)
		if !errors.Is(err, leader.ErrAckTimeout) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return f, fmt.Errorf("%s did not catch up with %s: %w", lid, next, err)
	}
	say("  +%6.2fs  all three replicas caught up", c.since())
	return f, nil
}

// deposedWrite has the paused leader log a write of its own after its
// successor was elected, and waits a moment for a majority to acknowledge
// it: its followers promised the successor's epoch, so none may (node
// invariant 2).
func deposedWrite(ctx context.Context, id string, epoch, promised uint64, l *leader.Leader) *autoZombieRun {
	z := &autoZombieRun{Leader: id, Epoch: epoch}
	if _, err := l.Append(wal.Event{Op: wal.OpPut, Session: session.NewID(), Key: []byte("deposed"), Value: []byte(id)}); err != nil {
		z.Why = fmt.Sprintf("its leader refused the append (%v)", err)
		return z
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := l.WaitAcked(wctx, leader.AckMajority); err == nil {
		z.Acknowledged, z.Why = true, "ACKNOWLEDGED by a majority (two leaders!)"
	} else {
		z.Why = fmt.Sprintf("not acknowledged within 1s: its followers promised epoch %d and refuse its epoch %d (%v)", promised, epoch, err)
	}
	return z
}

// checkReplica reads a stopped member's counters: every request must have
// added 1 to its own, once.
func (c *autoCluster) checkReplica(id string, w *autoWriters) (autoReplica, error) {
	r := autoReplica{ID: id}
	got := map[string]int64{}
	replica := filepath.Join(c.cfg.root, id, node.ReplicaDirName)
	for s := range uint32(c.cfg.shards) {
		dir := store.ShardDir(replica, s)
		db, err := openReadOnly(dir, io.Discard)
		if err != nil {
			return r, fmt.Errorf("member %s: %w", id, err)
		}
		err = counters(db, got)
		_ = db.Close()
		if err != nil {
			return r, fmt.Errorf("member %s: reading %s: %w", id, dir, err)
		}
	}
	r.Counters = len(got)
	for _, reqs := range w.reqs {
		for req := range reqs {
			switch v, ok := got[string(autoCounter(req))]; {
			case !ok:
				r.Missing++
			case v != 1:
				r.Duplicated++
			}
		}
	}
	r.Verified = r.Missing == 0 && r.Duplicated == 0
	return r, nil
}

// counters adds the store's counters (the default state machine's rows:
// State, a session ID, the user key; a version byte and the count) to into.
func counters(db *pebble.DB, into map[string]int64) error {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte(keyspace.State), UpperBound: keyspace.UpperBound(keyspace.State)})
	if err != nil {
		return err
	}
	defer it.Close()
	const head = len(keyspace.State) + len(session.ID{})
	for it.First(); it.Valid(); it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) < head || !strings.HasPrefix(string(k[head:]), "ctr/") || len(v) != 9 {
			continue
		}
		into[string(k[head:])] += int64(binary.LittleEndian.Uint64(v[1:]))
	}
	return it.Error()
}

func printAuto(w io.Writer, r *autoReport) {
	if len(r.Failovers) > 0 {
		fmt.Fprintf(w, "\nfailovers (the leader gone → the first write its successor acknowledged), lease TTL %v:\n", time.Duration(r.LeaseTTLSec*float64(time.Second)))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  fault\tleader\tepoch\tsuccessor\tepoch\telected after\tfailover time\t")
		for _, f := range r.Failovers {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%d\t%.2fs\t%.2fs\t\n", f.Fault, f.Leader, f.Epoch, f.Successor, f.NewEpoch, f.ElectedSec, f.FailoverSec)
		}
		tw.Flush()
		fmt.Fprintf(w, "  failover time: min %.2fs, median %.2fs, max %.2fs\n", r.FailoverMin, r.FailoverMed, r.FailoverMax)
	}
	if len(r.Replicas) > 0 {
		fmt.Fprintf(w, "\nrequests: %d sent, %d answered (the longest in %.2fs), %d whose outcome the client never learned (settled by the final retry); %d retries answered Replay of %d\n",
			r.Requests, r.Acked, r.LongestSec, r.Unknown, r.Replayed, r.Retries)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  replica\tcounters\tmissing\tapplied twice\tverified\t")
		for _, rr := range r.Replicas {
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%s\t\n", rr.ID, rr.Counters, rr.Missing, rr.Duplicated, map[bool]string{true: "yes", false: "NO"}[rr.Verified])
		}
		tw.Flush()
	}
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  problem: %s\n", p)
	}
	if r.Verified {
		fmt.Fprintf(w, "\nverified in %.1fs: every request applied exactly once on every replica; every answered request replayed when sent again\n", r.Seconds)
	} else {
		fmt.Fprintf(w, "\nNOT VERIFIED: %s\n", r.Error)
	}
}

// Upper bounds of demo --auto-failover's sizes.
const (
	maxAutoFaults  = 100
	maxAutoClients = 64
)

// autoOnlyFlags are demo's flags that mean something with --auto-failover
// only; autoFlags every flag that mode reads.
var (
	autoOnlyFlags = []string{"etcd", "lease-ttl", "kills", "pauses", "clients", "verbose"}
	autoFlags     = append([]string{"auto-failover", "shards", "seed", "dir", "json"}, autoOnlyFlags...)
)

// checkAutoFlags refuses a flag of one mode given to the other: it would
// be ignored in silence.
func checkAutoFlags(c *flagCheck, fs *flag.FlagSet, auto bool) {
	fs.Visit(func(f *flag.Flag) {
		switch {
		case auto && !slices.Contains(autoFlags, f.Name):
			c.failf("--%s does not combine with --auto-failover", f.Name)
		case !auto && slices.Contains(autoOnlyFlags, f.Name):
			c.failf("--%s needs --auto-failover", f.Name)
		}
	})
}

package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/crashmem"
	"github.com/oncewal/oncewal/leader"
	onode "github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// ElectionOptions describes one seeded run of automatic failover: Members
// members of package node on one coord.Memory and one onode.MemoryNet, a
// client writing a generated workload through whichever member leads, and
// a nemesis between its batches (see the package documentation, "Elections").
type ElectionOptions struct {
	Seed uint64
	// Members is the cluster's size. Default 3; 2..9.
	Members int
	// Shards is every member's shard count. Default 1.
	Shards int
	// Workload is the client's; its Seed defaults to Seed. Every request
	// is sent under its client key (its request ID), so that the client
	// may retry any of them on the next leader. Its distinct requests must
	// fit the stores' window (electionWindow), which the run reads to tell
	// which requests took effect.
	Workload WorkloadOptions
	// Faults is the number of nemesis events, each before a batch the seed
	// picks. Default 4; negative is refused.
	Faults int
	// LeaseTTL is the coordinator's lease: a dead leader is succeeded
	// about one TTL later. Default 60ms; at least 3ms.
	LeaseTTL time.Duration
	// LinkFaults are the faults of every member link (onode.MemoryNet).
	// Default none.
	LinkFaults inprocess.FaultOptions
	// AckTimeout bounds each wait for an acknowledgement (a leader's
	// leader.Options.AckTimeout). Default 1s.
	AckTimeout time.Duration
	// Timeout bounds the run. Default 1 minute.
	Timeout time.Duration
	// Logger gets the members' lines. Default slog.Default().
	Logger *slog.Logger
	// Trace, if set, receives a line per nemesis event, leader change and
	// abandoned batch.
	Trace func(format string, args ...any)
}

// electionWindow is every store's idempotency window in an election run:
// it holds every request key of the workload, so a store tells whether a
// request took effect.
const electionWindow = 4096

// EnsureDefaults fills unset fields with their documented defaults.
func (o *ElectionOptions) EnsureDefaults() *ElectionOptions {
	if o.Members == 0 {
		o.Members = 3
	}
	if o.Shards == 0 {
		o.Shards = 1
	}
	if o.Workload.Seed == 0 {
		o.Workload.Seed = o.Seed
	}
	o.Workload.EnsureDefaults()
	if o.Faults == 0 {
		o.Faults = 4
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 60 * time.Millisecond
	}
	if o.AckTimeout == 0 {
		o.AckTimeout = time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports every problem in one error wrapping ErrBadOptions.
func (o *ElectionOptions) Validate() error {
	var errs []error
	if o.Members < 2 || o.Members > 9 {
		errs = append(errs, fmt.Errorf("Members %d: give 2..9", o.Members))
	}
	if o.Shards < 1 || o.Shards > replication.MaxShards {
		errs = append(errs, fmt.Errorf("Shards %d: give 1..%d", o.Shards, replication.MaxShards))
	}
	if o.Faults < 0 {
		errs = append(errs, fmt.Errorf("Faults %d is negative", o.Faults))
	}
	if o.LeaseTTL < 3*time.Millisecond {
		errs = append(errs, fmt.Errorf("LeaseTTL %v: give at least 3ms", o.LeaseTTL))
	}
	if o.AckTimeout < 0 || o.Timeout < 0 {
		errs = append(errs, fmt.Errorf("AckTimeout %v, Timeout %v: give positive durations", o.AckTimeout, o.Timeout))
	}
	if n := o.Workload.Requests + 2*o.Workload.Sessions; n > electionWindow {
		errs = append(errs, fmt.Errorf("Workload: %d requests and sessions do not fit the stores' window of %d keys: give fewer", n, electionWindow))
	}
	errs = append(errs, o.Workload.problems()...)
	return badOptions("ElectionOptions", errs)
}

// Nemesis event kinds of an election run.
const (
	NemKillLeader   = iota // the leader dies (no resign; a power failure) and restarts on its crash image
	NemPauseLeader         // the leader stops past its lease, is written to as a zombie, then runs again
	NemCutCoord            // a member loses the coordinator until the fault heals
	NemCutPeers            // a member loses its peers until the fault heals
	NemKillFollower        // a member that does not lead dies and restarts on its crash image
	nemKinds
)

// errStalled: the members never converged on the final leader — a
// liveness failure, not a lost or doubled write, which the verification
// after convergence would report.
var errStalled = errors.New("members never caught up")

// NemesisName names a nemesis event kind.
func NemesisName(k int) string {
	return [...]string{"kill-leader", "pause-leader", "cut-coord", "cut-peers", "kill-follower"}[k]
}

// ElectionResult is what happened in an election run and whether the
// invariants held.
type ElectionResult struct {
	Workload *Workload
	// Nemesis counts the events carried out, by kind (NemesisName).
	Nemesis [nemKinds]int
	// Leaders is the number of times the client found a leader at a
	// higher epoch than the last it wrote through (the first included).
	Leaders int
	// Terms is the number of terms published leading.
	Terms int
	// Attempts and Failed count the client's batch attempts and those
	// that ended without every shard acknowledged under the policy.
	Attempts, Failed int
	// Acked counts distinct requests acknowledged under the policy;
	// Abandoned those whose batch the client gave up after a failed
	// attempt, and AbandonedPresent those of them that took effect all the
	// same (once).
	Acked, Abandoned, AbandonedPresent int
	// ZombieWrites counts writes to a paused leader after its successor
	// led; none may be acknowledged.
	ZombieWrites int
	Elapsed      time.Duration
	Verified     bool
	VerifyErr    error
}

// member is one node of the run.
type member struct {
	idx  int
	id   string
	addr string
	dir  string
	mem  *vfs.MemFS
	view *memberView
	n    *onode.Node
	stop context.CancelFunc
	done chan error
}

// nemesis is one scheduled event; everything random about it is drawn when
// the run is scheduled.
type nemesis struct {
	at      int // before batch at
	kind    int
	who     int // NemCutCoord, NemCutPeers, NemKillFollower: a member (the leader's index is skipped for a follower kill)
	percent int // a crash image keeps this share of unsynced writes
	seed    uint64
}

type erun struct {
	cfg     ElectionOptions
	ctx     context.Context
	mem     *coord.Memory
	net     *onode.MemoryNet
	router  leader.ShardRouter
	clock   *Clock
	members []*member
	final   *member // the leader every member caught up with
	res     *ElectionResult

	// The client's record.
	acked     map[uint64]ack // request ID: the first acknowledgement
	byEpoch   map[uint64]string
	lastAck   uint64 // the epoch of the last acknowledgement
	lastLead  uint64 // the epoch the client last wrote through
	abandoned map[uint64]bool
	sent      []Request // every request the client sent, in order (retries of a batch once)

	// Open faults, healed by heal.
	cutCoord *member
	cutPeers []string // addresses whose dials are cut

	termsMu sync.Mutex
	terms   []termSeen
	termErr error
}

type ack struct {
	epoch  uint64
	member string
}

// termSeen is the term record as node publishes it (node/doc.go, "The
// records in the coordinator").
type termSeen struct {
	Term  uint64 `json:"term"`
	Epoch uint64 `json:"epoch"`
	ID    string `json:"id"`
	State string `json:"state"`
}

const electionCluster = "sim"

// RunElections runs cfg: the whole workload sent through whichever member
// leads while the nemesis strikes, every member caught up, then verified
// (package documentation, "Elections"). An error means the run could not be
// carried out; a violated invariant is in ElectionResult.VerifyErr.
func RunElections(ctx context.Context, cfg ElectionOptions) (*ElectionResult, error) {
	if err := cfg.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	router, err := leader.NewShardRouter(cfg.Shards)
	if err != nil {
		return nil, err
	}
	w := GenerateWorkload(cfg.Workload)
	r := &erun{
		cfg: cfg, ctx: ctx, mem: coord.NewMemory(), router: router, clock: NewClock(w.Options.Start),
		net:   onode.NewMemoryNet(cfg.LinkFaults, ShardSeed(cfg.Seed, 0xe1)),
		res:   &ElectionResult{Workload: w},
		acked: map[uint64]ack{}, byEpoch: map[uint64]string{}, abandoned: map[uint64]bool{},
	}
	defer func() { _ = r.mem.Close() }()
	if err := r.mem.SetTTL(cfg.LeaseTTL); err != nil {
		return nil, err
	}
	start := time.Now()
	err = r.run(w)
	r.stopAll()
	if err == nil {
		r.verify()
	}
	if err != nil {
		return nil, fmt.Errorf("sim: elections seed %d: %w", cfg.Seed, err)
	}
	r.res.Elapsed = time.Since(start)
	r.res.Verified = r.res.VerifyErr == nil
	return r.res, nil
}

func (r *erun) trace(format string, args ...any) {
	if r.cfg.Trace != nil {
		r.cfg.Trace(format, args...)
	}
}

func (r *erun) fail(format string, args ...any) {
	if r.res.VerifyErr == nil {
		r.res.VerifyErr = fmt.Errorf(format, args...)
	}
}

func (r *erun) run(w *Workload) error {
	tctx, stopTerms := context.WithCancel(r.ctx)
	defer stopTerms()
	if err := r.watchTerms(tctx); err != nil {
		return err
	}
	for i := range r.cfg.Members {
		m := &member{idx: i, id: fmt.Sprintf("m%d", i+1), mem: vfs.NewCrashableMem()}
		m.addr, m.dir = "mem:"+m.id, "/"+m.id
		if _, err := onode.AddMember(r.ctx, r.mem, electionCluster, m.id); err != nil {
			return err
		}
		r.members = append(r.members, m)
	}
	for _, m := range r.members {
		if err := r.start(m); err != nil {
			return err
		}
	}
	events := r.schedule(len(w.Batches))
	abandonable := r.abandonable(w)
	skip := map[uint64]bool{} // retries of abandoned requests: a client that gave up does not retry
	for i, batch := range w.Batches {
		for len(events) > 0 && events[0].at == i {
			if err := r.strike(events[0], batch); err != nil {
				return err
			}
			events = events[1:]
		}
		var reqs []Request
		for _, q := range batch {
			if !skip[q.ID] {
				reqs = append(reqs, q)
			}
		}
		if len(reqs) == 0 {
			continue
		}
		if gaveUp, err := r.send(reqs, abandonable[i]); err != nil {
			return fmt.Errorf("batch %d: %w", i, err)
		} else if gaveUp {
			for _, q := range reqs {
				skip[q.ID], r.abandoned[q.ID] = true, true
			}
		}
	}
	r.heal()
	return r.settle()
}

// schedule draws the nemesis events: Faults of them before batches 1..n-1.
func (r *erun) schedule(n int) []nemesis {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x656c656374))
	var evs []nemesis
	for range r.cfg.Faults {
		if n < 2 {
			break
		}
		evs = append(evs, nemesis{at: 1 + rng.IntN(n-1), kind: rng.IntN(nemKinds), who: rng.IntN(r.cfg.Members),
			percent: rng.IntN(101), seed: rng.Uint64()})
	}
	// In batch order; events before the same batch keep their draw order.
	for i := 1; i < len(evs); i++ {
		for j := i; j > 0 && evs[j].at < evs[j-1].at; j-- {
			evs[j], evs[j-1] = evs[j-1], evs[j]
		}
	}
	return evs
}

// abandonable marks the batches the client gives up after a failed
// attempt (a sixth of those without opens, closes or late writes: a
// session must open and close for the workload's later requests to mean
// what they meant).
func (r *erun) abandonable(w *Workload) []bool {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x61626e64))
	out := make([]bool, len(w.Batches))
	for i, b := range w.Batches {
		ok := rng.IntN(6) == 0
		for _, q := range b {
			if q.Late || q.Event.Op == wal.OpOpen || q.Event.Op == wal.OpClose {
				ok = false
			}
		}
		out[i] = ok
	}
	return out
}

func (r *erun) nodeOptions(m *member) *onode.Options {
	st := store.Options{WindowCapacity: electionWindow, Logger: r.cfg.Logger, PebbleOptions: smallMemtable} // the members' stores log as they do
	return &onode.Options{
		Coordinator: m.view, Cluster: electionCluster, ID: m.id, Dir: m.dir, Shards: r.cfg.Shards,
		Addr: m.addr, Transport: r.net.For(m.addr), FS: crashmem.Wrap(m.mem), Logger: r.cfg.Logger,
		FenceTimeout: 8 * r.cfg.LeaseTTL,
		Leader: leader.Options{Store: st, Wall: r.clock.Now, AckTimeout: r.cfg.AckTimeout, SegmentSize: 64 << 10,
			Shipping: leader.ShipperOptions{RetransmitTimeout: 20 * time.Millisecond, PollInterval: time.Millisecond}},
		Follower: follower.NodeOptions{ReopenBackoff: 5 * time.Millisecond, Follower: follower.Options{Store: st,
			ReconnectBackoff: 2 * time.Millisecond, MaxReconnectBackoff: 20 * time.Millisecond}},
	}
}

// start opens m's node on its filesystem with a fresh view and runs it.
func (r *erun) start(m *member) error {
	m.view = newMemberView(r.mem)
	n, err := onode.Open(r.nodeOptions(m))
	if err != nil {
		return fmt.Errorf("opening member %s: %w", m.id, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	m.n, m.stop, m.done = n, stop, make(chan error, 1)
	go func() { m.done <- n.Run(ctx) }()
	return nil
}

// halt stops m's Run and closes its node.
func (m *member) halt() error {
	if m.n == nil {
		return nil
	}
	m.stop()
	err := <-m.done
	if cerr := m.n.Close(); err == nil {
		err = cerr
	}
	m.n = nil
	return err
}

// stopAll stops every member without a word to the coordinator (a run's
// end must not start a term).
func (r *erun) stopAll() {
	for _, m := range r.members {
		if m.view != nil {
			m.view.set(viewDead)
		}
	}
	for _, m := range r.members {
		_ = m.halt()
	}
}

// watchTerms records every term record the coordinator publishes, for
// invariant 4.
func (r *erun) watchTerms(ctx context.Context) error {
	ch, err := r.mem.Watch(ctx, electionCluster, "term")
	if err != nil {
		return err
	}
	go func() {
		for data := range ch {
			b, ok := data["term"]
			if !ok {
				continue
			}
			var t termSeen
			err := json.Unmarshal(b, &t)
			r.termsMu.Lock()
			if err != nil && r.termErr == nil {
				r.termErr = fmt.Errorf("the term record %q does not decode: %w", b, err)
			}
			if err == nil && (len(r.terms) == 0 || r.terms[len(r.terms)-1] != t) {
				r.terms = append(r.terms, t)
			}
			r.termsMu.Unlock()
		}
	}()
	return nil
}

// leaderNow waits for a member other than except to lead and returns the
// one at the highest epoch.
func (r *erun) leaderNow(except *member) (*member, *leader.Leader, error) {
	m, l, err := r.leaderWithin(except, 0, 15*r.cfg.LeaseTTL)
	if err != nil || m != nil {
		return m, l, err
	}
	// The open faults may keep the cluster from electing (the member cut
	// off holds what the others need to fence): they heal.
	r.heal()
	m, l, err = r.leaderWithin(except, 0, 40*r.cfg.LeaseTTL+15*time.Second)
	if err == nil && m == nil {
		err = fmt.Errorf("no member led within %v (%s)", 40*r.cfg.LeaseTTL+15*time.Second, r.describe())
	}
	return m, l, err
}

// leaderWithin is leaderNow waiting at most d for a leader at an epoch
// above above: nil when none led by then.
func (r *erun) leaderWithin(except *member, above uint64, d time.Duration) (*member, *leader.Leader, error) {
	deadline := time.Now().Add(d)
	for {
		var best *member
		var bl *leader.Leader
		be := above
		for _, m := range r.members {
			if m == except || m.n == nil {
				continue
			}
			if s, _ := m.view.now(); s == viewPaused {
				continue // a zombie is written to on purpose only
			}
			l, err := m.n.Leader()
			st := m.n.Status()
			if err == nil && st.Role == onode.RoleLeader && st.Epoch > be {
				best, bl, be = m, l, st.Epoch
			}
		}
		if best != nil {
			return best, bl, nil
		}
		if time.Now().After(deadline) {
			return nil, nil, nil
		}
		if err := r.ctx.Err(); err != nil {
			return nil, nil, err
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *erun) describe() string {
	s := ""
	for _, m := range r.members {
		st, _ := m.view.now()
		if m.n == nil {
			s += fmt.Sprintf("%s: down; ", m.id)
			continue
		}
		ns := m.n.Status()
		s += fmt.Sprintf("%s: %s epoch %d leader %s view %d; ", m.id, ns.Role, ns.Epoch, ns.LeaderID, st)
	}
	return s
}

// maxAttempts bounds the attempts of one batch: a run that makes no
// progress is an error, not a hang.
const maxAttempts = 40

// send sends reqs through the leader until every shard acknowledged them
// under the policy. After a failed attempt the open faults heal (at the
// second), and an abandonable batch is given up (gaveUp).
func (r *erun) send(reqs []Request, abandonable bool) (gaveUp bool, err error) {
	for attempt := 1; ; attempt++ {
		m, l, err := r.leaderNow(nil)
		if err != nil {
			return false, err
		}
		ok, err := r.attempt(m, l, reqs, nil)
		if err != nil {
			return false, err
		}
		if ok {
			return false, nil
		}
		r.res.Failed++
		if abandonable {
			r.trace("batch of %d requests abandoned after a failed attempt through %s", len(reqs), m.id)
			return true, nil
		}
		if attempt >= 2 {
			r.heal()
		}
		if attempt >= maxAttempts {
			return false, fmt.Errorf("%d attempts through the leaders failed (%s)", attempt, r.describe())
		}
	}
}

// attempt sends reqs through l, which m runs, and records what is
// acknowledged: each shard's part is appended, then awaited under the
// policy (AckMajority: the leader and a majority's remainder of its
// followers). It reports whether every part was acknowledged or refused as
// a client expects. ctx, if set, bounds the waits (a zombie's).
func (r *erun) attempt(m *member, l *leader.Leader, reqs []Request, ctx context.Context) (bool, error) {
	r.res.Attempts++
	if ctx == nil {
		ctx = r.ctx
	}
	parts := make([][]Request, r.cfg.Shards)
	for _, q := range reqs {
		s := r.router.Shard(q.Event.Session)
		parts[s] = append(parts[s], q)
	}
	r.clock.Advance(time.Millisecond)
	type appended struct {
		h    wal.Header
		part []Request
	}
	var waits []appended
	all := true
	for s, part := range parts {
		if len(part) == 0 {
			continue
		}
		evs := make([]wal.Event, len(part))
		late := true
		for i, q := range part {
			evs[i] = q.Event
			evs[i].HasIdemKey, evs[i].IdemKey = true, q.Key()
			late = late && q.Late
		}
		sh, err := l.Shard(uint32(s))
		if err != nil {
			return false, err
		}
		h, err := sh.Append(evs...)
		switch {
		case errors.Is(err, session.ErrSessionClosed) && late:
			continue // refused, as a client expects
		case errors.Is(err, session.ErrSessionClosed):
			// A retry whose earlier attempt — this very part, with the
			// close of one of its sessions — is in this leader's log, so
			// far perhaps unacknowledged: once everything the shard
			// logged is acknowledged, so is that attempt.
			if err := sh.WaitAcked(ctx, sh.NextLSN()-1, leader.AckMajority); err != nil {
				if r.ctx.Err() != nil {
					return false, r.ctx.Err()
				}
				all = false
				continue
			}
			r.acknowledged(m, sh.Epoch(), part)
			continue
		case err != nil:
			all = false
			continue
		case late:
			r.fail("member %s accepted a write to a closed session at LSN %d (epoch %d)", m.id, h.FirstLSN, h.Epoch)
		}
		r.sent = append(r.sent, part...)
		waits = append(waits, appended{h, part})
	}
	for _, a := range waits {
		sh, err := l.Shard(r.router.Shard(a.part[0].Event.Session))
		if err != nil {
			return false, err
		}
		if err := sh.WaitAcked(ctx, a.h.LastLSN(), leader.AckMajority); err != nil {
			if r.ctx.Err() != nil {
				return false, r.ctx.Err()
			}
			all = false
			continue
		}
		r.acknowledged(m, a.h.Epoch, a.part)
	}
	return all, nil
}

// acknowledged records an acknowledgement under the policy and checks
// invariant 3 as it comes: one member per epoch, and epochs in the order
// the client saw them never fall.
func (r *erun) acknowledged(m *member, epoch uint64, part []Request) {
	if who, ok := r.byEpoch[epoch]; ok && who != m.id {
		r.fail("invariant 3: members %s and %s both acknowledged writes at epoch %d", who, m.id, epoch)
	}
	r.byEpoch[epoch] = m.id
	if epoch < r.lastAck {
		r.fail("invariant 3: %s acknowledged at epoch %d after an acknowledgement at epoch %d", m.id, epoch, r.lastAck)
	}
	r.lastAck = max(r.lastAck, epoch)
	if epoch > r.lastLead {
		r.lastLead = epoch
		r.res.Leaders++
		r.trace("writes acknowledged through %s at epoch %d", m.id, epoch)
	}
	for _, q := range part {
		if _, ok := r.acked[q.ID]; !ok {
			r.acked[q.ID] = ack{epoch, m.id}
		}
	}
}

// strike carries out one nemesis event before next is sent.
func (r *erun) strike(e nemesis, next []Request) error {
	r.heal()
	rng := rand.New(rand.NewPCG(e.seed, 0x6e656d))
	switch e.kind {
	case NemKillLeader:
		m, _, err := r.leaderNow(nil)
		if err != nil {
			return err
		}
		r.trace("nemesis: %s (the leader) dies, its image keeps %d%% of unsynced writes", m.id, e.percent)
		if err := r.crash(m, e.percent, rng); err != nil {
			return err
		}
	case NemPauseLeader:
		if err := r.pause(next); err != nil {
			return err
		}
	case NemCutCoord:
		m := r.members[e.who]
		r.trace("nemesis: %s cut from the coordinator", m.id)
		m.view.set(viewCut)
		m.view.expire()
		r.cutCoord = m
	case NemCutPeers:
		m := r.members[e.who]
		lm, _, err := r.leaderNow(nil)
		if err != nil {
			return err
		}
		// MemoryNet cuts a member's own dials: a leader is cut from its
		// peers by cutting theirs.
		cut := []string{m.addr}
		if lm == m {
			cut = nil
			for _, o := range r.members {
				if o != m {
					cut = append(cut, o.addr)
				}
			}
		}
		r.trace("nemesis: %s cut from its peers (leader %s)", m.id, lm.id)
		for _, a := range cut {
			for s := range uint32(r.cfg.Shards) {
				r.net.Cut(a, s, true)
			}
		}
		r.cutPeers = cut
	case NemKillFollower:
		lm, _, err := r.leaderNow(nil)
		if err != nil {
			return err
		}
		m := r.members[e.who]
		if m == lm {
			m = r.members[(e.who+1)%len(r.members)]
		}
		r.trace("nemesis: %s (a follower) dies, its image keeps %d%% of unsynced writes", m.id, e.percent)
		if err := r.crash(m, e.percent, rng); err != nil {
			return err
		}
	}
	r.res.Nemesis[e.kind]++
	return nil
}

// heal ends the open faults.
func (r *erun) heal() {
	if m := r.cutCoord; m != nil {
		m.view.set(viewUp)
		r.cutCoord = nil
		r.trace("heal: %s reaches the coordinator again", m.id)
	}
	for _, a := range r.cutPeers {
		for s := range uint32(r.cfg.Shards) {
			r.net.Cut(a, s, false)
		}
	}
	if r.cutPeers != nil {
		r.trace("heal: peers reach each other again")
		r.cutPeers = nil
	}
}

// crash kills m as a power failure does — its Run stopped without a
// resign: its terms expire, its filesystem keeps what it synced and
// percent of the rest — and restarts it on that image.
func (r *erun) crash(m *member, percent int, rng *rand.Rand) error {
	m.view.set(viewDead)
	m.view.expire()
	for s := range uint32(r.cfg.Shards) {
		r.net.Cut(m.addr, s, true) // no ack leaves it that its image may not hold
	}
	clone := m.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: percent, RNG: rng})
	if err := m.halt(); err != nil {
		return fmt.Errorf("stopping member %s: %w", m.id, err)
	}
	m.mem = clone
	for s := range uint32(r.cfg.Shards) {
		r.net.Cut(m.addr, s, false)
	}
	return r.start(m)
}

// pause stops the leader past its lease: it hears nothing and its term
// expires. Once another member leads, the zombie is given the next batch
// — it must acknowledge none of it — and then runs again.
func (r *erun) pause(next []Request) error {
	z, zl, err := r.leaderNow(nil)
	if err != nil {
		return err
	}
	r.trace("nemesis: %s (the leader) paused past its lease", z.id)
	ze := z.n.Status().Epoch
	z.view.set(viewPaused)
	z.view.expire()
	// A successor leads at a later epoch: a zombie resumed by an earlier
	// pause may still call itself leader at an older one.
	succ, _, err := r.leaderWithin(z, ze, 12*r.cfg.LeaseTTL)
	if err != nil {
		return err
	}
	if succ == nil {
		// No successor while it is stopped: the others cannot fence
		// without it (a member whose store it replaced is not yet rebuilt
		// reports that shard unknown). A stopped process resumes.
		z.view.set(viewUp)
		r.trace("heal: %s runs again (nobody could succeed it meanwhile)", z.id)
		return nil
	}
	var reqs []Request
	for _, q := range next {
		if !q.Late {
			reqs = append(reqs, q)
		}
	}
	if len(reqs) > 0 {
		before := len(r.acked)
		ctx, cancel := context.WithTimeout(r.ctx, 3*r.cfg.LeaseTTL)
		_, err := r.attempt(z, zl, reqs, ctx)
		cancel()
		if err != nil && !errors.Is(err, leader.ErrClosed) {
			return err
		}
		r.res.ZombieWrites++
		if len(r.acked) != before {
			r.fail("invariant 2: the paused leader %s had writes acknowledged after %s led", z.id, succ.id)
		}
	}
	z.view.set(viewUp)
	r.trace("heal: %s runs again (%s leads)", z.id, succ.id)
	return nil
}

// settle waits until every member holds everything the final leader
// logged.
func (r *erun) settle() error {
	for {
		m, l, err := r.leaderNow(nil)
		if err != nil {
			return err
		}
		ok := true
		for s := range uint32(r.cfg.Shards) {
			sh, err := l.Shard(s)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
			err = sh.WaitAcked(ctx, sh.NextLSN()-1, leader.AckAll)
			cancel()
			if r.ctx.Err() != nil {
				return fmt.Errorf("%w with %s: %w (%s)", errStalled, m.id, r.ctx.Err(), r.describe())
			}
			ok = ok && err == nil
		}
		if ok {
			r.final = m
			return nil
		}
	}
}

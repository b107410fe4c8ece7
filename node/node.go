package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// Refusals and states of a Node.
var (
	// ErrNotMember: the node's ID is not in the cluster's members; it
	// neither campaigns nor follows until it is added.
	ErrNotMember = errors.New("node: not a member of the cluster (add it with oncewal members add, or give a member's ID)")
	// ErrForeignDir: the directory is another cluster's or member's (its
	// NODE file says whose); nothing was written (invariant 5).
	ErrForeignDir = errors.New("node: the directory belongs to another cluster or member (give this member's own directory)")
	// ErrLocked: another process (or Node) holds the directory.
	ErrLocked = errors.New("node: the directory is in use by another process (stop it first)")
	// ErrClosed: the Node was closed.
	ErrClosed = errors.New("node: closed")
	// ErrRunning: Run was called while another Run of the node runs.
	ErrRunning = errors.New("node: already running (one Run per Node)")
	// ErrNotLeader: the node does not lead now (Leader).
	ErrNotLeader = errors.New("node: not the leader (ask the leader the cluster's term names)")
)

// The names a node's directory holds.
const (
	nodeFileName = "NODE"
	lockFileName = "NODE.lock"
	// ReplicaDirName holds the shards' stores, as a follower node directory
	// or, while (or since) the node leads, a leader node directory.
	ReplicaDirName = "replica"
	// DeposedDirName holds the last replica the node led and then had to
	// rebuild as a follower: kept for an operator, replaced at the next.
	DeposedDirName = "deposed"
	// trashDirName holds a replica being discarded (discard).
	trashDirName = "trash"
	// snapshotsDirName holds the checkpoints the member serves a winning
	// peer while it follows.
	snapshotsDirName = "snapshots"
)

// Role is what a node does now.
type Role int

// Roles.
const (
	RoleFollower Role = iota // follows the published leader (or waits for one)
	RoleFencing              // won a term and fences before leading
	RoleLeader               // leads a term
)

func (r Role) String() string {
	return [...]string{"follower", "fencing", "leader"}[r]
}

// Status is a node's view of itself and of its cluster's term.
type Status struct {
	Role Role
	// Epoch, LeaderID and LeaderAddr are the term the node follows or
	// leads (zero: none known).
	Epoch      uint64
	LeaderID   string
	LeaderAddr string
	// Terms counts the terms this node won; Promotions those it led.
	Terms, Promotions int
	// NotMember: the cluster's members do not list this node's ID, so it
	// neither campaigns nor follows (ErrNotMember).
	NotMember bool
}

// Node is one member of a cluster (package doc). Open, then Run.
type Node struct {
	o       Options
	log     *slog.Logger
	lock    io.Closer
	replica string

	mu      sync.Mutex
	status  Status
	ld      *leader.Leader
	leading func() error // ld's leadership check (nil with ld)
	closed  bool
	running bool

	target atomic.Pointer[term] // the leader followed: dialers and rebuilds use it

	// Owned by Run.
	fol       *follower.Node
	folStop   context.CancelFunc
	folDone   chan struct{}
	folEP     io.Closer
	peers     *peerDonors
	following uint64            // the term fol serves from (0: none)
	staleBase map[uint32]uint64 // each shard's stale_epoch refusals when following began
	promised  uint64
	lead      *leadTerm
	fence     *fenceTerm
	camp      *campaign
	hold      time.Time // no campaign before
	heldFor   uint64    // the handoff term a hold was taken for
	warned    map[string]bool
}

type leadTerm struct {
	followers []string
	ls        coord.Leadership
	t         term
	l         *leader.Leader
	ep        LeaderEndpoint
	stop      context.CancelFunc
	done      chan error
}

type fenceTerm struct {
	ls    coord.Leadership
	t     term
	since time.Time
}

type campaign struct {
	cancel context.CancelFunc
}

type campaignResult struct {
	c   *campaign
	ls  coord.Leadership
	err error
}

// Open opens the node's directory (creating it), checks it is this
// member's, and locks it. It contacts nobody: Run does.
func Open(opts *Options) (*Node, error) {
	o := *opts
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	n := &Node{o: o, log: o.Logger.With("node", o.ID, "cluster", o.Cluster), replica: o.FS.PathJoin(o.Dir, ReplicaDirName), warned: map[string]bool{}}
	// Synced up the tree: a directory entry is durable only once its
	// parent is, and a power failure would otherwise take the node's whole
	// directory — its promises and every write it acknowledged — with it.
	if err := wal.MkdirAllSynced(o.FS, o.Dir); err != nil {
		return nil, fmt.Errorf("node: creating %s: %w", o.Dir, err)
	}
	lock, err := o.FS.Lock(o.FS.PathJoin(o.Dir, lockFileName))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLocked, o.Dir, err)
	}
	if err := checkIdentity(o.FS, o.Dir, identity{Cluster: o.Cluster, ID: o.ID, Shards: o.Shards}); err != nil {
		_ = lock.Close()
		return nil, err
	}
	// A replica being discarded when the process died (discard): finish.
	if err := o.FS.RemoveAll(o.FS.PathJoin(o.Dir, trashDirName)); err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("node: removing %s: %w", trashDirName, err)
	}
	switch layout, detail, err := store.DirLayout(o.FS, n.replica); {
	case err != nil:
		_ = lock.Close()
		return nil, err
	case layout != store.LayoutEmpty && layout != store.LayoutNode && layout != store.LayoutLeader:
		_ = lock.Close()
		return nil, &store.LayoutError{Dir: n.replica, Found: layout, Want: store.LayoutNode, Detail: detail}
	}
	n.lock = lock
	return n, nil
}

// Status reports the node's role and the term it acts in.
func (n *Node) Status() Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.status
}

// Leader returns the leader this node runs while it leads (ErrNotLeader
// otherwise). It is closed when the node steps down. From the moment its
// leadership may be lost (Deadline passed, Done closed: invariant 3) it is
// ErrNotLeader too, with coord.ErrLostLeadership, before Run has stepped
// down: a process resumed after a pause past its lease answers its
// readiness from here first.
func (n *Node) Leader() (*leader.Leader, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ld == nil {
		return nil, ErrNotLeader
	}
	if err := n.leading(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return n.ld, nil
}

func (n *Node) setStatus(fn func(*Status)) {
	n.mu.Lock()
	fn(&n.status)
	n.mu.Unlock()
}

// Close releases the directory. Run must have returned (ErrRunning).
func (n *Node) Close() error {
	n.mu.Lock()
	if n.running {
		n.mu.Unlock()
		return ErrRunning
	}
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	return n.lock.Close()
}

// tick re-evaluates what the node does when nothing in the coordinator
// changed (a fencing timeout, the end of a hold).
const tick = 100 * time.Millisecond

// Run takes part in the cluster until ctx ends: it follows, campaigns,
// fences, leads and steps down as the package doc describes. It returns nil
// when ctx ends, with every role stopped.
func (n *Node) Run(ctx context.Context) error {
	n.mu.Lock()
	closed, running := n.closed, n.running
	n.running = n.running || !closed
	n.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case running:
		return ErrRunning
	}
	defer func() {
		n.mu.Lock()
		n.running = false
		n.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer n.stopAll()
	won := make(chan campaignResult, 1)
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	var watch <-chan map[string][]byte
	var v view
	var watchErr error
	for {
		if watch == nil {
			w, err := n.o.Coordinator.Watch(ctx, n.o.Cluster, "")
			switch {
			case errors.Is(err, coord.ErrClosed):
				return err
			case err != nil:
				if watchErr == nil {
					n.log.Warn("node: cannot watch the cluster's records; retrying", "err", err)
				}
				watchErr = err
			default:
				watch, watchErr = w, nil
			}
		}
		var lost <-chan struct{}
		switch {
		case n.lead != nil:
			lost = n.lead.ls.Done()
		case n.fence != nil:
			lost = n.fence.ls.Done()
		}
		select {
		case <-ctx.Done():
			return nil
		case data, ok := <-watch:
			if !ok {
				watch = nil
				continue
			}
			v = readView(data)
			n.step(ctx, v, won)
		case r := <-won:
			n.won(ctx, v, r)
			n.step(ctx, v, won)
		case <-lost:
			n.stepDown(ctx, "the leadership may be lost: its lease ended or etcd is unreachable")
			n.step(ctx, v, won)
		case <-ticker.C:
			if n.rebuildFenced(ctx) || v.reports != nil {
				n.step(ctx, v, won)
			}
		}
	}
}

// step reconciles what the node does with the cluster's records.
func (n *Node) step(ctx context.Context, v view, won chan campaignResult) {
	for _, err := range v.bad {
		n.warnOnce(err.Error(), "node: ignoring a record", "err", err)
	}
	if !v.members.Has(n.o.ID) {
		n.warnOnce("member", "node: not a member: neither campaigning nor following", "err", ErrNotMember, "members", v.members.IDs)
		n.stepDown(ctx, "no longer a member")
		n.abandonFence(ctx, "no longer a member")
		n.stopCampaign()
		n.stopServing()
		n.setStatus(func(s *Status) { s.NotMember, s.Role = true, RoleFollower })
		return
	}
	if n.warned["member"] {
		delete(n.warned, "member")
		n.setStatus(func(s *Status) { s.NotMember = false })
	}
	t := v.term
	if n.lead != nil && t.Term != 0 && t.Term != n.lead.t.Term {
		n.stepDown(ctx, fmt.Sprintf("term %d (epoch %d, %s) began", t.Term, t.Epoch, t.ID))
	}
	if n.fence != nil && t.Term != 0 && t.Term != n.fence.t.Term && t.Epoch > n.fence.t.Epoch {
		n.abandonFence(ctx, fmt.Sprintf("term %d began", t.Term))
	}
	if n.lead != nil {
		n.reconcileFollowers(v.members)
	}
	if t.State == stateFencing && t.Epoch > n.promised && n.lead == nil {
		n.promiseAndReport(ctx, t)
	}
	if n.fence != nil && t.Term == n.fence.t.Term {
		n.decide(ctx, v)
	}
	if n.lead == nil && n.fence == nil && t.State == stateLeading && t.ID != n.o.ID && n.following != t.Term {
		n.follow(ctx, t)
	}
	if t.State == stateHandoff && t.To != n.o.ID && n.heldFor != t.Term {
		// Let the member handed to win: withdraw, and stay out for a while.
		n.heldFor, n.hold = t.Term, time.Now().Add(n.o.FenceTimeout)
		n.stopCampaign()
	}
	if n.lead == nil && n.fence == nil && n.camp == nil && !time.Now().Before(n.hold) {
		n.startCampaign(ctx, won)
	}
}

func (n *Node) warnOnce(key, msg string, args ...any) {
	if !n.warned[key] {
		n.warned[key] = true
		n.log.Warn(msg, args...)
	}
}

func (n *Node) startCampaign(ctx context.Context, won chan campaignResult) {
	cctx, cancel := context.WithCancel(ctx)
	c := &campaign{cancel: cancel}
	n.camp = c
	me := coord.Candidate{ID: n.o.ID, Addr: n.o.Addr}
	go func() {
		ls, err := n.o.Coordinator.Campaign(cctx, n.o.Cluster, me)
		select {
		case won <- campaignResult{c: c, ls: ls, err: err}:
		case <-ctx.Done():
			if ls != nil {
				_ = ls.Resign(context.Background())
			}
		}
	}()
}

func (n *Node) stopCampaign() {
	if n.camp != nil {
		n.camp.cancel()
		n.camp = nil
	}
}

// retryCampaign is the pause after a campaign that failed (etcd
// unreachable) before the next.
const retryCampaign = 500 * time.Millisecond

// won starts fencing the term a campaign won.
func (n *Node) won(ctx context.Context, v view, r campaignResult) {
	if r.c != n.camp {
		if r.ls != nil { // withdrawn meanwhile
			_ = r.ls.Resign(ctx)
		}
		return
	}
	n.camp = nil
	if r.err != nil {
		if ctx.Err() == nil {
			n.log.Warn("node: campaign failed; campaigning again", "err", r.err)
			n.hold = time.Now().Add(retryCampaign)
		}
		return
	}
	ls := r.ls
	fail := func(what string, err error) {
		n.log.Warn("node: won a term but cannot fence it: resigning", "term", ls.Epoch(), "step", what, "err", err)
		_ = ls.Resign(ctx)
		n.hold = time.Now().Add(retryCampaign)
	}
	if !v.members.Has(n.o.ID) {
		fail("membership", ErrNotMember)
		return
	}
	// Read base and the last term after winning: the previous term's
	// guarded writes all happened before its key went (invariant 1).
	var base uint64
	if b, ok, err := n.o.Coordinator.Get(ctx, n.o.Cluster, keyEpochBase); err != nil {
		fail("read the epoch base", err)
		return
	} else if ok {
		if base, err = decodeBase(b); err != nil {
			fail("read the epoch base", err)
			return
		}
	}
	seen := n.promised
	if b, ok, err := n.o.Coordinator.Get(ctx, n.o.Cluster, keyTerm); err != nil {
		fail("read the last term", err)
		return
	} else if ok {
		last, err := decodeJSON[term](keyTerm, b)
		if err != nil {
			fail("read the last term", err)
			return
		}
		seen = max(seen, last.Epoch)
	}
	local, err := n.localEpoch()
	if err != nil {
		fail("read the stores' epochs", err)
		return
	}
	seen = max(seen, local)
	epoch, newBase, err := termEpoch(base, ls.Epoch(), seen)
	if err != nil {
		fail("choose an epoch", err)
		return
	}
	t := term{Term: ls.Epoch(), Epoch: epoch, ID: n.o.ID, Addr: n.o.Addr, State: stateFencing}
	if err := ls.Guarded(ctx, coord.Put(keyTerm, encodeJSON(t)), coord.Put(keyEpochBase, encodeBase(newBase))); err != nil {
		fail("publish the fencing term", err)
		return
	}
	n.fence = &fenceTerm{ls: ls, t: t, since: time.Now()}
	n.setStatus(func(s *Status) { s.Role, s.Terms = RoleFencing, s.Terms+1 })
	n.log.Info("node: won a term: fencing", "term", t.Term, "epoch", epoch, "need", fenceNeed(len(v.members.IDs), n.o.Ack), "members", len(v.members.IDs))
}

// localEpoch is the highest epoch the node's stores hold (committed or
// promised).
func (n *Node) localEpoch() (uint64, error) {
	pos, _, _, err := n.positions()
	if err != nil {
		return 0, err
	}
	var e uint64
	for _, p := range pos {
		e = max(e, p.Epoch, p.LastBatch.Epoch)
	}
	return max(e, n.promised), nil
}

// positions reads the stores' positions: a running follower node's, or a
// leader replica's from its stopped stores (deposed).
func (n *Node) positions() (pos []replication.Ack, unknown []uint32, deposed bool, err error) {
	layout, _, err := store.DirLayout(n.o.FS, n.replica)
	if err != nil {
		return nil, nil, false, err
	}
	if layout == store.LayoutLeader {
		pos, unknown = leaderReplicaPositions(n.o.FS, n.replica, n.o.Shards)
		return pos, unknown, true, nil
	}
	if err := n.openFollower(); err != nil {
		return nil, nil, false, err
	}
	for s := range uint32(n.o.Shards) {
		applied, epoch, err := n.fol.Position(s)
		if err != nil {
			unknown = append(unknown, s)
			continue
		}
		pos = append(pos, replication.Ack{Shard: s, Epoch: epoch, AppliedLSN: applied})
	}
	pos, unknown = n.behindDeposed(pos, unknown)
	return pos, unknown, false, nil
}

// promiseAndReport promises t's epoch in every store (nothing older applies
// from then on) and reports the final positions to t's winner.
func (n *Node) promiseAndReport(ctx context.Context, t term) {
	r := report{ID: n.o.ID, Addr: n.o.Addr, Term: t.Term, Epoch: t.Epoch}
	if err := n.restoreDeposed(); err != nil {
		n.log.Error("node: cannot restore the replica it moved aside", "err", err)
		return
	}
	layout, _, err := store.DirLayout(n.o.FS, n.replica)
	if err != nil {
		n.log.Error("node: cannot read the replica's layout to report", "err", err)
		return
	}
	if layout == store.LayoutLeader {
		// A replica it led: nothing applies to it while it does not lead.
		if r.Positions, r.Unknown, r.Deposed, err = n.positions(); err != nil {
			n.log.Error("node: cannot read the deposed replica's positions", "err", err)
			return
		}
	} else {
		// Stop following the old leader at once: the stores' promises
		// refuse its batches, and a store that cannot promise now (being
		// rebuilt) must not ack them either. The next leading term is
		// followed afresh.
		n.stopServing()
		if err := n.openFollower(); err != nil {
			n.log.Error("node: cannot open the stores to promise", "epoch", t.Epoch, "err", err)
			return
		}
		acks, err := n.fol.Promise(t.Epoch)
		if err != nil && !errors.Is(err, store.ErrStalled) {
			// A shard whose store is down between serves — retired to be
			// rebuilt (refused for good: behind, diverged), its rebuild
			// cut short by stopServing, or being reopened — stays down
			// until the node serves a leader again, and no leader comes
			// while the members it needs cannot promise. Its store on disk
			// is whole (a rebuild installs atomically): open the stores
			// again and promise once more.
			if rerr := n.reopenFollower(); rerr != nil {
				n.log.Error("node: cannot reopen the stores to promise", "epoch", t.Epoch, "err", rerr)
				return
			}
			acks, err = n.fol.Promise(t.Epoch)
		}
		if err != nil && len(acks) == 0 {
			n.log.Error("node: cannot promise the new term's epoch", "epoch", t.Epoch, "err", err)
			return
		}
		for s := range uint32(n.o.Shards) {
			if a, ok := acks[s]; ok {
				r.Positions = append(r.Positions, a)
			} else {
				r.Unknown = append(r.Unknown, s)
			}
		}
		r.Positions, r.Unknown = n.behindDeposed(r.Positions, r.Unknown)
		if err != nil {
			n.log.Warn("node: some stores could not promise; reporting them unknown", "epoch", t.Epoch, "unknown", r.Unknown, "err", err)
		}
	}
	n.promised = t.Epoch
	err = n.o.Coordinator.Update(ctx, n.o.Cluster, reportPrefix+n.o.ID, func([]byte, bool) ([]byte, error) {
		return encodeJSON(r), nil
	})
	if err != nil {
		n.log.Warn("node: cannot report to the fencing winner", "term", t.Term, "err", err)
		n.promised = t.Epoch - 1 // report again at the next step
		return
	}
	n.log.Info("node: promised a new term", "term", t.Term, "epoch", t.Epoch, "winner", t.ID, "positions", r.Positions, "deposed", r.Deposed)
}

// decide acts on a fencing term's reports (choose).
func (n *Node) decide(ctx context.Context, v view) {
	f := n.fence
	need := fenceNeed(len(v.members.IDs), n.o.Ack)
	c := choose(n.o.ID, f.t, v.members, v.reports, n.o.Shards, need)
	switch c.kind {
	case choiceWait:
		if time.Since(f.since) > n.o.FenceTimeout {
			n.abandonFence(ctx, "fencing timed out: "+c.why)
			n.hold = time.Now().Add(n.o.FenceTimeout / 2)
		}
	case choicePromote:
		n.promote(ctx, v, c)
	case choiceHandoff:
		t := f.t
		t.State, t.To = stateHandoff, c.to
		if err := f.ls.Guarded(ctx, coord.Put(keyTerm, encodeJSON(t))); err != nil {
			n.log.Warn("node: cannot hand the term over", "to", c.to, "err", err)
		}
		n.log.Info("node: handing the term over to a more advanced member", "term", t.Term, "to", c.to, "heard", c.heard)
		n.abandonFence(ctx, "handed over to "+c.to)
		n.hold = time.Now().Add(n.o.FenceTimeout)
	case choiceRaise:
		base := c.seen + 1 - min(c.seen+1, f.t.Term)
		if err := f.ls.Guarded(ctx, coord.Put(keyEpochBase, encodeBase(max(base, v.base)))); err != nil {
			n.log.Warn("node: cannot raise the epoch base", "err", err)
		}
		n.abandonFence(ctx, "raising epochs past what a member holds: "+c.why)
	case choiceCatchUp:
		if err := n.catchUp(ctx, v, c); err != nil {
			n.log.Error("node: cannot catch up before leading: resigning", "term", f.t.Term, "err", err)
			n.abandonFence(ctx, "catch-up failed")
			n.hold = time.Now().Add(n.o.FenceTimeout / 2)
			return
		}
		n.promote(ctx, v, c)
	case choiceStuck:
		n.log.Error("node: cannot promote anyone: histories are incomparable; an operator must choose (oncewal promote --catch-up)", "term", f.t.Term, "why", c.why)
		n.abandonFence(ctx, "stuck")
		n.hold = time.Now().Add(n.o.FenceTimeout)
	}
}

func (n *Node) abandonFence(ctx context.Context, why string) {
	if n.fence == nil {
		return
	}
	n.log.Info("node: ending a term before leading it", "term", n.fence.t.Term, "why", why)
	_ = n.fence.ls.Resign(ctx)
	n.fence = nil
	n.setStatus(func(s *Status) { s.Role = RoleFollower })
}

// catchUp replaces each store of the winner that a heard member is ahead
// on with a snapshot of that member's (follower.Rebuild: verified, installed
// atomically), so that it leads every shard's most advanced history.
func (n *Node) catchUp(ctx context.Context, v view, c choice) error {
	n.stopFollowing()
	cctx, cancel := context.WithTimeout(ctx, n.o.FenceTimeout)
	defer cancel()
	for _, cu := range c.catchUp {
		from, ok := v.reports[cu.from]
		if !ok || from.Addr == "" {
			return fmt.Errorf("shard %d: no address for %s", cu.shard, cu.from)
		}
		m, st, err := n.rebuildShard(cctx, cu.shard, from.Addr)
		if err != nil {
			return fmt.Errorf("shard %d from %s: %w", cu.shard, cu.from, err)
		}
		n.log.Info("node: caught a shard up from a more advanced member", "shard", cu.shard, "from", cu.from,
			"applied_lsn", m.Cut.AppliedLSN, "epoch", m.Cut.Epoch, "bytes", st.Bytes, "elapsed", st.Elapsed)
	}
	return nil
}

// rebuildShard replaces the store of shard with a snapshot of the member
// at addr (follower.Rebuild: verified, installed atomically, the store's
// promise kept). The follower node must be closed.
func (n *Node) rebuildShard(ctx context.Context, shard uint32, addr string) (snapshot.Manifest, snapshot.Stats, error) {
	o := n.o.Follower.Follower
	o.Store.ID, o.Store.FS, o.Store.Shard = n.o.ID, n.o.FS, shard
	if o.Store.Logger == nil {
		o.Store.Logger = n.o.Logger
	}
	return follower.Rebuild(ctx, store.ShardDir(n.replica, shard), &o, n.o.Transport.Snapshots(addr), nil)
}

// staleRefusals is each shard's count of batches its store refused as
// older than its committed or promised epoch.
func staleRefusals(st follower.NodeStats) map[uint32]uint64 {
	out := make(map[uint32]uint64, len(st.Shards))
	for _, s := range st.Shards {
		out[s.Shard] = s.Link.Refusals[staleEpochReason]
	}
	return out
}

// staleEpochReason is follower.LinkStats.Refusals' key of
// replication.ErrStaleEpoch.
const staleEpochReason = "stale_epoch"

// rebuildFenced rebuilds, from the leader it follows, every shard whose
// store refused that leader's batches as older than its promise, and
// reports whether it did (the caller then follows afresh): step 5 of the
// package doc. The leader won a term this node promised, so its epoch is
// at or above the promise; its batches are older only when it is a
// re-elected leader shipping its own log's tail of an earlier epoch —
// batches no promised store takes, which the leader's snapshot holds.
func (n *Node) rebuildFenced(ctx context.Context) bool {
	t := n.target.Load()
	if n.fol == nil || n.folStop == nil || t == nil || n.lead != nil || n.fence != nil {
		return false
	}
	var shards []uint32
	for s, c := range staleRefusals(n.fol.Stats()) {
		if c > n.staleBase[s] {
			shards = append(shards, s)
		}
	}
	if len(shards) == 0 {
		return false
	}
	slices.Sort(shards)
	n.log.Warn("node: the leader ships batches older than this member's promise (its own log's tail, re-elected): rebuilding from its snapshot",
		"leader", t.ID, "epoch", t.Epoch, "shards", shards)
	tc := *t
	n.stopFollowing()
	cctx, cancel := context.WithTimeout(ctx, n.o.FenceTimeout)
	defer cancel()
	for _, s := range shards {
		m, st, err := n.rebuildShard(cctx, s, tc.Addr)
		if err != nil {
			n.log.Error("node: cannot rebuild a shard from the leader; following it again", "shard", s, "leader", tc.ID, "err", err)
			continue
		}
		n.log.Info("node: rebuilt a shard from the leader", "shard", s, "leader", tc.ID, "applied_lsn", m.Cut.AppliedLSN,
			"epoch", m.Cut.Epoch, "bytes", st.Bytes, "elapsed", st.Elapsed)
	}
	return true
}

// promote opens the leader on the node's stores at the term's epoch and
// publishes it.
func (n *Node) promote(ctx context.Context, v view, c choice) {
	f := n.fence
	n.stopFollowing()
	var others []string
	for _, id := range v.members.IDs {
		if id != n.o.ID {
			others = append(others, id)
		}
	}
	ep, err := n.o.Transport.Lead(n.o.Shards)
	if err != nil {
		n.log.Error("node: cannot serve at its address to lead", "addr", n.o.Addr, "err", err)
		n.abandonFence(ctx, "no endpoint")
		n.hold = time.Now().Add(retryCampaign)
		return
	}
	lo := n.o.Leader
	lo.Shards, lo.Epoch, lo.Promote, lo.Followers, lo.FS = n.o.Shards, f.t.Epoch, true, others, n.o.FS
	lo.Listener = ep.Listener
	// Every claim is the client service's, run by the member that led: a
	// claim in flight now was a deposed or dead leader's (package doc,
	// "Requests in flight at a failover").
	lo.Ledger.FreeOrphanedClaims = true
	if lo.Logger == nil {
		lo.Logger = n.o.Logger
	}
	l, err := leader.Open(n.replica, &lo)
	if err != nil {
		_ = ep.Close()
		n.log.Error("node: cannot open the leader on its stores", "epoch", f.t.Epoch, "err", err)
		n.abandonFence(ctx, "the leader did not open")
		n.hold = time.Now().Add(n.o.FenceTimeout)
		return
	}
	ls := f.ls
	leading := func() error {
		select {
		case <-ls.Done():
			return coord.ErrLostLeadership
		default:
		}
		if !time.Now().Before(ls.Deadline()) {
			return fmt.Errorf("%w: its lease may have ended", coord.ErrLostLeadership)
		}
		return nil
	}
	if err := ep.Serve(l, ServeConfig{Ack: n.o.Ack, Leading: leading}); err != nil {
		_ = ep.Close()
		_ = l.Close()
		n.log.Error("node: cannot serve the leader", "err", err)
		n.abandonFence(ctx, "cannot serve")
		return
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(runCtx) }()
	t := f.t
	t.State = stateLeading
	for s := range uint32(n.o.Shards) {
		sh, err := l.Shard(s)
		if err != nil {
			break
		}
		t.Starts = append(t.Starts, sh.NextLSN())
	}
	n.lead = &leadTerm{ls: ls, t: t, l: l, ep: ep, stop: stop, done: done, followers: others}
	n.fence = nil
	n.mu.Lock()
	n.ld, n.leading = l, leading
	n.status.Role, n.status.Epoch, n.status.LeaderID, n.status.LeaderAddr = RoleLeader, t.Epoch, n.o.ID, n.o.Addr
	n.status.Promotions++
	n.mu.Unlock()
	if err := ls.Guarded(ctx, coord.Put(keyTerm, encodeJSON(t))); err != nil {
		n.stepDown(ctx, "cannot publish the term: "+err.Error())
		return
	}
	n.log.Info("node: leading", "term", t.Term, "epoch", t.Epoch, "addr", n.o.Addr, "followers", others, "heard", c.heard, "fence_ms", time.Since(f.since).Milliseconds())
}

// reconcileFollowers registers every member but itself with the leader and
// unregisters the rest: a membership change without a restart.
func (n *Node) reconcileFollowers(m Members) {
	l := n.lead.l
	for _, id := range m.IDs {
		if id != n.o.ID && !slices.Contains(n.lead.followers, id) {
			if err := l.Register(id); err != nil {
				n.log.Warn("node: cannot register a new member", "member", id, "err", err)
				continue
			}
			n.lead.followers = append(n.lead.followers, id)
			n.log.Info("node: shipping to a new member", "member", id)
		}
	}
	for _, id := range slices.Clone(n.lead.followers) {
		if !m.Has(id) {
			if err := l.Unregister(id); err != nil {
				n.log.Warn("node: cannot unregister a removed member", "member", id, "err", err)
				continue
			}
			n.lead.followers = slices.DeleteFunc(n.lead.followers, func(s string) bool { return s == id })
			n.log.Info("node: dropped a removed member", "member", id)
		}
	}
}

// stepDown stops leading: nothing is acknowledged from the moment it
// begins (the endpoint closes first).
func (n *Node) stepDown(ctx context.Context, why string) {
	ld := n.lead
	if ld == nil {
		return
	}
	n.lead = nil
	_ = ld.ep.Close()
	ld.stop()
	<-ld.done
	n.mu.Lock()
	n.ld, n.leading = nil, nil
	n.status.Role = RoleFollower
	n.mu.Unlock()
	if err := ld.l.Close(); err != nil {
		n.log.Warn("node: closing the leader", "err", err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	_ = ld.ls.Resign(rctx)
	cancel()
	n.log.Warn("node: stepped down", "term", ld.t.Term, "epoch", ld.t.Epoch, "why", why)
}

// follow serves the node's stores from t's leader.
func (n *Node) follow(ctx context.Context, t term) {
	layout, _, err := store.DirLayout(n.o.FS, n.replica)
	if err != nil {
		n.log.Error("node: cannot read the replica's layout", "err", err)
		return
	}
	if layout == store.LayoutLeader {
		// The stores of a term this node led: a follower cannot continue
		// them (store.Identity); keep them aside and rebuild.
		if err := n.moveAside(); err != nil {
			n.log.Error("node: cannot move the deposed replica aside", "err", err)
			return
		}
	}
	if err := n.openFollower(); err != nil {
		n.log.Error("node: cannot open the stores to follow", "err", err)
		return
	}
	if err := n.rebuildBehind(ctx, t); err != nil {
		n.log.Warn("node: cannot rebuild the shards behind the leader's term; following as they are", "err", err)
	}
	if n.folEP == nil {
		peers := &peerDonors{fol: n.fol, fs: n.o.FS, dir: n.o.FS.PathJoin(n.o.Dir, snapshotsDirName), ids: map[string]*snapshot.Donor{}}
		ep, err := n.o.Transport.Follow(n.where, peers, ReplicaStores{Shards: n.o.Shards, Store: peers.store})
		if err != nil {
			n.log.Warn("node: cannot serve clients at its address while following", "err", err)
		} else {
			n.folEP, n.peers = ep, peers
		}
	}
	tc := t
	n.target.Store(&tc)
	n.stopServing()
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	fol, d := n.fol, n.o.Transport.Dialer(t.Addr)
	go func() {
		defer close(done)
		_ = fol.Serve(sctx, func(uint32) replication.Dialer { return d })
	}()
	n.folStop, n.folDone, n.following = stop, done, t.Term
	n.staleBase = staleRefusals(fol.Stats())
	n.setStatus(func(s *Status) {
		s.Role, s.Epoch, s.LeaderID, s.LeaderAddr = RoleFollower, t.Epoch, t.ID, t.Addr
	})
	n.log.Info("node: following", "leader", t.ID, "addr", t.Addr, "term", t.Term, "epoch", t.Epoch)
}

func (n *Node) where() (string, uint64) {
	if t := n.target.Load(); t != nil {
		return t.Addr, t.Epoch
	}
	return "", 0
}

func (n *Node) openFollower() error {
	if n.fol != nil {
		return nil
	}
	o := n.o.Follower
	o.ShardCount = n.o.Shards
	o.Follower.Store.ID, o.Follower.Store.FS = n.o.ID, n.o.FS
	if o.Follower.Store.Logger == nil {
		o.Follower.Store.Logger = n.o.Logger
	}
	if o.Follower.RebuildFrom == nil {
		o.Follower.RebuildFrom = targetSource{n}
	}
	shards := make([]uint32, n.o.Shards)
	for s := range shards {
		shards[s] = uint32(s)
	}
	fol, err := follower.OpenNode(n.replica, shards, &o)
	if err != nil {
		return err
	}
	n.fol = fol
	return nil
}

// reopenFollower closes the follower node and opens it again from disk
// (not serving); the snapshots served to peers follow it.
func (n *Node) reopenFollower() error {
	if n.fol != nil {
		if err := n.fol.Close(); err != nil {
			n.log.Warn("node: closing the follower to reopen it", "err", err)
		}
		n.fol = nil
	}
	if err := n.openFollower(); err != nil {
		return err
	}
	if n.peers != nil {
		n.peers.setFollower(n.fol)
	}
	return nil
}

// stopServing stops the follower's links (the stores stay open).
func (n *Node) stopServing() {
	if n.folStop != nil {
		n.folStop()
		<-n.folDone
		n.folStop, n.folDone, n.following = nil, nil, 0
	}
}

// stopFollowing closes the follower node and its client endpoint.
func (n *Node) stopFollowing() {
	n.stopServing()
	if n.folEP != nil {
		_ = n.folEP.Close()
		_ = n.peers.Close()
		n.folEP, n.peers = nil, nil
	}
	if n.fol != nil {
		if err := n.fol.Close(); err != nil {
			n.log.Warn("node: closing the follower", "err", err)
		}
		n.fol = nil
	}
	n.target.Store(nil)
}

func (n *Node) stopAll() {
	n.stopCampaign()
	n.stepDown(context.Background(), "stopping")
	n.abandonFence(context.Background(), "stopping")
	n.stopFollowing()
}

// moveAside keeps a deposed replica as DeposedDirName, replacing the last.
func (n *Node) moveAside() error {
	dep := n.o.FS.PathJoin(n.o.Dir, DeposedDirName)
	if err := n.discard(dep); err != nil {
		return err
	}
	if err := n.o.FS.Rename(n.replica, dep); err != nil {
		return err
	}
	if err := syncDir(n.o.FS, n.o.Dir); err != nil {
		return err
	}
	n.log.Warn("node: moved the replica it led aside to rebuild it from the new leader", "deposed", dep)
	return nil
}

// discard removes dir as one step a crash cannot split: it is renamed to
// trashDirName (synced) before its files go, so a crash leaves dir whole or
// gone — never a directory missing some files, which a later open would
// take for a replica of another shape (or a deposed replica to restore).
// Open removes what a crash left in trash.
func (n *Node) discard(dir string) error {
	fs := n.o.FS
	trash := fs.PathJoin(n.o.Dir, trashDirName)
	if err := fs.RemoveAll(trash); err != nil {
		return err
	}
	if _, err := fs.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := fs.Rename(dir, trash); err != nil {
		return err
	}
	if err := syncDir(fs, n.o.Dir); err != nil {
		return err
	}
	return fs.RemoveAll(trash)
}

// targetSource is the rebuild source of the leader followed now.
type targetSource struct{ n *Node }

func (s targetSource) src() (snapshot.Source, error) {
	t := s.n.target.Load()
	if t == nil {
		return nil, fmt.Errorf("node: no leader to rebuild from yet: %w", snapshot.ErrClosed)
	}
	return s.n.o.Transport.Snapshots(t.Addr), nil
}

func (s targetSource) Begin(ctx context.Context, shard uint32) (snapshot.Manifest, error) {
	src, err := s.src()
	if err != nil {
		return snapshot.Manifest{}, err
	}
	return src.Begin(ctx, shard)
}

func (s targetSource) Read(ctx context.Context, id, name string, off int64, p []byte) (int, error) {
	src, err := s.src()
	if err != nil {
		return 0, err
	}
	return src.Read(ctx, id, name, off, p)
}

func (s targetSource) End(ctx context.Context, id string) error {
	src, err := s.src()
	if err != nil {
		return err
	}
	return src.End(ctx, id)
}

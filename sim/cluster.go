package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/internal/badopts"
	"github.com/oncewal/oncewal/internal/drill"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/crashmem"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Options describes one end-to-end run of a deployment: a leader (package
// leader) of Shards shards, Followers follower nodes each serving every
// shard over its own links, a client sending a generated workload through
// the leader, and the faults the seed schedules between the client's
// batches: follower restarts (clean, killed, or a power failure that loses
// unsynced writes), leader restarts on the same directory (clean or a power
// failure), and a promotion of the most advanced follower after the
// leader's death. See the package documentation for the invariant Run
// checks.
type Options struct {
	// Dir, if set, puts every node on the real filesystem: the leader in
	// Dir/leader, follower f<i> in Dir/f<i>; a power failure is then a
	// kill. Empty: each node has its own in-memory filesystem
	// (vfs.NewCrashableMem) and a power failure keeps a random share of
	// the unsynced writes (CrashClone).
	Dir  string
	Seed uint64
	// Workload is the client's workload; its Seed defaults to Seed.
	Workload WorkloadOptions
	// Shards is the deployment's shard count. Default 1.
	Shards int
	// Followers is the number of follower nodes, f1..fN, each serving
	// every shard: N followers per shard. Default 1.
	Followers int
	// Faults are the faults of every follower link (one InProcess
	// transport per follower and shard, seeded independently); LinkFaults,
	// if set, chooses per link instead.
	Faults     inprocess.FaultOptions
	LinkFaults func(follower int, shard uint32) inprocess.FaultOptions
	// Transport, if set, replaces the InProcess links: shard's Listener
	// for the leader and the Dialer every follower uses (faults are then
	// the transport's business), and a func closing both.
	Transport func(shard uint32) (replication.Listener, replication.Dialer, func() error, error)
	// Restarts is the number of follower restarts, each of a follower,
	// a kind (clean, kill, power failure) and a moment the seed picks.
	Restarts int
	// LeaderRestarts is the number of leader restarts on the same
	// directory, each clean or a power failure (the seed picks).
	LeaderRestarts int
	// Promote: at a moment the seed picks the leader dies and the most
	// advanced follower is promoted (a new epoch); the client carries on
	// against it. Needs Followers >= 2.
	Promote bool
	// Diverge makes the promotion's deposed leader always a zombie, after
	// every follower caught up: one follower is then given a batch of the
	// deposed leader's history that the new leader's never holds (a
	// diverged follower). Needs Promote; without it a third of the
	// promotions have a zombie, the seed picks which.
	Diverge bool
	// Answers is the number of moments the client waits for
	// WaitAcked(AckMajority) on every shard: the answers it saw, which
	// must survive the leader's death and the promotion.
	Answers int
	// Follower is the template of every follower store's options (ID,
	// Shard and FS are set per node); Node the node options (its Follower
	// is replaced by Follower). The leader's stores get the same
	// WindowCapacity. Defaults: a window of 4096 keys, a 256 KiB memtable,
	// quiet logs, fast redials.
	Follower follower.Options
	Node     follower.NodeOptions
	// Wrap, if set, wraps follower i's Dialer of shard (to stall a link).
	Wrap func(follower int, shard uint32, d replication.Dialer) replication.Dialer
	// Skip, if set, leaves a shard out of the wait for completion and out
	// of verification (a shard a test breaks on purpose).
	Skip func(shard uint32) bool
	// RetransmitTimeout is the leader's retransmit timeout. Default 20ms.
	RetransmitTimeout time.Duration
	// SegmentSize and RetentionInterval are the leader's (wal and leader
	// defaults when 0).
	SegmentSize       int64
	RetentionInterval time.Duration
	// Progress, if set, is called while Run waits for the followers to
	// catch up with the applied and the total LSNs of every follower and
	// shard it waits for.
	Progress func(applied, total uint64)
	// Timeout bounds the run. Default 2 minutes.
	Timeout time.Duration
	// Trace, if set, receives a line per fault, answer and promotion.
	Trace func(format string, args ...any)
	// Rebuild: every follower rebuilds a shard store the leader refuses
	// for good — diverged, or behind its retained WAL — from a snapshot of
	// the current leader's store of that shard (follower.RebuildAuto, the
	// leader as donor), and is then verified like every other follower.
	// Without it such a follower stays refused and is left out of the
	// comparison with the oracle (see point 5 of the package
	// documentation).
	Rebuild bool
	// LateJoiners are follower nodes beyond Followers (f<Followers+1>, …)
	// that join once the client has sent everything: after retention
	// deleted the start of the leader's WAL (Run waits up to 100 ms for
	// it; see Result.JoinsAfterRetention),
	// the leader restarts with the joiner listed — how an operator adds a
	// follower — and the joiner starts on an empty store, which the leader
	// refuses as behind retention and the joiner rebuilds. Needs Rebuild.
	LateJoiners int
}

// ErrBadOptions: Run or RunFailover was given unusable options (every
// problem is listed in the joined error).
var ErrBadOptions = errors.New("sim: bad options")

// badOptions wraps the problems found in one options type, if any.
func badOptions(typ string, errs []error) error { return badopts.Wrap(ErrBadOptions, typ, errs) }

// EnsureDefaults fills unset fields with their documented defaults.
func (c *Options) EnsureDefaults() *Options {
	if c.Workload.Seed == 0 {
		c.Workload.Seed = c.Seed
	}
	c.Workload.EnsureDefaults()
	if c.Shards <= 0 {
		c.Shards = 1
	}
	if c.Followers <= 0 {
		c.Followers = 1
	}
	if c.Skip == nil {
		c.Skip = func(uint32) bool { return false }
	}
	if c.RetransmitTimeout <= 0 {
		c.RetransmitTimeout = 20 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Minute
	}
	// The simulated nodes are quiet unless the caller gives the template a
	// logger: a run restarts hundreds of stores.
	if c.Follower.Store.Logger == nil {
		c.Follower.Store.Logger = discard
	}
	if c.Follower.Store.WindowCapacity == 0 {
		c.Follower.Store.WindowCapacity = 4096
	}
	if c.Follower.Store.PebbleOptions == nil {
		c.Follower.Store.PebbleOptions = smallMemtable
	}
	// Redial fast: fault-injecting links drop all the time, and the
	// production backoff would make a run mostly waiting.
	if c.Follower.ReconnectBackoff == 0 {
		c.Follower.ReconnectBackoff = 2 * time.Millisecond
	}
	if c.Follower.MaxReconnectBackoff == 0 {
		c.Follower.MaxReconnectBackoff = 20 * time.Millisecond
	}
	if c.Node.ReopenBackoff == 0 {
		c.Node.ReopenBackoff = 5 * time.Millisecond
	}
	return c
}

// Validate reports every combination Run cannot carry out in one error
// wrapping ErrBadOptions.
func (c *Options) Validate() error {
	var errs []error
	if c.Promote && c.Followers < 2 {
		errs = append(errs, errors.New("a promotion needs at least 2 followers"))
	}
	if c.Diverge && !c.Promote {
		errs = append(errs, errors.New("Diverge needs Promote (a diverged follower holds a deposed leader's entries)"))
	}
	if c.LateJoiners < 0 || (c.LateJoiners > 0 && !c.Rebuild) {
		errs = append(errs, errors.New("late joiners need Rebuild (the leader refuses an empty store once retention deleted its log's start)"))
	}
	errs = append(errs, c.Workload.problems()...)
	return badOptions("Options", errs)
}

// Restart kinds.
const (
	Clean = iota // Close and reopen
	Kill         // the process dies (unsynced writes the OS holds survive)
	Crash        // power failure: only synced writes survive, and some others
)

// KindName names a restart kind.
func KindName(k int) string { return [...]string{"clean", "kill", "crash"}[k] }

// Result is what happened in a run and whether the invariant held.
type Result struct {
	Workload *Workload
	Elapsed  time.Duration
	// Appends are the leader appends the client made; Logged the events
	// they logged; Refused the requests the leader refused (late writes).
	Appends, Logged, Refused int
	// Distinct are the logged requests that take effect (each once): what
	// a follower that applied the whole history applied.
	Distinct int
	// Lost are events the client saw accepted by a leader that died before
	// they reached the promoted follower (never acknowledged by a majority).
	Lost int
	// Answers are the WaitAcked(AckMajority) answers the client saw, per
	// shard the highest LSN they covered (AnsweredLSN).
	Answers     int
	AnsweredLSN []uint64
	Shards      []ShardResult
	Followers   []FollowerResult
	// LeaderRestarts, LeaderCrashes: restarts of a leader on its directory.
	LeaderRestarts, LeaderCrashes int
	// Promoted is the follower promoted (empty: none); PromotedAt its
	// applied LSN per shard then; Transplants the shards whose store it
	// took from another follower that was further ahead (see the package
	// documentation); Zombie: the deposed leader shipped one more batch
	// after the promotion was decided.
	Promoted    string
	PromotedAt  []uint64
	Transplants int
	Zombie      bool
	// Refusals counts the (follower, shard) pairs the leader refused after
	// the promotion or at a late join, by reason. With Options.Rebuild each
	// was rebuilt from a snapshot and then verified like the others;
	// without, they are left out of the comparison with the oracle, for
	// that reason only.
	Refusals map[string]int
	// LateJoins are the late joiners that joined (Options.LateJoiners),
	// JoinsAfterRetention those that joined after retention had deleted
	// the start of a shard's log of the current epoch (the others: the
	// log started beyond LSN 1 because of the promotion, or at LSN 1);
	// Rebuilds the shard stores rebuilt from a snapshot, over every
	// follower.
	LateJoins, JoinsAfterRetention, Rebuilds int
	// Verified: every follower (and the final leader's store) equals the
	// oracle, every counter is accounted for, every majority answer
	// survived. VerifyErr says why not.
	Verified  bool
	VerifyErr error
}

// ShardResult is one shard's log.
type ShardResult struct {
	Shard    uint32
	Sessions int    // sessions routed to the shard
	Appends  int    // appends of the shard
	LastLSN  uint64 // last LSN of the final history
	Epoch    uint64 // the final leader's epoch
}

// FollowerResult is one follower node.
type FollowerResult struct {
	ID                       string
	Restarts, Kills, Crashes int
	Promoted                 bool
	Late                     bool // joined late (Options.LateJoiners)
	Shards                   []FollowerShard
}

// Total is the sum of the follower's receiver counters over its shards.
func (f *FollowerResult) Total() store.ReceiverStats {
	var t store.ReceiverStats
	for _, s := range f.Shards {
		t = t.Add(s.Receiver)
	}
	return t
}

// FollowerShard is one follower's view of one shard.
type FollowerShard struct {
	Shard      uint32
	AppliedLSN uint64
	Receiver   store.ReceiverStats // over every incarnation
	Shipper    leader.ShipperStats // the leader's stream to it, over every leader incarnation
	Transport  inprocess.Stats     // its link (zero with Options.Transport)
	// Refused names why the leader refused the follower after the
	// promotion or at its late join ("" if it did not): "diverged" or
	// "behind retention". Rebuilt counts the times the store was rebuilt
	// from a snapshot (Options.Rebuild), over every incarnation: an install
	// the node finished after a power failure's image was taken counts,
	// although the image does not hold it (the node then restarts on its
	// old store, is refused again and rebuilds again).
	Refused  string
	Rebuilt  int
	Verified bool
}

type node struct {
	idx     int
	id      string
	dir     string
	fs      vfs.FS
	mem     *vfs.MemFS // fs, when it can crash
	n       *follower.Node
	cut     *atomic.Bool
	stop    context.CancelFunc
	served  chan struct{}
	retired []store.ReceiverStats
	rebuilt []int // rebuilds per shard of earlier incarnations
	gone    bool  // promoted: its stores are the leader's
	res     *FollowerResult
}

type leaderNode struct {
	l      *leader.Leader
	dir    string
	fs     vfs.FS
	mem    *vfs.MemFS
	stop   context.CancelFunc
	done   chan error
	shipTo []int // followers it ships to
}

type run struct {
	cfg      Options
	ctx      context.Context
	rng      *rand.Rand
	clock    *Clock
	client   *Client
	router   leader.ShardRouter
	links    [][]*inprocess.Transport // [follower][shard]
	shardLis []replication.Listener   // with Options.Transport
	donors   leaderDonors             // with Options.Rebuild
	shardDia []replication.Dialer
	nodes    []*node
	lead     *leaderNode
	shipped  map[[2]int]leader.ShipperStats  // [follower, shard] over retired leaders
	refused  map[[2]int]leader.HelloRefusals // [follower, shard] over retired leaders
	logStart []uint64                        // per shard, the first LSN of the current epoch's log
	closers  []func() error                  // of Options.Transport, once everything stopped
	res      *Result
}

// event is one scheduled fault or answer. Everything about it is drawn
// when the run is scheduled, so that timing (how much a crash image keeps)
// never shifts the seed's later choices.
type event struct {
	at      int // before the client's batch at this index (len: after the last)
	kind    int
	who     int  // evFollower: the follower
	restart int  // evFollower: Clean, Kill or Crash
	crash   bool // evLeader: a power failure; evPromote: a zombie leader
	settle  bool // evPromote: every follower caught up before the leader dies
	seq     int
}

// scheduleRNG is the random source of a run's schedule.
func scheduleRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x72756e)) }

// crashRNG is the random source of event e's crash image.
func (r *run) crashRNG(e event) *rand.Rand {
	return rand.New(rand.NewPCG(r.cfg.Seed, 0x6372617368+uint64(e.seq)))
}

const (
	evAnswer = iota
	evFollower
	evLeader
	evPromote
	evJoin // a late joiner joins (after every other event)
)

// Run runs cfg to completion: the whole workload sent, every follower that
// can caught up, then verified. An error means the run could not be carried
// out; a violated invariant is reported in Result.VerifyErr.
func Run(ctx context.Context, cfg Options) (*Result, error) {
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
	clock := NewClock(w.Options.Start)
	r := &run{
		cfg: cfg, ctx: ctx, rng: scheduleRNG(cfg.Seed), clock: clock,
		client: NewClient(w, cfg.Shards, clock), router: router, shipped: map[[2]int]leader.ShipperStats{},
		refused: map[[2]int]leader.HelloRefusals{},
		res:     &Result{Workload: w, Refusals: map[string]int{}, AnsweredLSN: make([]uint64, cfg.Shards)},
	}
	start := time.Now()
	err = r.run()
	r.shutdown()
	if err != nil {
		return nil, err
	}
	r.res.Elapsed = time.Since(start)
	r.res.Verified = r.res.VerifyErr == nil
	return r.res, nil
}

func (r *run) trace(format string, args ...any) {
	if r.cfg.Trace != nil {
		r.cfg.Trace(format, args...)
	}
}

func (r *run) fail(format string, args ...any) {
	if r.res.VerifyErr == nil {
		r.res.VerifyErr = fmt.Errorf(format, args...)
	}
}

func (r *run) run() error {
	cfg := &r.cfg
	if cfg.Transport != nil {
		for s := range uint32(cfg.Shards) {
			l, d, closeFn, err := cfg.Transport(s)
			if err != nil {
				return fmt.Errorf("sim: transport of shard %d: %w", s, err)
			}
			r.closers = append(r.closers, closeFn)
			r.shardLis, r.shardDia = append(r.shardLis, l), append(r.shardDia, d)
		}
	}
	for i := range cfg.Followers + cfg.LateJoiners {
		n := &node{idx: i, id: fmt.Sprintf("f%d", i+1), retired: make([]store.ReceiverStats, cfg.Shards), rebuilt: make([]int, cfg.Shards)}
		n.res = &FollowerResult{ID: n.id, Late: i >= cfg.Followers}
		if cfg.Dir != "" {
			n.fs, n.dir = vfs.Default, filepath.Join(cfg.Dir, n.id)
		} else {
			n.mem = vfs.NewCrashableMem()
			n.fs, n.dir = crashmem.Wrap(n.mem), "/"+n.id
		}
		var links []*inprocess.Transport
		for s := range uint32(cfg.Shards) {
			if cfg.Transport != nil {
				links = append(links, nil)
				continue
			}
			faults := cfg.Faults
			if cfg.LinkFaults != nil {
				faults = cfg.LinkFaults(i, s)
			}
			links = append(links, inprocess.New(faults, ShardSeed(cfg.Seed, uint32(i*cfg.Shards)+s)))
		}
		r.links = append(r.links, links)
		r.nodes = append(r.nodes, n)
	}
	ln := &leaderNode{}
	if cfg.Dir != "" {
		ln.fs, ln.dir = vfs.Default, filepath.Join(cfg.Dir, "leader")
	} else {
		ln.mem = vfs.NewCrashableMem()
		ln.fs, ln.dir = crashmem.Wrap(ln.mem), "/leader"
	}
	for i := range cfg.Followers {
		ln.shipTo = append(ln.shipTo, i)
	}
	r.lead = ln
	r.logStart = make([]uint64, cfg.Shards)
	for s := range r.logStart {
		r.logStart[s] = 1
	}
	if err := r.openLeader(0); err != nil {
		return err
	}
	for _, n := range r.nodes[:cfg.Followers] {
		if err := r.startNode(n); err != nil {
			return err
		}
	}

	batches := len(r.client.w.Batches)
	events := r.schedule(batches)
	for next := 0; ; {
		// The events due before the next batch (a zombie leader sends one
		// batch of its own, so the client may be past an event's mark).
		for ; next < len(events) && events[next].at <= r.client.Sent(); next++ {
			if err := r.do(events[next]); err != nil {
				return err
			}
		}
		if r.client.Done() {
			if next == len(events) {
				break
			}
			continue
		}
		if _, err := r.client.Send(r.lead.l); err != nil {
			return err
		}
	}
	if err := r.catchUp(); err != nil {
		return err
	}
	r.verify()
	return nil
}

// schedule places the configured faults and answers between the batches.
func (r *run) schedule(batches int) []event {
	cfg := &r.cfg
	var evs []event
	add := func(e event) { e.seq = len(evs); evs = append(evs, e) }
	promoteAt := -1
	if cfg.Promote {
		// In the middle third, so that both leaders log something.
		promoteAt = batches/3 + r.rng.IntN(batches/3+1)
		e := event{at: promoteAt, kind: evPromote, crash: r.rng.IntN(3) == 0, settle: r.rng.IntN(2) == 0, who: r.rng.IntN(cfg.Followers)}
		if cfg.Diverge {
			// Caught up, every follower but the promoted one can take the
			// zombie's batch.
			e.crash, e.settle = true, true
		}
		add(e)
	}
	for range cfg.Answers {
		add(event{at: r.rng.IntN(batches + 1), kind: evAnswer})
	}
	for range cfg.Restarts {
		add(event{at: r.rng.IntN(batches + 1), kind: evFollower, who: r.rng.IntN(cfg.Followers), restart: r.rng.IntN(3)})
	}
	for range cfg.LeaderRestarts {
		add(event{at: r.rng.IntN(batches + 1), kind: evLeader, crash: r.rng.IntN(2) == 1})
	}
	for i := range cfg.LateJoiners {
		add(event{at: batches, kind: evJoin, who: cfg.Followers + i})
	}
	slices.SortFunc(evs, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.kind, b.kind), cmp.Compare(a.seq, b.seq))
	})
	return evs
}

func (r *run) do(e event) error {
	switch e.kind {
	case evAnswer:
		return r.answer()
	case evFollower:
		n := r.nodes[e.who]
		if n.gone { // promoted meanwhile: restart another
			n = r.nodes[(e.who+1)%r.cfg.Followers]
		}
		return r.restartNode(n, e.restart, r.crashRNG(e))
	case evLeader:
		return r.restartLeader(e.crash, r.crashRNG(e))
	case evPromote:
		return r.promote(e, r.crashRNG(e))
	case evJoin:
		return r.join(r.nodes[e.who])
	}
	return nil
}

func (r *run) dialer(i int, s uint32) replication.Dialer {
	if r.cfg.Transport != nil {
		return r.shardDia[s]
	}
	return r.links[i][s]
}

func (r *run) followerOptions() follower.Options {
	o := r.cfg.Follower
	o.Store.ID, o.Store.Shard, o.Store.FS = "", 0, nil
	return o
}

// openLeader opens the leader in r.lead's directory: at the stores'
// epoch (0), or promoting a follower's node to epoch.
func (r *run) openLeader(epoch uint64) error {
	ln := r.lead
	ctx, stop := context.WithCancel(r.ctx)
	listeners := make([]replication.Listener, r.cfg.Shards)
	var ids []string
	for _, i := range ln.shipTo {
		ids = append(ids, r.nodes[i].id)
	}
	for s := range listeners {
		if r.cfg.Transport != nil {
			listeners[s] = r.shardLis[s]
			continue
		}
		var ls []replication.Listener
		for _, i := range ln.shipTo {
			ls = append(ls, r.links[i][s])
		}
		listeners[s] = mergeListeners(ctx, ls)
	}
	fo := r.followerOptions()
	l, err := leader.Open(ln.dir, &leader.Options{
		Shards: r.cfg.Shards, Epoch: epoch, Promote: epoch > 0, FS: ln.fs, Wall: r.clock.Now, Logger: discard,
		Store: store.Options{WindowCapacity: fo.Store.WindowCapacity, RetentionHorizon: fo.Store.RetentionHorizon,
			HWMCacheSize: fo.Store.HWMCacheSize, Logger: discard, PebbleOptions: fo.Store.PebbleOptions},
		Followers: ids,
		Listener:  func(s uint32) replication.Listener { return listeners[s] },
		Shipping: leader.ShipperOptions{RetransmitTimeout: r.cfg.RetransmitTimeout,
			MaxBackoff: 10 * r.cfg.RetransmitTimeout, PollInterval: time.Millisecond},
		SegmentSize:       r.cfg.SegmentSize,
		RetentionInterval: r.cfg.RetentionInterval,
		// The client waits for its answers as long as the run: a follower
		// restarting or catching up under heavy faults may take longer
		// than any fixed bound, and answer only asks when a majority serves.
		AckTimeout: -1,
	})
	if err != nil {
		stop()
		return fmt.Errorf("sim: opening the leader in %s: %w", ln.dir, err)
	}
	ln.l, ln.stop, ln.done = l, stop, make(chan error, 1)
	go func() { ln.done <- l.Run(ctx) }()
	if r.cfg.Rebuild {
		if err := r.openDonors(); err != nil {
			return err
		}
	}
	// Every accepted event is in the log, and nothing else: a restarted
	// leader continues exactly where the client's history ends.
	for s := range uint32(r.cfg.Shards) {
		sh, _ := l.Shard(s)
		if last := r.client.LastLSN(s); sh.NextLSN()-1 != last {
			r.fail("leader reopened in %s: shard %d log ends at LSN %d, the client's accepted history at %d", ln.dir, s, sh.NextLSN()-1, last)
		}
	}
	return nil
}

// stopLeader stops the leader's shipping and closes it, keeping its
// shipping figures.
func (r *run) stopLeader() error {
	ln := r.lead
	if ln.l == nil {
		return nil
	}
	r.closeDonors()
	ln.stop()
	err := <-ln.done
	for _, st := range ln.l.Stats() {
		for _, fs := range st.Shipping.Followers {
			i := r.nodeIndex(fs.ID)
			k := [2]int{i, int(st.Shard)}
			r.shipped[k] = addShipperStats(r.shipped[k], fs.ShipperStats)
			r.refused[k] = addRefusals(r.refused[k], fs.Refused)
		}
	}
	if cerr := ln.l.Close(); err == nil {
		err = cerr
	}
	ln.l = nil
	if err != nil {
		return fmt.Errorf("sim: stopping the leader: %w", err)
	}
	return nil
}

func (r *run) nodeIndex(id string) int {
	return slices.IndexFunc(r.nodes, func(n *node) bool { return n.id == id })
}

// restartLeader restarts the leader on its directory: cleanly, or after a
// power failure (its filesystem cloned as a crash would leave it).
func (r *run) restartLeader(crash bool, rng *rand.Rand) error {
	ln := r.lead
	if crash && ln.mem != nil {
		clone := ln.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng})
		_ = r.stopLeader() // writes after the clone land on the lost filesystem
		ln.mem, ln.fs = clone, crashmem.Wrap(clone)
		r.res.LeaderCrashes++
	} else {
		if err := r.stopLeader(); err != nil {
			return err
		}
		r.res.LeaderRestarts++
	}
	r.trace("leader restarted (crash %v) at batch %d", crash && ln.mem != nil, r.client.Sent())
	return r.openLeader(0)
}

func (r *run) startNode(n *node) error {
	o := r.cfg.Node
	o.Follower = r.followerOptions()
	o.Follower.Store.ID, o.Follower.Store.FS = n.id, n.fs
	if r.cfg.Rebuild {
		o.Follower.Rebuild, o.Follower.RebuildFrom = follower.RebuildAuto, r.donors.source(n.id)
	}
	shards := make([]uint32, r.cfg.Shards)
	for s := range shards {
		shards[s] = uint32(s)
	}
	fn, err := follower.OpenNode(n.dir, shards, &o)
	if err != nil {
		return fmt.Errorf("sim: opening follower %s: %w", n.id, err)
	}
	n.n, n.cut = fn, new(atomic.Bool)
	r.serve(n)
	return nil
}

// serve runs the node's Serve until n.pause or n.close.
func (r *run) serve(n *node) {
	ctx, stop := context.WithCancel(r.ctx)
	served, fn, cut := make(chan struct{}), n.n, n.cut
	n.stop, n.served = stop, served
	go func() {
		defer close(served)
		_ = fn.Serve(ctx, func(s uint32) replication.Dialer {
			var d replication.Dialer = cuttable{d: r.dialer(n.idx, s), cut: cut}
			if r.cfg.Wrap != nil {
				d = r.cfg.Wrap(n.idx, s, d)
			}
			return d
		})
	}()
}

// pause stops the node's Serve and waits for it: its positions are final
// until it serves again.
func (n *node) pause() {
	n.stop()
	<-n.served
}

// close closes (or kills) the node and keeps its counters.
func (n *node) close(kill bool) error {
	n.stop()
	var err error
	if kill {
		err = drill.Kill(n.n)
	} else {
		err = n.n.Close()
	}
	<-n.served
	for _, ss := range n.n.Stats().Shards {
		n.retired[ss.Shard] = n.retired[ss.Shard].Add(ss.Receiver)
		n.rebuilt[ss.Shard] += ss.Rebuilds
	}
	return err
}

// restartNode restarts follower n: clean, killed, or after a power
// failure. For a power failure its links are cut first, so that no ack
// leaves it that the crash image may not back.
func (r *run) restartNode(n *node, kind int, rng *rand.Rand) error {
	if kind == Crash && n.mem == nil {
		kind = Kill
	}
	switch kind {
	case Clean:
		if err := n.close(false); err != nil {
			return fmt.Errorf("sim: closing follower %s: %w", n.id, err)
		}
		n.res.Restarts++
	case Kill:
		if err := n.close(true); err != nil {
			return fmt.Errorf("sim: killing follower %s: %w", n.id, err)
		}
		n.res.Kills++
	case Crash:
		if testCrashImage != nil {
			testCrashImage(n.id, false)
		}
		n.cut.Store(true)
		clone := n.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng})
		if testCrashImage != nil {
			testCrashImage(n.id, true)
		}
		// Writes after the clone land on the lost filesystem, and what the
		// node finishes meanwhile (an install: see catchUp) is counted
		// although the image may not hold it.
		_ = n.close(true)
		n.mem, n.fs = clone, crashmem.Wrap(clone)
		n.res.Crashes++
	}
	r.trace("follower %s restarted (%s) at batch %d", n.id, KindName(kind), r.client.Sent())
	return r.startNode(n)
}

// answer waits until a majority of every shard's replicas, the leader
// counted, acknowledged everything the client sent: the answers it then sees must
// survive any later failure.
func (r *run) answer() error {
	for s := range uint32(r.cfg.Shards) {
		lsn := r.client.LastLSN(s)
		if lsn == 0 || r.cfg.Skip(s) || r.res.AnsweredLSN[s] >= lsn || !r.majorityServes(s) {
			continue
		}
		sh, err := r.lead.l.Shard(s)
		if err != nil {
			return err
		}
		if err := sh.WaitAcked(r.ctx, lsn, leader.AckMajority); err != nil {
			return fmt.Errorf("sim: WaitAcked(majority) of shard %d at LSN %d: %w", s, lsn, err)
		}
		r.res.AnsweredLSN[s] = lsn
		r.res.Answers++
		r.trace("answer: shard %d acked by a majority up to LSN %d", s, lsn)
	}
	return nil
}

// majorityServes reports whether enough of the leader's followers of shard
// to make a majority with the leader (leader.AckMajority.Need) can
// acknowledge it (a refused follower never does).
func (r *run) majorityServes(s uint32) bool {
	ok := 0
	for _, i := range r.lead.shipTo {
		if r.nodes[i].res.Shards == nil || r.nodes[i].res.Shards[s].Refused == "" {
			ok++
		}
	}
	return ok >= leader.AckMajority.Need(len(r.lead.shipTo))
}

// promote kills the leader and promotes the most advanced follower: per
// shard the store the promotion policy ranks first (leader.Rank). With
// e.settle the leader dies only once every follower has acknowledged
// everything; else wherever they are. The followers are paused first (the failover controller fences
// them), so their positions are final. With zombie, the deposed leader is not quite dead: after the
// decision it logs one more batch and ships it to one other follower,
// which then holds entries the new history rewrites and must be refused
// as diverged.
func (r *run) promote(e event, rng *rand.Rand) error {
	old, zombie := r.lead, e.crash
	epoch := r.leaderEpoch()
	if e.settle {
		// A leader that dies with every follower caught up (a planned
		// handover, or a quiet moment): every follower continues.
		for s := range uint32(r.cfg.Shards) {
			if lsn := r.client.LastLSN(s); lsn > 0 && !r.cfg.Skip(s) {
				sh, _ := old.l.Shard(s)
				if err := sh.WaitAcked(r.ctx, lsn, leader.AckAll); err != nil {
					return fmt.Errorf("sim: settling shard %d at LSN %d before the promotion: %w", s, lsn, err)
				}
			}
		}
	}
	for _, i := range old.shipTo {
		r.nodes[i].pause()
	}
	// Ties go to the follower the seed names, then round from it.
	order := slices.Clone(old.shipTo)
	k := slices.Index(order, e.who)
	if k < 0 {
		k = 0
	}
	order = append(order[k:], order[:k]...)
	pos := make([][]uint64, len(r.nodes))
	var cands []leader.Candidate
	var owner []int // the node of each candidate
	for _, i := range order {
		n := r.nodes[i]
		pos[i] = make([]uint64, r.cfg.Shards)
		for s := range uint32(r.cfg.Shards) {
			var at replication.Ack
			err := n.n.Follower(s, func(f *follower.Follower) (err error) {
				at, _, err = store.ReadPosition(f.View())
				return err
			})
			if err != nil {
				return err
			}
			pos[i][s] = at.AppliedLSN
			cands, owner = append(cands, leader.Candidate{Holder: n.id, Shard: s, Pos: at}), append(owner, i)
		}
	}
	// The promoted node and, per shard, the store the new history
	// continues are the promotion policy's (leader.Rank, by epoch then LSN):
	// the node most advanced on every shard, else on the most shards.
	rank := leader.Rank(cands)
	p := slices.IndexFunc(r.nodes, func(n *node) bool { return n.id == rank.Promote })
	if p < 0 {
		return fmt.Errorf("sim: the promotion policy chose no follower among %v", cands)
	}
	pn := r.nodes[p]
	rest := slices.DeleteFunc(slices.Clone(old.shipTo), func(i int) bool { return i == p })

	// Per shard, the store the new leader continues is the most advanced
	// one: the promoted node's own, or a copy of a follower that got
	// further (a rebuild of that shard from it before the promotion).
	best := make([]uint64, r.cfg.Shards)
	var srcs []int
	for _, sr := range rank.Shards {
		src := owner[sr.Best]
		if mine := slices.IndexFunc(cands, func(c leader.Candidate) bool { return c.Holder == pn.id && c.Shard == sr.Shard }); rank.MostAdvanced[mine] {
			src = p
		}
		srcs = append(srcs, src)
		best[sr.Shard] = cands[sr.Best].Pos.AppliedLSN
	}
	if zombie && !r.client.Done() {
		// The zombie ships to a follower whose store is not being copied.
		cands := slices.DeleteFunc(slices.Clone(rest), func(i int) bool { return slices.Contains(srcs, i) })
		if len(cands) > 0 {
			if err := r.zombie(r.nodes[cands[rng.IntN(len(cands))]], pos); err != nil {
				return err
			}
		}
	}
	if err := r.stopLeader(); err != nil {
		return err
	}
	r.res.Promoted, r.res.PromotedAt = pn.id, best
	pn.res.Promoted = true
	r.ensureShardResults(pn)
	for s := range pn.res.Shards {
		pn.res.Shards[s].AppliedLSN = best[s] // its stores' positions as the new leader opens them
	}
	if err := pn.close(false); err != nil {
		return fmt.Errorf("sim: closing follower %s for its promotion: %w", pn.id, err)
	}
	for s, src := range srcs {
		if src != p {
			if err := r.transplant(r.nodes[src], pn, uint32(s)); err != nil {
				return err
			}
			r.res.Transplants++
		}
	}
	pn.gone = true
	// The history now is the promoted stores': what the old leader logged
	// beyond them is lost, and no answer the client saw may be among it.
	for s := range uint32(r.cfg.Shards) {
		if r.res.AnsweredLSN[s] > best[s] {
			r.fail("shard %d: the client saw an answer after WaitAcked(majority) up to LSN %d, the promoted history ends at %d",
				s, r.res.AnsweredLSN[s], best[s])
		}
		r.res.Lost += r.client.Truncate(s, best[s])
	}
	// Every other follower continues the new history if it stands exactly
	// where it starts; one behind needs LSNs the new log never had, one
	// ahead holds entries it rewrites.
	for _, i := range rest {
		n := r.nodes[i]
		for s := range uint32(r.cfg.Shards) {
			switch a := pos[i][s]; {
			case a > best[s]:
				r.markRefused(n, s, "diverged")
			case a < best[s]:
				r.markRefused(n, s, "behind retention")
			}
		}
	}
	r.trace("leader died at batch %d; %s promoted at %v (positions %v, zombie %v, answered %v)", r.client.Sent(), pn.id, best, pos, r.res.Zombie, r.res.AnsweredLSN)
	r.lead = &leaderNode{dir: pn.dir, fs: pn.fs, mem: pn.mem, shipTo: rest}
	if err := r.openLeader(epoch + 1); err != nil {
		return err
	}
	for s := range uint32(r.cfg.Shards) {
		sh, _ := r.lead.l.Shard(s)
		r.logStart[s] = sh.Stats().Retention.FirstLSN
	}
	for _, i := range rest {
		r.serve(r.nodes[i])
	}
	return nil
}

func (r *run) markRefused(n *node, s uint32, reason string) {
	r.ensureShardResults(n)
	n.res.Shards[s].Refused = reason
	r.res.Refusals[reason]++
}

func (r *run) ensureShardResults(n *node) {
	if n.res.Shards == nil {
		n.res.Shards = make([]FollowerShard, r.cfg.Shards)
		for s := range n.res.Shards {
			n.res.Shards[s].Shard = uint32(s)
		}
	}
}

func (r *run) leaderEpoch() uint64 {
	sh, _ := r.lead.l.Shard(0)
	return sh.Epoch()
}

// zombie: the deposed leader logs one more client batch and ships it to
// follower g (pos is updated).
func (r *run) zombie(g *node, pos [][]uint64) error {
	hs, err := r.client.Send(r.lead.l)
	if err != nil {
		return err
	}
	r.res.Zombie = true
	r.serve(g)
	for s, h := range hs {
		if h.Count == 0 {
			continue
		}
		sh, err := r.lead.l.Shard(uint32(s))
		if err != nil {
			return err
		}
		if err := sh.WaitAcked(r.ctx, h.LastLSN(), leader.AckOne); err != nil {
			return fmt.Errorf("sim: the zombie leader shipping to %s: %w", g.id, err)
		}
	}
	g.pause()
	for s := range uint32(r.cfg.Shards) {
		lsn, _, err := g.n.Position(s)
		if err != nil {
			return err
		}
		pos[g.idx][s] = lsn
	}
	return nil
}

// catchUp waits until every follower that can has applied the whole final
// history of every shard that is not skipped: its store stands at the
// history's last LSN and the batch ending there is the final leader's (the
// same epoch and CRC). The position alone proves nothing for a follower the
// promotion left diverged: the deposed leader's entries can end at or beyond
// the new history's last LSN. Nor does a rebuild counted for it: a power
// failure's image may not hold an install that the node's old incarnation
// finished on the lost filesystem after the image was taken (restartNode),
// and the node then restarts on the diverged store it had, to be refused and
// rebuilt again.
func (r *run) catchUp() error {
	type target struct {
		n    *node
		s    uint32
		last uint64
		want wal.BatchRef // the final leader's batch ending at last
	}
	var targets []target
	var total uint64
	for _, i := range r.lead.shipTo {
		n := r.nodes[i]
		for s := range uint32(r.cfg.Shards) {
			refused := n.res.Shards != nil && n.res.Shards[s].Refused != ""
			if r.cfg.Skip(s) || (refused && !r.cfg.Rebuild) {
				continue
			}
			sh, _ := r.lead.l.Shard(s)
			last := sh.NextLSN() - 1
			at, want, err := store.ReadLastBatch(sh.Store().View())
			switch {
			case err != nil:
				return fmt.Errorf("sim: reading the last batch of the leader's store of shard %d: %w", s, err)
			case at != last || (last > 0 && want.IsZero()):
				return fmt.Errorf("sim: the leader's store of shard %d stands at LSN %d (batch %v), its log ends at %d", s, at, want, last)
			}
			targets = append(targets, target{n, s, last, want})
			total += last
		}
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		var applied uint64
		done := true
		for _, t := range targets {
			var lsn, stored uint64
			var ref wal.BatchRef
			err := t.n.n.Follower(t.s, func(f *follower.Follower) error {
				lsn, _ = f.Position() // published: synced, in memory
				var err error
				stored, ref, err = store.ReadLastBatch(f.View())
				return err
			})
			if err != nil {
				lsn = 0 // the shard is down (reopening, rebuilding): not there yet
			}
			ok := err == nil && lsn == t.last && stored == t.last && ref == t.want
			if !ok && lsn >= t.last {
				lsn = 0 // another history (diverged, not rebuilt yet) that ends at or beyond the end
			}
			applied += min(lsn, t.last)
			done = done && ok
		}
		if r.cfg.Progress != nil {
			r.cfg.Progress(applied, total)
		}
		if done {
			return nil
		}
		select {
		case <-r.ctx.Done():
			return fmt.Errorf("sim: followers stuck at %d of %d applied LSNs: %w (%s)", applied, total, r.ctx.Err(), r.positions())
		case <-tick.C:
		}
	}
}

// rebuilds is the number of times n's store of shard s was rebuilt, over
// every incarnation.
func (r *run) rebuilds(n *node, s uint32) int {
	k := n.rebuilt[s]
	if n.n != nil && !n.gone {
		for _, ss := range n.n.Stats().Shards {
			if ss.Shard == s {
				k += ss.Rebuilds
			}
		}
	}
	return k
}

func (r *run) positions() string {
	var b []byte
	for _, n := range r.nodes {
		if n.gone {
			continue
		}
		b = fmt.Appendf(b, "%s:", n.id)
		for s := range uint32(r.cfg.Shards) {
			lsn, epoch, err := n.n.Position(s)
			b = fmt.Appendf(b, " %d@%d", lsn, epoch)
			if err != nil {
				b = fmt.Appendf(b, " (%v)", err)
			}
			if l := r.links[n.idx][s]; l != nil {
				st := l.Stats()
				b = fmt.Appendf(b, " (link: dials %d accepts %d disconnects %d)", st.Dials, st.Accepts, st.Disconnects)
			}
		}
		b = append(b, "; "...)
	}
	for s := range uint32(r.cfg.Shards) {
		sh, _ := r.lead.l.Shard(s)
		st := sh.Stats()
		b = fmt.Appendf(b, "leader (epoch %d) shard %d: %d (accepted %d, refused %+v)", st.Epoch, s, st.NextLSN-1, st.Shipping.Accepted, st.Shipping.Refused)
		for _, f := range st.Shipping.Followers {
			b = fmt.Appendf(b, " [%s acked %d connected %v connections %d refused %+v]", f.ID, f.AckedLSN, f.Connected, f.Connections, f.Refused)
		}
		b = append(b, "; "...)
	}
	return string(b)
}

// verify checks the invariant on every follower and on the final leader's
// stores.
func (r *run) verify() {
	o, distinct := r.client.oracle()
	res := r.res
	res.Distinct = distinct
	res.Appends, res.Logged, res.Refused = r.client.Appends, r.client.Logged(), r.client.RefusedClosed+r.client.RefusedExpired
	for s := range uint32(r.cfg.Shards) {
		sh, _ := r.lead.l.Shard(s)
		sr := ShardResult{Shard: s, LastLSN: sh.NextLSN() - 1, Epoch: sh.Epoch()}
		for _, id := range o.Sessions() {
			if r.router.Shard(id) == s {
				sr.Sessions++
			}
		}
		res.Shards = append(res.Shards, sr)
		if r.cfg.Skip(s) {
			continue
		}
		if last := r.client.LastLSN(s); last != sr.LastLSN {
			r.fail("shard %d: the leader's log ends at LSN %d, the client's history at %d", s, sr.LastLSN, last)
		}
		keep := func(id session.ID) bool { return r.router.Shard(id) == s }
		if err := o.VerifyOnly(sh.Store().State(), keep); err != nil {
			r.fail("the leader's own store of shard %d differs from the oracle: %v", s, err)
		}
	}
	for s := range res.Shards {
		res.Shards[s].Appends = r.client.shardAppends[s]
	}
	stats := r.lead.l.Stats()
	for _, n := range r.nodes {
		r.ensureShardResults(n)
		for s := range uint32(r.cfg.Shards) {
			fs := &n.res.Shards[s]
			fs.Receiver = n.retired[s]
			if !n.gone {
				if err := n.n.Follower(s, func(f *follower.Follower) error {
					fs.Receiver = fs.Receiver.Add(f.Stats().Receiver)
					fs.AppliedLSN, _ = f.Position()
					return nil
				}); err != nil {
					r.fail("follower %s shard %d: %v", n.id, s, err)
				}
			}
			fs.Shipper = r.shipped[[2]int{n.idx, int(s)}]
			for _, fst := range stats[s].Shipping.Followers {
				if fst.ID == n.id {
					fs.Shipper = addShipperStats(fs.Shipper, fst.ShipperStats)
				}
			}
			if r.links[n.idx][s] != nil {
				fs.Transport = r.links[n.idx][s].Stats()
			}
			if fs.Receiver.Events != fs.Receiver.Accounted() {
				r.fail("follower %s shard %d: counters do not account for every delivered event: %d delivered, %d accounted (%+v)",
					n.id, s, fs.Receiver.Events, fs.Receiver.Accounted(), fs.Receiver)
			}
			if n.gone || r.cfg.Skip(s) {
				continue
			}
			fs.Rebuilt = r.rebuilds(n, s)
			res.Rebuilds += fs.Rebuilt
			if fs.Refused != "" {
				r.checkRefused(n, s)
				if !r.cfg.Rebuild {
					continue
				}
				if fs.Rebuilt == 0 {
					r.fail("follower %s shard %d was refused (%s) and not rebuilt", n.id, s, fs.Refused)
					continue
				}
			}
			keep := func(id session.ID) bool { return r.router.Shard(id) == s }
			var at, epoch uint64
			err := n.n.Follower(s, func(f *follower.Follower) error {
				at, epoch = f.Position()
				return o.VerifyOnly(f.State(), keep)
			})
			if err != nil {
				r.fail("follower %s shard %d (at LSN %d, epoch %d; refused %q, rebuilt %d) differs from the oracle: %v (replay: ONCEWAL_SEED=%d)",
					n.id, s, at, epoch, fs.Refused, fs.Rebuilt, err, r.cfg.Seed)
				continue
			}
			fs.Verified = true
		}
		res.Followers = append(res.Followers, *n.res)
	}
	// Nobody else was refused: retention never took what a registered
	// follower needed, and no history diverged.
	for _, n := range r.nodes {
		for s := range uint32(r.cfg.Shards) {
			if got := r.refusals(n, s); n.res.Shards[s].Refused == "" && got.Total() > 0 {
				r.fail("follower %s shard %d refused unexpectedly: %+v", n.id, s, got)
			}
		}
	}
}

// checkRefused checks that a follower the promotion left behind or
// diverged, or a late joiner behind retention, was refused for that reason
// and — without Options.Rebuild, which rebuilds it — applied nothing of the
// new epoch.
func (r *run) checkRefused(n *node, s uint32) {
	want := n.res.Shards[s].Refused
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := r.refusals(n, s)
		if (want == "diverged" && got.Diverged > 0) || (want == "behind retention" && got.BehindRetention > 0) {
			break
		}
		if time.Now().After(deadline) {
			lsn, epoch, err := n.n.Position(s)
			r.fail("follower %s shard %d: expected to be refused (%s), leader saw %+v; follower at LSN %d epoch %d (%v); %s",
				n.id, s, want, got, lsn, epoch, err, r.positions())
			return
		}
		time.Sleep(time.Millisecond)
	}
	if r.cfg.Rebuild {
		return // rebuilt since, and then compared with the oracle
	}
	_, epoch, err := n.n.Position(s)
	if err == nil && epoch > r.res.Shards[s].Epoch-1 {
		r.fail("follower %s shard %d was refused (%s) yet applied epoch %d", n.id, s, want, epoch)
	}
}

func (r *run) shutdown() {
	if r.lead != nil && r.lead.l != nil {
		_ = r.stopLeader()
	}
	for _, n := range r.nodes {
		if n.n != nil && !n.gone {
			_ = n.close(false)
		}
	}
	for _, links := range r.links {
		for _, l := range links {
			if l != nil {
				_ = l.Close()
			}
		}
	}
	for _, c := range r.closers {
		_ = c()
	}
}

// refusals are the leader's refusals of n's hellos for shard s, over every
// leader incarnation.
func (r *run) refusals(n *node, s uint32) leader.HelloRefusals {
	got := r.refused[[2]int{n.idx, int(s)}]
	sh, _ := r.lead.l.Shard(s)
	for _, fst := range sh.Stats().Shipping.Followers {
		if fst.ID == n.id {
			got = addRefusals(got, fst.Refused)
		}
	}
	return got
}

func addRefusals(a, b leader.HelloRefusals) leader.HelloRefusals {
	a.BadHello += b.BadHello
	a.UnknownFollower += b.UnknownFollower
	a.Diverged += b.Diverged
	a.BehindRetention += b.BehindRetention
	a.Other += b.Other
	return a
}

func addShipperStats(a, b leader.ShipperStats) leader.ShipperStats {
	a.Connections += b.Connections
	a.BadHellos += b.BadHellos
	a.BatchesSent += b.BatchesSent
	a.BatchesResent += b.BatchesResent
	a.BytesSent += b.BytesSent
	a.Acks += b.Acks
	a.Refusals += b.Refusals
	a.Rewinds += b.Rewinds
	a.Timeouts += b.Timeouts
	a.ReaderErrors += b.ReaderErrors
	a.AckedLSN = max(a.AckedLSN, b.AckedLSN)
	a.SentLSN = max(a.SentLSN, b.SentLSN)
	return a
}

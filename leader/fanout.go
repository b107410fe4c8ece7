package leader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/replication"

	"github.com/oncewal/oncewal/internal/ctxtime"

	"github.com/oncewal/oncewal/wal"
)

// Fanout errors.
var (
	// ErrNoFollowers: WaitAcked on a Fanout with no registered follower.
	ErrNoFollowers = errors.New("leader: no registered followers")
	// ErrBadAckPolicy: an AckPolicy other than AckOne, AckMajority, AckAll.
	ErrBadAckPolicy = errors.New("leader: bad ack policy")
)

// FanoutOptions configures a Fanout.
type FanoutOptions struct {
	// ShipperOptions are the shipping settings of every follower's stream
	// (WALDir, Shard, Listener, Epoch, DurableLSN, VerifyHello, timeouts, …;
	// see ShipperOptions).
	ShipperOptions
	// Followers are registered from the start: each a non-empty
	// ValidFollowerID, no duplicates. Register adds more at run time.
	Followers []string
	// AutoRegister registers a follower the first time its hello names it,
	// instead of refusing it with replication.ErrUnknownFollower. Default false: only
	// the listed and Registered followers are served (see the package documentation
	// for why). An empty ID is refused either way.
	AutoRegister bool
	// OnAcked, if set, is called whenever a follower's acknowledged position
	// changes (its hello, then every ack that moves it), from that
	// follower's stream goroutine; it must not block. A leader records the
	// positions there and persists them at its own pace, e.g. as retention
	// slots. The position can move back (see AckedLSN).
	OnAcked func(id string, ackedLSN uint64)
}

// EnsureDefaults fills unset fields with their documented defaults (those
// of ShipperOptions; the rest default to their zero values).
func (o *FanoutOptions) EnsureDefaults() *FanoutOptions {
	o.ShipperOptions.EnsureDefaults()
	return o
}

// Validate reports every problem of o, its ShipperOptions' included, in one
// error wrapping ErrBadOptions.
func (o *FanoutOptions) Validate() error {
	errs := o.ShipperOptions.problems()
	seen := make(map[string]bool, len(o.Followers))
	for _, id := range o.Followers {
		if err := checkRegisteredID(id); err != nil {
			errs = append(errs, fmt.Errorf("Followers: %w", err))
		} else if seen[id] {
			errs = append(errs, fmt.Errorf("Followers: %q listed twice", id))
		}
		seen[id] = true
	}
	return badShipperOptions(errs)
}

// checkRegisteredID: a follower a Fanout serves has a valid, non-empty ID.
func checkRegisteredID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty (a Fanout serves named followers only)", replication.ErrBadFollowerID)
	}
	return replication.ValidFollowerID(id)
}

// AckPolicy says how many of a shard's registered followers WaitAcked waits
// for.
type AckPolicy uint8

const (
	// AckOne waits for any one registered follower.
	AckOne AckPolicy = 1 + iota
	// AckMajority waits for a majority of the shard's replicas, the leader
	// counted (as Raft's quorum and Kafka's min.insync.replicas count it):
	// with n registered followers, (n+1)/2 of them besides the leader —
	// one of two, two of three. An LSN so acknowledged is on a majority of
	// the replicas, so every majority that survives the leader holds it on
	// at least one follower, and promoting the most advanced survivor
	// keeps it; and one follower of two may be down without stalling
	// writes.
	AckMajority
	// AckAll waits for every registered follower.
	AckAll
)

func (p AckPolicy) String() string {
	switch p {
	case AckOne:
		return "one"
	case AckMajority:
		return "majority"
	case AckAll:
		return "all"
	}
	return fmt.Sprintf("AckPolicy(%d)", uint8(p))
}

// Need is the number of follower acknowledgements p requires of a shard
// with n registered followers (n > 0): 1, (n+1)/2 or n.
func (p AckPolicy) Need(n int) int {
	switch p {
	case AckOne:
		return 1
	case AckMajority:
		return (n + 1) / 2
	default:
		return n
	}
}

// HelloRefusals counts refused follower connections by reason.
type HelloRefusals struct {
	BadHello        uint64 // wrong shard, malformed follower ID, or a VerifyHello error wrapping ErrBadHello
	UnknownFollower uint64 // follower ID not registered, or empty
	Diverged        uint64 // ErrDiverged: the follower's history is not a prefix of this leader's log
	BehindRetention uint64 // replication.ErrBehindRetention: the log no longer holds what the follower needs next
	// DuplicateFollower counts ErrDuplicateFollower: a connection refused
	// because a live one serves its follower ID, or one replaced by a
	// newer connection of its ID.
	DuplicateFollower uint64
	Other             uint64 // any other VerifyHello error (e.g. the check could not read the log)
}

// Total is the number of refused connections.
func (r HelloRefusals) Total() uint64 {
	return r.BadHello + r.UnknownFollower + r.Diverged + r.BehindRetention + r.DuplicateFollower + r.Other
}

type refusalCounters struct {
	badHello, unknown, diverged, behind, duplicate, other atomic.Uint64
}

// count records a refusal and returns its reason's name.
func (c *refusalCounters) count(err error) string {
	switch {
	case errors.Is(err, replication.ErrDuplicateFollower):
		c.duplicate.Add(1)
		return "duplicate follower"
	case errors.Is(err, replication.ErrDiverged):
		c.diverged.Add(1)
		return "diverged"
	case errors.Is(err, replication.ErrBehindRetention):
		c.behind.Add(1)
		return "behind retention"
	case errors.Is(err, replication.ErrUnknownFollower):
		c.unknown.Add(1)
		return "unknown follower"
	case errors.Is(err, replication.ErrBadHello):
		c.badHello.Add(1)
		return "bad hello"
	}
	c.other.Add(1)
	return "other"
}

func (c *refusalCounters) snapshot() HelloRefusals {
	return HelloRefusals{
		BadHello: c.badHello.Load(), UnknownFollower: c.unknown.Load(), Diverged: c.diverged.Load(),
		BehindRetention: c.behind.Load(), DuplicateFollower: c.duplicate.Load(), Other: c.other.Load(),
	}
}

// FollowerStats are one registered follower's figures.
type FollowerStats struct {
	ID        string
	Connected bool          // a connection is in service
	Refused   HelloRefusals // this follower's refused connections (BadHellos is their total)
	DiskReads uint64        // batches its stream read from the WAL, not the cache
	// LagEvents is EndLSN - AckedLSN: the events appended that the follower
	// has not acknowledged. LagBytes is their size in the log: exact while
	// AckedLSN is within the cache, estimated from the mean event size
	// below it.
	LagEvents, LagBytes uint64
	ShipperStats
}

// FanoutStats is a snapshot of a Fanout's figures.
type FanoutStats struct {
	// EndLSN is the end of the log as the Fanout knows it: the last LSN
	// handed to Appended, synced (DurableLSN) or sent, whichever is highest.
	EndLSN    uint64
	Accepted  uint64          // connections accepted from the Listener
	Refused   HelloRefusals   // every refused connection, unknown IDs included
	Followers []FollowerStats // registered followers, by ID
	Cache     CacheStats
}

// Fanout ships one shard's WAL to every registered follower. Create it
// with NewFanout and start it with Run. Its methods are safe for concurrent
// use.
type Fanout struct {
	opts    FanoutOptions
	single  *peer // Shipper mode: the one stream every hello goes to
	running atomic.Bool

	accepted   atomic.Uint64
	refused    refusalCounters
	cache      *batchCache // nil when disabled
	sentEvents atomic.Uint64
	list       atomic.Pointer[[]*peer] // the registered peers, for wakeAll (copied on change)

	mu     sync.Mutex
	peers  map[string]*peer
	run    *runState     // nil unless Run is running
	ackCh  chan struct{} // closed when an acked position or the follower set changes; nil until someone waits
	logged map[string]time.Time
}

// peer is one follower: its counters and the hand-off to its stream.
type peer struct {
	id        string
	stats     shipperCounters
	refused   refusalCounters
	diskReads atomic.Uint64
	connCh    chan struct{} // signalled when pending is set
	wake      chan struct{} // signalled by Notify and Appended

	// Guarded by Fanout.mu.
	acked     uint64
	connected bool
	conn      replication.LeaderConn // the connection in service, nil when none
	pending   *accepted              // newest accepted connection, not yet taken
	abort     context.CancelFunc     // aborts the stream's current connection
	stop      context.CancelFunc     // ends the stream (Unregister, end of Run)
}

type accepted struct {
	conn  replication.LeaderConn
	hello replication.Ack
}

type runState struct {
	ctx   context.Context
	wg    *sync.WaitGroup
	fatal chan error
}

// NewFanout validates opts (every problem in one ErrBadOptions
// error) and returns a Fanout serving opts.Followers.
func NewFanout(opts *FanoutOptions) (*Fanout, error) {
	var o FanoutOptions
	if opts != nil {
		o = *opts
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	return newFanout(o, false), nil
}

func newFanout(opts FanoutOptions, single bool) *Fanout {
	opts.EnsureDefaults()
	opts.Followers = slices.Clone(opts.Followers)
	f := &Fanout{opts: opts, peers: make(map[string]*peer), logged: make(map[string]time.Time)}
	if single {
		f.single = newPeer("")
		f.peers[""] = f.single
	}
	for _, id := range opts.Followers {
		f.peers[id] = newPeer(id)
	}
	if opts.CacheBytes > 0 {
		f.cache = newBatchCache(opts.CacheBytes)
	}
	f.listLocked()
	return f
}

// listLocked publishes the peer set for wakeAll.
func (f *Fanout) listLocked() {
	l := make([]*peer, 0, len(f.peers))
	for _, p := range f.peers {
		l = append(l, p)
	}
	f.list.Store(&l)
}

// Appended hands the Fanout a batch the leader appended: its header and
// encoded bytes (raw is copied; the caller may reuse it). Call it for every
// batch, in log order, once the batch is synced — e.g. from
// LedgerLog's OnAppend — to feed the cache every stream reads first, and to
// wake the streams waiting at the end of the log. A batch that is not of
// this shard or whose length disagrees with its header is ignored (logged).
// Safe for concurrent use; calls out of log order only cost WAL reads (the
// cache restarts at a batch that does not continue it).
func (f *Fanout) Appended(h wal.Header, raw []byte) {
	if h.Shard != f.opts.Shard || h.Count == 0 || len(raw) != h.Size() {
		f.opts.Logger.Warn("leader: shipper: Appended ignored a batch", "shard", f.opts.Shard,
			"batch_shard", h.Shard, "events", h.Count, "bytes", len(raw), "header_bytes", h.Size())
		return
	}
	if f.cache != nil {
		f.cache.add(h, raw)
	}
	f.wakeAll()
}

func newPeer(id string) *peer {
	return &peer{id: id, connCh: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
}

// Register adds a follower. It is served from its next connection on and
// counts towards WaitAcked at once (with nothing acknowledged until it
// connects). Registering a registered ID does nothing.
func (f *Fanout) Register(id string) error {
	if err := checkRegisteredID(id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.registerLocked(id)
	return nil
}

func (f *Fanout) registerLocked(id string) *peer {
	if p, ok := f.peers[id]; ok {
		return p
	}
	p := newPeer(id)
	f.peers[id] = p
	f.listLocked()
	if f.run != nil {
		f.startLocked(p)
	}
	f.ackChangedLocked()
	return p
}

// Unregister removes a follower: its stream stops, its connection is
// closed, it no longer counts towards WaitAcked, and its next hello is
// refused (replication.ErrUnknownFollower) unless it is registered again.
func (f *Fanout) Unregister(id string) error {
	f.mu.Lock()
	p, ok := f.peers[id]
	if !ok || p == f.single {
		f.mu.Unlock()
		return fmt.Errorf("%w: %q", replication.ErrUnknownFollower, id)
	}
	delete(f.peers, id)
	f.listLocked()
	pending := p.pending
	p.pending = nil
	if p.stop != nil {
		p.stop() // the stream closes its connection as it returns
	}
	f.ackChangedLocked()
	f.mu.Unlock()
	if pending != nil {
		pending.conn.Close()
	}
	return nil
}

// Followers returns the registered follower IDs, sorted.
func (f *Fanout) Followers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]string, 0, len(f.peers))
	for id, p := range f.peers {
		if p != f.single {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Run accepts follower connections and ships to every registered follower
// until ctx ends, then returns nil after every goroutine it started has
// stopped. It returns early with ErrFenced (a follower has seen a newer
// epoch) or with the Listener's error once the Listener is closed
// (errors.Is(err, replication.ErrClosed)). Run may be called again after it returned,
// not concurrently (ErrShipperRunning).
func (f *Fanout) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return ErrShipperRunning
	}
	defer f.running.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	run := &runState{ctx: ctx, wg: &wg, fatal: make(chan error, 1)}
	f.mu.Lock()
	f.run = run
	for _, p := range f.peers {
		f.startLocked(p)
	}
	f.mu.Unlock()
	wg.Go(func() { f.acceptLoop(ctx, run.fatal) })
	if f.opts.Notify != nil {
		wg.Go(func() { f.notifyLoop(ctx) })
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-run.fatal:
	}
	cancel()
	f.mu.Lock()
	f.run = nil // no stream starts after this
	for _, p := range f.peers {
		p.stop = nil
	}
	f.mu.Unlock()
	wg.Wait()
	// Connections no stream took are closed only now: the accept loop may
	// dispatch one it accepted as ctx ended, and left open its follower
	// would wait on it forever.
	f.mu.Lock()
	var pending []*accepted
	for _, p := range f.peers {
		if p.pending != nil {
			pending = append(pending, p.pending)
			p.pending = nil
		}
	}
	f.mu.Unlock()
	for _, a := range pending {
		a.conn.Close()
	}
	return err
}

// startLocked starts p's stream for the current Run.
func (f *Fanout) startLocked(p *peer) {
	ctx, stop := context.WithCancel(f.run.ctx)
	p.stop = stop
	fatal := f.run.fatal
	f.run.wg.Go(func() {
		defer stop()
		if err := newShipLoop(f, p).run(ctx); err != nil {
			select {
			case fatal <- err:
			default:
			}
		}
	})
}

func (f *Fanout) notifyLoop(ctx context.Context) {
	for {
		select {
		case <-f.opts.Notify:
			f.wakeAll()
		case <-ctx.Done():
			return
		}
	}
}

// wakeAll wakes every stream waiting at the end of the log.
func (f *Fanout) wakeAll() {
	for _, p := range *f.list.Load() {
		signal(p.wake)
	}
}

func (f *Fanout) acceptLoop(ctx context.Context, fatal chan<- error) {
	backoff := f.opts.PollInterval
	for {
		c, hello, err := f.opts.Listener.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, replication.ErrClosed) {
				select {
				case fatal <- fmt.Errorf("leader: shipper: listener: %w", err):
				default:
				}
				return
			}
			f.opts.Logger.Warn("leader: shipper: accept failed, retrying", "err", err, "retry_in", backoff)
			if ctxtime.Sleep(ctx, backoff) != nil {
				return
			}
			backoff = min(2*backoff, f.opts.MaxBackoff)
			continue
		}
		backoff = f.opts.PollInterval
		f.accepted.Add(1)
		f.dispatch(c, hello)
	}
}

// dispatch hands an accepted connection to its follower's stream, or
// refuses it. It never blocks on a stream.
func (f *Fanout) dispatch(c replication.LeaderConn, hello replication.Ack) {
	f.mu.Lock()
	p, err := f.routeLocked(hello)
	if err == nil && hello.Shard != f.opts.Shard {
		err = fmt.Errorf("%w: %w: the follower asked for shard %d, this leader ships shard %d; start the follower with the leader's shard (oncewal follower --shard %d)",
			replication.ErrBadHello, replication.ErrWrongShard, hello.Shard, f.opts.Shard, f.opts.Shard)
	}
	var replaced replication.LeaderConn
	if err == nil && p != f.single && p.conn != nil {
		if live, ago := connLive(p.conn); live {
			err = fmt.Errorf("%w: %q is already connected from %s (heard from %v ago): another process is using follower ID %s; give each follower its own ID (oncewal follower --id)",
				replication.ErrDuplicateFollower, p.id, remoteAddr(p.conn), ago.Round(time.Millisecond), p.id)
		} else {
			replaced = p.conn
		}
	}
	if err != nil {
		f.mu.Unlock()
		f.refuse(p, hello, err, c)
		return
	}
	old := p.pending
	p.pending = &accepted{c, hello}
	abort := p.abort
	f.mu.Unlock()
	if replaced != nil {
		// Usually the follower restarted before this leader saw its old
		// connection end; if that connection is in fact a second process
		// that answers no heartbeats, it learns why it lost the stream.
		// Ended with its reason before the abort below: the stream,
		// aborted, closes it without one, and the first end wins.
		f.opts.Logger.Warn("leader: shipper: a new connection of a follower replaces its previous one", "shard", f.opts.Shard,
			"follower", p.id, "old_addr", remoteAddr(replaced), "new_addr", remoteAddr(c))
		replication.EndConn(replaced, fmt.Errorf("%w: this connection of %q was replaced by a newer one from %s; if another process uses follower ID %s, give each follower its own ID (oncewal follower --id)",
			replication.ErrDuplicateFollower, p.id, remoteAddr(c), p.id))
	}
	if abort != nil {
		// A Send blocked on the old connection must not keep the new one
		// waiting. (The abort is the context of the connection in service
		// when this one arrived: cancelling it later than under mu only
		// ever cancels that connection.)
		abort()
	}
	if old != nil {
		old.conn.Close() // superseded before its stream took it
	}
	signal(p.connCh)
}

// livenessHeartbeats is how many heartbeat intervals a connection may stay
// silent and still count as live (connLive).
const livenessHeartbeats = 3

// connLive reports whether c's follower is known to be alive: it answered
// within livenessHeartbeats heartbeat intervals (invariant 5). A
// connection whose transport cannot tell (no heartbeats, no PeerConn) is
// not known to be alive; ago is how long it has been silent.
func connLive(c replication.LeaderConn) (live bool, ago time.Duration) {
	pc, ok := c.(replication.PeerConn)
	hc, ok2 := c.(replication.HeartbeatConn)
	if !ok || !ok2 || hc.HeartbeatInterval() <= 0 {
		return false, 0
	}
	ago = time.Since(pc.LastHeard())
	return ago < livenessHeartbeats*hc.HeartbeatInterval(), ago
}

// remoteAddr is c's peer address for log lines and refusals.
func remoteAddr(c replication.LeaderConn) string {
	if pc, ok := c.(replication.PeerConn); ok {
		return pc.RemoteAddr()
	}
	return "an unknown address"
}

// routeLocked finds the stream for hello; p is nil for an unknown follower.
func (f *Fanout) routeLocked(hello replication.Ack) (*peer, error) {
	if f.single != nil {
		return f.single, nil
	}
	if err := replication.ValidFollowerID(hello.FollowerID); err != nil {
		return nil, fmt.Errorf("%w: %w", replication.ErrBadHello, err)
	}
	if hello.FollowerID == "" {
		return nil, fmt.Errorf("%w: anonymous follower (no ID in its hello): give the follower an ID the leader registers (oncewal follower --id, oncewal leader --followers)", replication.ErrUnknownFollower)
	}
	if p, ok := f.peers[hello.FollowerID]; ok {
		return p, nil
	}
	if f.opts.AutoRegister {
		f.opts.Logger.Info("leader: shipper: registered a follower on its first hello", "shard", f.opts.Shard, "follower", hello.FollowerID)
		return f.registerLocked(hello.FollowerID), nil
	}
	return nil, fmt.Errorf("%w: %q is not registered with the leader of shard %d: add %s to the leader's followers (oncewal leader --followers), or start the follower with a registered --id",
		replication.ErrUnknownFollower, hello.FollowerID, f.opts.Shard, hello.FollowerID)
}

// refuse closes a connection whose hello was refused (c, if not nil),
// counts the refusal (also for p, if the follower is known) and logs it,
// once per follower and reason per 30s.
func (f *Fanout) refuse(p *peer, hello replication.Ack, err error, c replication.LeaderConn) {
	// Counted and logged before the follower can see the connection end, so
	// a follower (or test) that observes the refusal finds it accounted. A
	// transport that can carry the reason to the follower (RefusingConn)
	// ends the connection with it.
	if c != nil {
		defer replication.EndConn(c, err)
	}
	reason := f.refused.count(err)
	if p != nil {
		p.refused.count(err)
	}
	key := hello.FollowerID + "\x00" + reason
	now := time.Now()
	f.mu.Lock()
	last, seen := f.logged[key]
	if !seen || now.Sub(last) >= 30*time.Second {
		if len(f.logged) >= 1024 { // IDs come from the network: bound the map
			clear(f.logged)
		}
		f.logged[key] = now
	}
	f.mu.Unlock()
	if !seen || now.Sub(last) >= 30*time.Second {
		f.opts.Logger.Warn("leader: shipper: refused a follower", "shard", f.opts.Shard, "follower", hello.FollowerID,
			"epoch", hello.Epoch, "applied_lsn", hello.AppliedLSN, "reason", reason, "err", err)
	}
}

// takePending returns p's newest accepted connection, if any.
func (f *Fanout) takePending(p *peer) *accepted {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := p.pending
	p.pending = nil
	return a
}

// setConn records p's connection in service, c with its abort, or none
// (nil, nil).
func (f *Fanout) setConn(p *peer, c replication.LeaderConn, abort context.CancelFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p.abort = abort
	p.conn = c
	p.connected = abort != nil
}

func (f *Fanout) setAcked(p *peer, lsn uint64) {
	f.mu.Lock()
	p.acked = lsn
	f.ackChangedLocked()
	registered := f.peers[p.id] == p // not a stream Unregister is stopping
	f.mu.Unlock()
	if f.opts.OnAcked != nil && p != f.single && registered {
		f.opts.OnAcked(p.id, lsn)
	}
}

func (f *Fanout) ackChangedLocked() {
	if f.ackCh != nil {
		close(f.ackCh)
		f.ackCh = nil
	}
}

// waitAcked (Shard.WaitAcked, the one spelling embedders get) blocks until the followers policy asks for (of those registered
// while it waits) have acknowledged every LSN up to and including lsn, or
// ctx ends (ctx.Err()). With no registered follower it returns
// ErrNoFollowers: no policy can be met, and waiting would hang. It works
// whether or not Run is running.
func (f *Fanout) waitAcked(ctx context.Context, lsn uint64, policy AckPolicy) error {
	if policy < AckOne || policy > AckAll {
		return fmt.Errorf("%w: %v", ErrBadAckPolicy, policy)
	}
	for {
		f.mu.Lock()
		n := len(f.peers)
		if n == 0 {
			f.mu.Unlock()
			return ErrNoFollowers
		}
		got := 0
		for _, p := range f.peers {
			if p.acked >= lsn {
				got++
			}
		}
		if got >= policy.Need(n) {
			f.mu.Unlock()
			return nil
		}
		if f.ackCh == nil {
			f.ackCh = make(chan struct{})
		}
		ch := f.ackCh
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// replicas counts the registered followers, those connected, and those
// that have acknowledged lsn: what ErrAckTimeout and ErrQuorumLost report.
func (f *Fanout) replicas(lsn uint64) (registered, connected, acked int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.peers {
		if p == f.single {
			continue
		}
		registered++
		if p.connected {
			connected++
		}
		if p.acked >= lsn {
			acked++
		}
	}
	return registered, connected, acked
}

// AckedLSN returns the position follower id has acknowledged (its latest
// hello, then its acks; 0 before it first connected to this Fanout). It can
// move back when the follower reconnects with less than it had (a NoSync
// follower that lost unsynced batches).
func (f *Fanout) AckedLSN(id string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.peers[id]
	if !ok || p == f.single {
		return 0, fmt.Errorf("%w: %q", replication.ErrUnknownFollower, id)
	}
	return p.acked, nil
}

// Stats returns a snapshot of the figures.
func (f *Fanout) Stats() FanoutStats {
	f.mu.Lock()
	ps := make([]*peer, 0, len(f.peers))
	for _, p := range f.peers {
		if p != f.single {
			ps = append(ps, p)
		}
	}
	f.mu.Unlock()
	slices.SortFunc(ps, func(a, b *peer) int { return strings.Compare(a.id, b.id) })
	st := FanoutStats{EndLSN: f.endLSN(), Accepted: f.accepted.Load(), Refused: f.refused.snapshot()}
	if f.cache != nil {
		st.Cache = f.cache.stats()
	}
	for _, p := range ps {
		st.Followers = append(st.Followers, f.followerStats(p))
	}
	return st
}

// endLSN is the highest LSN the Fanout knows the log holds.
func (f *Fanout) endLSN() uint64 {
	var end uint64
	if f.cache != nil {
		end = f.cache.lastLSN()
	}
	if f.opts.DurableLSN != nil {
		end = max(end, f.opts.DurableLSN())
	}
	for _, p := range *f.list.Load() {
		end = max(end, p.stats.sentLSN.Load())
	}
	return end
}

// lag is how far a follower at acked is behind end, in events and bytes.
func (f *Fanout) lag(acked, end uint64) (events, bytes uint64) {
	if acked >= end {
		return 0, 0
	}
	events = end - acked
	if f.cache != nil && f.cache.lastLSN() == end {
		if b, ok := f.cache.bytesAfter(acked); ok {
			return events, b
		}
	}
	var sumBytes, sumEvents uint64
	if f.cache != nil {
		sumBytes, sumEvents = f.cache.mean()
	}
	if sumEvents == 0 {
		for _, p := range *f.list.Load() {
			sumBytes += p.stats.bytes.Load()
		}
		sumEvents = f.sentEvents.Load()
	}
	if sumEvents > 0 {
		bytes = events * sumBytes / sumEvents
	}
	return events, bytes
}

func (f *Fanout) followerStats(p *peer) FollowerStats {
	c := &p.stats
	f.mu.Lock()
	acked, connected := p.acked, p.connected
	f.mu.Unlock()
	st := FollowerStats{ID: p.id, Connected: connected, Refused: p.refused.snapshot(), DiskReads: p.diskReads.Load()}
	st.LagEvents, st.LagBytes = f.lag(acked, f.endLSN())
	st.ShipperStats = ShipperStats{
		Connections: c.connections.Load(), BadHellos: st.Refused.Total(),
		BatchesSent: c.sent.Load(), BatchesResent: c.resent.Load(), BytesSent: c.bytes.Load(),
		Acks: c.acks.Load(), Refusals: c.refusals.Load(), Rewinds: c.rewinds.Load(),
		Timeouts: c.timeouts.Load(), ReaderErrors: c.readerErrors.Load(),
		AckedLSN: acked, SentLSN: c.sentLSN.Load(),
	}
	return st
}

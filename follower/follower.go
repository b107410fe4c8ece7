package follower

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/oncewal/oncewal/internal/badopts"
	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/internal/rawdb"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/lifegate"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/snapshot"
)

// ErrClosed is returned by methods of a closed Follower.
var ErrClosed = errors.New("follower: closed")

// ErrPermanentRefusal: Serve stopped because the leader (or the transport's
// authentication) refused the follower in a way no retry can fix, and
// Options.StopOnPermanentRefusal is set. It wraps the refusal, so
// errors.Is(err, replication.ErrWrongShard) and the like work.
var ErrPermanentRefusal = errors.New("follower: refused for good")

// Options configures a Follower: its store's options and how Serve reaches
// the leader. Every zero field takes the default named in its comment (see
// EnsureDefaults); Open validates the result and reports all problems at
// once.
type Options struct {
	// Store configures the follower's store (its shard, its ID in the
	// hello, the window, the Applier, the filesystem, ...): store.Options,
	// whose defaults hold.
	Store store.Options
	// ReconnectBackoff is the first wait before Serve redials: after a
	// working connection drops, and after the first failed attempt. It
	// doubles after every further failed attempt (a failed dial, or a
	// connection that ended before it delivered a batch or lasted
	// MaxReconnectBackoff — what a leader refusing the hello looks like) up
	// to MaxReconnectBackoff. Default 100ms.
	ReconnectBackoff time.Duration
	// MaxReconnectBackoff caps the redial wait. Default 5s; at least
	// ReconnectBackoff.
	MaxReconnectBackoff time.Duration
	// ReconnectJitter spreads each redial wait uniformly over
	// [1−J, 1+J] times the backoff, so followers that lost a leader together
	// do not redial it in step. Default 0.5; at most 1; negative: none.
	ReconnectJitter float64
	// StopOnPermanentRefusal makes Serve return ErrPermanentRefusal
	// (wrapping the refusal) at the first connection attempt that fails
	// for a reason no retry can fix: a wrong shard, a fenced leader, a
	// diverged follower or one behind the leader's retained log, an unknown
	// or malformed follower ID, a certificate either side refuses. Default
	// false: Serve keeps redialling at the longest backoff (logging the
	// refusal once at Error), so that an operator's fix on the leader —
	// registering the follower, rotating a certificate — takes effect
	// without a restart.
	StopOnPermanentRefusal bool
	// Rebuild says what Run and Node do when the leader refuses the store
	// in a way only a rebuild fixes (replication.ErrDiverged,
	// ErrBehindRetention — which is also what an empty store gets from a
	// leader whose log no longer starts at LSN 1) or the store is damaged:
	// RebuildAuto, the default here as in the CLI, replaces the store with
	// a snapshot from RebuildFrom and serves on from its LSN; RebuildNever
	// leaves the refusal standing. Auto with no RebuildFrom cannot rebuild:
	// the refusal stands as with never, and the line that logs it says to
	// give a donor (RebuildFrom) or to choose never.
	Rebuild RebuildMode
	// RebuildFrom is the donor a rebuild fetches from: the shard's leader
	// or another follower (snapshot.Donor in process, or grpctransport's
	// snapshot client). Without it nothing is rebuilt. A donor that answers
	// snapshot.ErrClosed (its leader closed) is asked once, not
	// retried: after MaxReconnectBackoff the store goes back to the
	// Dialer, which reaches whichever leader serves now; a new refusal
	// asks RebuildFrom again.
	RebuildFrom snapshot.Source
	// Snapshot configures the rebuild's transfer (chunk size, the RateLimit
	// throttle, retries). Default: snapshot.Options defaults.
	Snapshot snapshot.Options
	// LeaderTimeout bounds the leader's silence on a connection whose
	// leader promised heartbeats (replication.LivenessConn): when nothing
	// — no batch, no heartbeat — arrives for this long while Serve waits
	// for the next batch, the leader is stopped, hung or cut off, and Serve
	// drops the connection (replication.ErrLeaderSilent) and redials, so
	// Stats.Link.Connected and readiness follow the leader's liveness, not
	// only the TCP connection's. Time spent applying does not count. Default
	// DefaultLeaderTimeout (5s: five of the gRPC transport's 1s heartbeats);
	// negative: no bound (a leader that sends no heartbeats gets none).
	LeaderTimeout time.Duration
	// rebuilder is set by Run and Node when they rebuild (RebuildAuto with a
	// RebuildFrom): Serve
	// then returns ErrPermanentRefusal at a refusal only a rebuild fixes
	// (NeedsRebuild), for them to rebuild the store, and keeps redialling
	// at the others unless StopOnPermanentRefusal.
	rebuilder bool
}

// Defaults of the redial options (see Options).
const (
	DefaultReconnectBackoff    = 100 * time.Millisecond
	DefaultMaxReconnectBackoff = 5 * time.Second
	DefaultReconnectJitter     = 0.5
	DefaultLeaderTimeout       = 5 * time.Second
)

// EnsureDefaults fills unset fields with their documented defaults.
func (o *Options) EnsureDefaults() *Options {
	o.Store.EnsureDefaults()
	if o.ReconnectBackoff == 0 {
		o.ReconnectBackoff = DefaultReconnectBackoff
	}
	if o.MaxReconnectBackoff == 0 {
		o.MaxReconnectBackoff = max(DefaultMaxReconnectBackoff, o.ReconnectBackoff)
	}
	if o.ReconnectJitter == 0 {
		o.ReconnectJitter = DefaultReconnectJitter
	}
	if o.LeaderTimeout == 0 {
		o.LeaderTimeout = DefaultLeaderTimeout
	}
	return o
}

// Validate reports every invalid field in one error wrapping ErrBadOptions
// (and store.ErrBadOptions for the store's fields).
func (o *Options) Validate() error { return badOptions("Options", o.problems()) }

// badOptions wraps the problems found in one options type, if any.
func badOptions(typ string, errs []error) error { return badopts.Wrap(ErrBadOptions, typ, errs) }

// problems lists every invalid field.
func (o *Options) problems() []error {
	var errs []error
	if err := o.Store.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.ReconnectBackoff < 0 {
		errs = append(errs, fmt.Errorf("ReconnectBackoff %v is negative", o.ReconnectBackoff))
	}
	if o.MaxReconnectBackoff < o.ReconnectBackoff {
		errs = append(errs, fmt.Errorf("MaxReconnectBackoff %v is below ReconnectBackoff %v", o.MaxReconnectBackoff, o.ReconnectBackoff))
	}
	if !(o.ReconnectJitter <= 1) { // NaN too
		errs = append(errs, fmt.Errorf("ReconnectJitter %v is above 1", o.ReconnectJitter))
	}
	if o.Rebuild > RebuildNever {
		errs = append(errs, fmt.Errorf("Rebuild %d is neither RebuildAuto nor RebuildNever", o.Rebuild))
	}
	sn := o.Snapshot
	if err := sn.EnsureDefaults().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Snapshot: %w", err))
	}
	return errs
}

// Follower serves one shard's Store from a leader: it dials the leader,
// applies what it ships and acknowledges it, redialling whenever the link
// drops.
type Follower struct {
	st   *store.Store
	opts Options
	link linkCounters

	// life orders Apply (a hold) and Serve (a run) against stop (Close,
	// Kill, Retire): after stop no Apply is in flight, every Serve has
	// returned and neither can start.
	life *lifegate.Gate
}

// Open opens (or creates) the follower store in dir and recovers its applied
// position, epoch, HWMs and window from it. It is OpenContext without a
// deadline.
func Open(dir string, opts *Options) (*Follower, error) {
	return OpenContext(context.Background(), dir, opts)
}

// OpenContext opens (or creates) the follower's store in dir
// (OpenStoreContext, which says what it refuses).
func OpenContext(ctx context.Context, dir string, opts *Options) (*Follower, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	st, err := store.OpenContext(ctx, dir, &o.Store)
	if err != nil {
		return nil, err
	}
	lsn, epoch := st.Position()
	o.Store.Logger.Info("oncewal follower opened", "dir", dir, "shard", o.Store.Shard,
		"applied_lsn", lsn, "epoch", epoch, "window", st.Window().Len())
	return &Follower{st: st, opts: o, life: lifegate.New()}, nil
}

// Apply applies one shipped batch (see store.Receiver.Apply). Embedders
// with their own transport call it directly and send back the returned ack.
func (f *Follower) Apply(batch []byte) (store.Result, error) {
	return f.Start(batch).Wait()
}

// Start starts applying one shipped batch without waiting for its WAL sync
// (see store.Receiver.Start): embedders with their own transport that
// pipeline batches call it, then Wait for each Pending in order and send
// its ack. Wait for every Pending before Close.
func (f *Follower) Start(batch []byte) *store.Pending {
	release, ok := f.life.Hold()
	if !ok {
		return store.Refused(f.st.Hello(), ErrClosed)
	}
	defer release()
	return f.st.Start(batch)
}

// stop cancels every Serve, waits for in-flight Applies, forbids new ones and
// new Serves, and waits for the Serves to return. It reports false if the
// follower was already stopped.
func (f *Follower) stop() bool { return f.life.Close() }

// Serve connects through d and applies what the leader ships until ctx ends,
// Close is called, or the store fails (store.ErrFailed, after
// which the follower must be closed and reopened; also
// replication.ErrStaging, an I/O error while composing a batch, which is
// not sticky but is not retried in a loop either), or the Applier fails
// (replication.ErrApply: the follower must be reopened with a fixed Applier;
// see the Applier contract in package replication). It redials whenever the
// link drops, each time stating its durable position in the handshake,
// waiting a jittered backoff (Options.ReconnectBackoff, MaxReconnectBackoff,
// ReconnectJitter) that grows while attempts keep failing. A run of failed
// attempts is logged once at Warn when it starts, once at Error when it
// lasts (at once for a refusal no retry can fix), and at Info when a
// connection works again; every attempt in between at Debug. It returns nil
// when stopped by ctx or Close, and ErrPermanentRefusal at a refusal no
// retry can fix when Options.StopOnPermanentRefusal is set.
func (f *Follower) Serve(ctx context.Context, d replication.Dialer) error {
	ctx, done, ok := f.life.Enter(ctx)
	if !ok {
		return ErrClosed
	}
	defer done()

	log := f.opts.Store.Logger
	backoff := newRedialBackoff(&f.opts)
	var streak linkStreak
	for ctx.Err() == nil {
		start := time.Now()
		f.link.attempts.Add(1)
		conn, err := d.Dial(ctx, f.st.Hello())
		working := false
		if err == nil {
			f.link.serving(conn)
			// A connection works once it delivers a batch; one that stays
			// up for the longest backoff without (an idle leader) counts
			// too, so that its drop is not taken for a refusal.
			err = f.serveConn(ctx, conn, func() {
				working = true
				streak.end(log)
				backoff.reset()
			})
			_ = conn.Close()
			if ctx.Err() != nil {
				f.link.dropped(nil) // stopped: no news about the link
			} else {
				f.link.dropped(err)
			}
			if errors.Is(err, store.ErrApply) {
				log.Error("oncewal follower: the Applier failed; serving stopped: fix the Applier and restart the follower", "err", err)
				return err
			}
			if storeTrouble(err) {
				log.Error("oncewal follower: store failed; close and reopen the follower", "err", err)
				return err
			}
			// A leader that fell silent had accepted the connection and
			// served it: a drop, not a failed attempt.
			if !working && (time.Since(start) >= f.opts.MaxReconnectBackoff || errors.Is(err, replication.ErrLeaderSilent)) {
				working = true
				streak.end(log)
				backoff.reset()
			}
			if errors.Is(err, replication.ErrStaleEpoch) {
				// Refused by this store (a deposed leader's batch), however
				// long the link served before: a refusal, logged and backed
				// off as one.
				working = false
			}
		}
		if ctx.Err() != nil {
			break
		}
		capped := backoff.capped()
		wait := backoff.wait(rand.Float64())
		if working {
			if errors.Is(err, replication.ErrLeaderSilent) {
				// A stopped or cut-off leader is news; a drop the leader saw is not.
				log.Warn("oncewal follower: dropped the connection to a silent leader, reconnecting", "err", err, "next_in", wait)
			} else {
				log.Debug("oncewal follower: link down, redialling", "err", err, "next_in", wait)
			}
		} else {
			f.link.failed(err)
			next, stop := f.afterRefusal(err, wait)
			streak.fail(log, err, capped, wait, next, f.opts.Store.ID)
			if stop {
				return fmt.Errorf("%w: %w", ErrPermanentRefusal, err)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return nil
}

// afterRefusal says what Serve does after the failed attempt err, for the
// log line that reports a refusal: stop (StopOnPermanentRefusal, or a
// rebuild its Run or Node does), or retry after wait.
func (f *Follower) afterRefusal(err error, wait time.Duration) (next string, stop bool) {
	switch {
	case f.opts.rebuilder && NeedsRebuild(err):
		return "rebuilding the store from a snapshot of the leader", true
	case NeedsRebuild(err) && !f.opts.rebuilds() && !f.opts.StopOnPermanentRefusal:
		return fmt.Sprintf("retrying in %v, then at most every %v, but only a rebuild lets it serve: %s",
			wait.Round(time.Millisecond), f.opts.MaxReconnectBackoff, f.opts.noRebuild()), false
	case f.opts.StopOnPermanentRefusal && permanent(err):
		return "stopping: StopOnPermanentRefusal is set (oncewal follower --stop-on-refusal: the process exits 1)", true
	}
	return fmt.Sprintf("retrying in %v, then at most every %v until the leader accepts it",
		wait.Round(time.Millisecond), f.opts.MaxReconnectBackoff), false
}

// pipelineDepth is how many batches serveConn keeps between Start and the
// ack: while batch N's WAL sync is in flight, up to pipelineDepth-1 later
// batches are decided and staged. The shipper keeps more in flight
// (leader.ShipperOptions.MaxInFlight, default 32), so the pipe stays
// full.
const pipelineDepth = 4

// serveConn applies what conn delivers until it fails; delivered is called
// once, at the first batch. Batches are pipelined: the receive loop starts
// each (Receiver.Start) and an acknowledger waits for them in order
// (Pending.Wait) and sends their acks, so no ack reports a position before
// it is synced.
func (f *Follower) serveConn(ctx context.Context, conn replication.FollowerConn, delivered func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pending := make(chan *store.Pending, pipelineDepth-1)
	ackErr := make(chan error, 1)
	var abandoned <-chan *store.Pending // see start; set before pending is closed
	go func() {
		defer func() {
			if abandoned != nil {
				f.st.FinishAbandoned(abandoned)
			}
		}()
		var failed error
		for p := range pending {
			res, err := p.Wait() // every Pending is waited for, also after a failure
			if failed != nil {
				continue
			}
			if storeTrouble(err) || errors.Is(err, replication.ErrStaleEpoch) {
				// A stale epoch: this leader was deposed (a promise or a
				// newer epoch fences it); its refused ack reports the
				// position, which it may know, and the link ends so that
				// Serve redials whoever leads now.
				_ = conn.Send(ctx, res.Ack)
				failed = err
				cancel()
				continue
			}
			if err != nil && !errors.Is(err, replication.ErrSeqGap) && !errors.Is(err, replication.ErrOutOfOrder) {
				f.opts.Store.Logger.Warn("oncewal follower: batch refused", "err", err)
			}
			if err := conn.Send(ctx, res.Ack); err != nil {
				failed = err
				cancel()
			}
		}
		ackErr <- failed
	}()
	var err error
	for first := true; f.st.WaitStalled(ctx); first = false {
		var batch []byte
		if batch, err = f.recvLive(ctx, conn); err != nil {
			break
		}
		f.link.lastBatch.Store(time.Now().UnixNano())
		// A deposed leader's batch (below the store's committed or promised
		// epoch) ends the link before it counts as working: Serve then
		// backs off and redials as after a refusal, instead of taking it up
		// again at once for the next batch to be refused.
		if err = f.st.CheckBatchEpoch(batch); err != nil {
			break
		}
		if first {
			delivered()
		}
		if !f.st.WaitForRoom(ctx) {
			break // the batch is resent after the reconnect
		}
		var p *store.Pending
		if p, abandoned = f.st.StartContext(ctx, batch); p == nil {
			err = fmt.Errorf("%w: %w", store.ErrStalled, ctx.Err())
			break
		}
		pending <- p
	}
	close(pending)
	if abandoned != nil {
		// The acknowledger finishes in the background: it waits for the
		// earlier batches, then the abandoned one.
		return err
	}
	if aerr := <-ackErr; aerr != nil {
		return aerr // the acknowledger's failure is the cause; Recv saw its cancel
	}
	if err == nil {
		err = ctx.Err() // waitStalled gave up
	}
	return err
}

// recvLive is conn.Recv bounded by Options.LeaderTimeout when the leader
// promised heartbeats: it returns replication.ErrLeaderSilent once
// nothing has come from the leader for that long while it waited. The
// silence is counted from the later of the wait's start and the last
// message: while the follower was busy applying, the transport held
// messages back, so their absence says nothing about the leader.
func (f *Follower) recvLive(ctx context.Context, conn replication.FollowerConn) ([]byte, error) {
	lc, ok := conn.(replication.LivenessConn)
	if !ok || lc.HeartbeatInterval() <= 0 || f.opts.LeaderTimeout <= 0 {
		return conn.Recv(ctx)
	}
	waited := time.Now()
	for {
		since, _ := lc.LastHeard()
		if since.Before(waited) {
			since = waited
		}
		left := f.opts.LeaderTimeout - time.Since(since)
		if left <= 0 {
			return nil, fmt.Errorf("%w for %v (no batch, no heartbeat; it promised one every %v): it is stopped, hung or cut off; redialling",
				replication.ErrLeaderSilent, time.Since(since).Round(time.Millisecond), lc.HeartbeatInterval())
		}
		rctx, cancel := context.WithTimeout(ctx, left)
		b, err := conn.Recv(rctx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return b, err
		}
	}
}

// Store is the store the follower serves.
func (f *Follower) Store() *store.Store { return f.st }

// Shard is the shard the follower serves.
func (f *Follower) Shard() uint32 { return f.opts.Store.Shard }

// Position returns the applied LSN and the highest committed epoch.
func (f *Follower) Position() (appliedLSN, epoch uint64) { return f.st.Position() }

// Stats returns a snapshot of the store's counters and the link's.
func (f *Follower) Stats() Stats { return Stats{Stats: f.st.Stats(), Link: f.link.snapshot()} }

// State is the read API of the default session state machine (Store.State).
func (f *Follower) State() *session.State { return f.st.State() }

// LedgerTable is the replicated request-ledger table (Store.LedgerTable).
func (f *Follower) LedgerTable() *idempotency.LedgerTable { return f.st.LedgerTable() }

// Tracker exposes the session HWMs (Store.Tracker).
func (f *Follower) Tracker() *session.Tracker { return f.st.Tracker() }

// View is a live read-only view of the store, for reading an Applier's
// rows (store.View: Get, NewIter; it cannot write).
func (f *Follower) View() *store.View { return f.st.View() }

// Snapshot is a point-in-time read-only view of the store; close it
// (Store.Snapshot).
func (f *Follower) Snapshot() *store.View { return f.st.Snapshot() }

func init() {
	rawdb.Register(func(x any) (*pebble.DB, bool) {
		if f, ok := x.(*Follower); ok {
			return rawdb.Of(f.st), true
		}
		return nil, false
	})
}

// Close stops every Serve, waits for them, and closes the store (Store.Close
// says what a close guarantees and when it gives up waiting).
func (f *Follower) Close() error {
	f.stop()
	return f.st.Close()
}

// Retire stops the follower for good — Serve returns, Apply answers
// ErrClosed — so that a leader can take its store over
// (leader.Promote). The store stays the follower's: Close closes it. It
// refuses a store that has failed.
func (f *Follower) Retire() (*store.Store, error) {
	if !f.stop() {
		return nil, ErrClosed
	}
	if err := f.st.Err(); err != nil {
		return nil, fmt.Errorf("follower: cannot promote a failed store: %w", err)
	}
	return f.st, nil
}

// kill stops the follower the way a killed process stops, for fault drills
// (internal/drill): Serve is cancelled wherever it is and the store is
// closed without the clean-shutdown flush.
func (f *Follower) kill() error {
	f.stop()
	return drill.Kill(f.st)
}

func init() {
	drill.Register(func(x any) (error, bool) {
		switch x := x.(type) {
		case *Follower:
			return x.kill(), true
		case *Node:
			return x.shutdown(false), true
		}
		return nil, false
	})
}

// WALLag estimates how far the store is behind its leader on the WAL clock:
// now minus the time the leader logged the newest event applied, while
// batches keep arriving (one arrived within idle), else 0 — a leader with
// nothing to ship sends nothing, and its caught-up followers cannot tell
// that from lagging. The estimate includes the clock skew between the two
// hosts. A follower cannot see the end of the leader's log; the leader's
// per-follower lag (replication.FollowerStats LagEvents, LagBytes) is
// exact.
func (s Stats) WALLag(now time.Time, idle time.Duration) time.Duration {
	if s.Link.LastBatch == 0 || now.Sub(time.Unix(0, s.Link.LastBatch)) > idle || s.AppliedWALTime == 0 {
		return 0
	}
	return max(0, now.Sub(time.Unix(0, s.AppliedWALTime)))
}

// Stats is a follower's readable state: its store's and its link's.
type Stats struct {
	store.Stats
	// Link describes the connection to the leader (Serve).
	Link LinkStats
}

var _ io.Closer = (*Follower)(nil)

// storeTrouble: err ends Serve so that the embedder closes and reopens the
// follower — the store failed for good (store.ErrFailed), or an
// I/O error composed no batch (replication.ErrStaging: the receiver is still
// usable, but a store that cannot be read is not retried in a loop), or the
// Applier failed (replication.ErrApply: deterministic, it would fail the
// resent batch again, so only a fixed Applier, after a restart, goes on).
func storeTrouble(err error) bool {
	return errors.Is(err, store.ErrFailed) || errors.Is(err, store.ErrStaging) ||
		errors.Is(err, store.ErrApply)
}

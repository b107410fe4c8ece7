package store

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/replication"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Errors of the receiver itself (besides the refusal reasons, refusal.go).
var (
	// ErrApply: the Applier returned an error or panicked (ErrApplierPanic);
	// the batch was not committed. An Applier is deterministic (the
	// Applier contract, doc.go), so the same batch on the same state fails
	// again: a follower's Serve stops instead of retrying it, and a leader's
	// log fails (ErrLogFailed). The remedy is to fix the Applier and reopen
	// the store, which applies the batch again; the error's text says so.
	ErrApply = errors.New("store: applier failed")
	// ErrFailed: the Pebble commit failed. Pebble treats a failed WAL
	// write or sync as fatal, so the receiver refuses all further batches; the
	// embedder must close and reopen the follower, which recovers from disk.
	ErrFailed = errors.New("store: store failed")
)

// ReceiverOptions configures a Receiver. The zero value is usable after
// EnsureDefaults.
type ReceiverOptions struct {
	// Shard is the only shard this receiver accepts. Default 0.
	Shard uint32
	// FollowerID is the follower's stable name, sent in its hello (see
	// Ack.FollowerID and ValidFollowerID). Default "" (anonymous).
	FollowerID string
	// NoSync commits batches without waiting for fsync. Default false: no
	// ack reports a position before it is synced, also a position that a
	// batch whose events were all discarded moved (PositionSyncEvery): the
	// leader deletes its log up to an acknowledged position (replication
	// slots), so that position must survive a crash. With NoSync an ack may
	// cover any batch a power failure loses; the follower then reports its
	// real position at the next handshake and the leader resends, so
	// exactly-once still holds, but the ack no longer proves durability: if
	// the leader's retention deleted what the follower now needs, it is
	// refused (behind retention) until it is rebuilt.
	NoSync bool
	// PositionSyncEvery bounds how many position-only batches in a row
	// (batches that change nothing in the store but the position, epoch
	// unchanged: every event a duplicate) are committed without a WAL sync
	// of their own while earlier batches are in flight (pipelined: Start
	// before the previous Wait): the PositionSyncEvery-th is synced, and so
	// is the WAL when a Pending whose position is not yet synced is waited
	// for with no later batch started (the stream paused). Until then their
	// acks carry the last synced position (invariant 7, doc.go). Default 16;
	// 1 syncs every batch. Ignored with NoSync.
	PositionSyncEvery int
	// GCEvery runs session garbage collection (see session.Tracker) inside
	// every GCEvery-th committed batch. Default 64; negative disables.
	GCEvery int
	// GCLimit bounds the sessions collected per GC pass. Default 1024.
	GCLimit int
	// Logger receives rare diagnostic lines (journal problems). Default
	// slog.Default().
	Logger *slog.Logger
}

// DefaultPositionSyncEvery is ReceiverOptions.PositionSyncEvery's default:
// a run of duplicate-only batches pays one WAL sync per 16 instead of one
// each, and an ack of one lags its batch by at most 15 batches (or until
// the stream pauses), well inside the leader's in-flight window
// (leader.ShipperOptions.MaxInFlight, default 32).
const DefaultPositionSyncEvery = 16

// EnsureDefaults fills unset fields with their defaults and returns o.
func (o *ReceiverOptions) EnsureDefaults() *ReceiverOptions {
	if o.GCEvery == 0 {
		o.GCEvery = 64
	}
	if o.GCLimit <= 0 {
		o.GCLimit = 1024
	}
	if o.PositionSyncEvery <= 0 {
		o.PositionSyncEvery = DefaultPositionSyncEvery
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports every invalid field in one error wrapping ErrBadOptions.
func (o *ReceiverOptions) Validate() error {
	var errs []error
	if err := replication.ValidFollowerID(o.FollowerID); err != nil {
		errs = append(errs, fmt.Errorf("FollowerID: %w", err))
	}
	return badOptions("ReceiverOptions", errs)
}

// Result describes what Apply did with one batch.
type Result struct {
	Ack       replication.Ack // what to send back to the leader
	Committed bool            // a Pebble batch was committed
	Applied   int             // events handed to the Applier
	Discarded int             // events recognised as already applied
	Skipped   int             // events skipped as closed / too old
}

// Receiver is the follower side of one shard: it applies shipped batches
// exactly once. Apply is safe for concurrent use but serialises batches.
type Receiver struct {
	db      *pebble.DB
	tracker *session.Tracker
	window  *idempotency.Store
	applier Applier
	opts    ReceiverOptions
	journal *journal

	mu      sync.Mutex
	applied uint64       // highest LSN handed to the store; batches go in LSN order
	epoch   uint64       // highest epoch handed to the store
	last    wal.BatchRef // the batch ending at applied (zero: unknown)
	// promise is the highest epoch promised to a fencing leader (Promise),
	// persisted; written under mu, read without it by CheckBatchEpoch.
	promise atomic.Uint64
	failed  error // sticky after a fatal store error
	commits uint64
	tail    <-chan struct{}          // done of the last Pending (nil: none yet)
	pos     atomic.Pointer[position] // the durable (synced) applied/epoch/last, read without mu
	// lazyRun counts the position-only batches committed without a sync
	// since the last synced commit (stage order); stage syncs the
	// PositionSyncEvery-th.
	lazyRun int
	// unsynced is the position of the last waited-for Pending committed
	// without a sync and not yet covered by a synced commit (hasUnsynced):
	// what pos becomes at the next sync. Written by Wait only.
	unsynced    position
	hasUnsynced bool
	// lastTime is the WAL time of the last event of the last committed
	// batch (0 before the first commit of this Receiver).
	lastTime atomic.Int64

	// Scratch reused across batches; guarded by mu.
	events  []wal.Event
	in      loaded            // what load read for the batch being decided
	decider decider           // decideBatch's scratch
	cand    []int32           // events whose window hit load looks up
	warm    []idempotency.Key // their keys, prefetched in the window together
	meta    [lastBatchSize]byte

	horizon time.Duration // the tracker's retention horizon

	stats statsCounters
}

// NewReceiver reads the applied position, epoch and window journal from db and
// returns a receiver that continues from them.
func NewReceiver(db *pebble.DB, tracker *session.Tracker, window *idempotency.Store, applier Applier, opts *ReceiverOptions) (*Receiver, error) {
	if db == nil || tracker == nil || window == nil || applier == nil {
		return nil, errors.New("store: NewReceiver needs a db, tracker, window and applier")
	}
	var o ReceiverOptions
	if opts != nil {
		o = *opts
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	r := &Receiver{
		db: db, tracker: tracker, window: window, applier: applier, opts: o,
		horizon: tracker.Options().RetentionHorizon,
	}
	var err error
	if r.applied, err = readMetaU64(db, keyPosition); err != nil {
		return nil, err
	}
	if r.epoch, err = readMetaU64(db, keyEpoch); err != nil {
		return nil, err
	}
	if r.last, err = readLastBatch(db, r.applied); err != nil {
		return nil, err
	}
	promise, err := ReadPromise(db)
	if err != nil {
		return nil, err
	}
	r.promise.Store(promise)
	if r.journal, err = loadJournal(db, window, o.Logger); err != nil {
		return nil, err
	}
	r.pos.Store(&position{r.applied, r.epoch, r.last})
	return r, nil
}

// noteEpoch tells the receiver that epoch was committed to its store outside
// its own batches (a leader raising its epoch, LedgerLog.persistEpoch).
// Nothing may be applied concurrently.
func (r *Receiver) noteEpoch(epoch uint64) {
	r.epoch = epoch
	r.pos.Store(&position{r.applied, r.epoch, r.last})
}

// RaiseEpoch fences the store at a leader's epoch once the store holds the
// leader's whole log (package leader, invariant 6), before any batch is started: an epoch
// above the store's starts a new history after the applied position
// (stageEpoch); otherwise riseStart — where the re-applied log last raised
// the epoch (0: it did not), with risePrev the batch before it — is recorded
// as the current epoch's start, unless the store knows a later one. It
// returns where the store's current epoch starts and the batch before that
// (start 0: unknown, e.g. a store older than the record).
func (r *Receiver) RaiseEpoch(epoch, riseStart uint64, risePrev wal.BatchRef) (start uint64, prev wal.BatchRef, err error) {
	db := r.db
	applied, stored := r.Position()
	b := db.NewBatch()
	defer b.Close()
	switch start, err := readMetaU64(db, keyEpochStart); {
	case err != nil:
		return 0, wal.BatchRef{}, err
	case epoch > stored:
		prev, err := readLastBatch(db, applied)
		if err == nil {
			err = stageEpoch(b, db, epoch, applied, prev)
		}
		if err == nil {
			err = commit(b, true)
		}
		if err != nil {
			return 0, wal.BatchRef{}, fmt.Errorf("store: persisting epoch %d: %w", epoch, err)
		}
		r.noteEpoch(epoch)
	case riseStart > start:
		err := stageEpochStart(b, riseStart, risePrev)
		if err == nil {
			err = commit(b, true)
		}
		if err != nil {
			return 0, wal.BatchRef{}, fmt.Errorf("store: recording where epoch %d starts: %w", epoch, err)
		}
	}
	if start, err = readMetaU64(db, keyEpochStart); err != nil || start == 0 {
		return start, wal.BatchRef{}, err
	}
	prev, err = readBatchRef(db, keyEpochPrev, start-1)
	return start, prev, err
}

// Position returns the highest applied LSN and the highest committed epoch.
// It does not wait for a batch being applied.
func (r *Receiver) Position() (appliedLSN, epoch uint64) {
	p := r.pos.Load()
	return p.applied, p.epoch
}

type position struct {
	applied, epoch uint64
	last           wal.BatchRef
}

// LastEventTime returns the WAL time (the leader's timestamp, unix ns) of
// the last event of the last batch this Receiver committed; 0 before its
// first commit.
func (r *Receiver) LastEventTime() int64 { return r.lastTime.Load() }

// Err returns the sticky store failure (wrapping ErrFailed), or nil.
func (r *Receiver) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// Hello is the handshake a follower sends on (re)connect: its shard, ID,
// committed epoch, applied position and the identity of the batch that ends
// there (zero when the store does not know it).
func (r *Receiver) Hello() replication.Ack {
	p := r.pos.Load()
	return replication.Ack{Shard: r.opts.Shard, Epoch: p.epoch, AppliedLSN: p.applied, FollowerID: r.opts.FollowerID, LastBatch: p.last}
}

// Apply decodes, validates and applies one shipped batch and waits until it
// is durable: Start(raw).Wait(). The returned Result always carries the ack
// to send, also when err is non-nil; Ack.Refused tells the leader to resend
// from Ack.AppliedLSN+1.
//
// Applying is four steps, the way etcd raft separates deciding (Step) from
// doing (Ready/Advance): load reads the HWMs and window hits the batch
// needs; decideBatch, a function of those values, the receiver's position
// and the batch, returns a plan; stage writes the plan into one Pebble
// batch and hands it to Pebble; publish changes memory after that. The
// order of decisions is decideBatch's, and is stated there once.
func (r *Receiver) Apply(raw []byte) (Result, error) { return r.Start(raw).Wait() }

// Pending is a batch Start handed to the store whose WAL sync may still be
// in flight. Wait for it exactly once, in the order of Start.
type Pending struct {
	r    *Receiver
	prev <-chan struct{} // closed when the previous Pending's Wait finished
	done chan struct{}

	b         *pebble.Batch // committed with Sync, its WAL sync not yet waited for
	committed bool          // the batch reached the store (memtable)
	started   time.Time     // when stage handed the batch to Pebble
	latency   time.Duration // from started until it was committed (synced, with Sync)
	pos       position
	lastTime  int64
	counts    batchCounts
	applied   int // events handed to the Applier
	events    int // events in the batch
	res       Result
	err       error
	fixed     bool // made by Refused: Wait returns res and err as they are
	// lazy: committed without a sync, only its position changed (stage);
	// a later synced commit, or Wait's own sync, makes it durable.
	lazy bool
}

// Refused returns a Pending already refused with err, whose Wait returns
// ack (marked refused) and err: for a wrapper that cannot start a batch
// (a closed follower).
func Refused(ack replication.Ack, err error) *Pending {
	ack.Refused = true
	done := make(chan struct{})
	close(done)
	return &Pending{res: Result{Ack: ack}, err: err, done: done, fixed: true}
}

// Start decides and stages one shipped batch and hands it to Pebble, and
// returns without waiting for its WAL sync (Pebble's DB.ApplyNoSyncWait):
// while that sync is in flight, the next batch can be decided and staged.
// The batch is then visible in the store, and the HWMs, window and the
// position the next decision starts from include it (memory follows the
// store); the position Position and Hello report, and every ack, follow
// only the sync (Pending.Wait). Every Pending must be waited for, in the
// order Start returned them: the next one's Wait waits for it.
func (r *Receiver) Start(raw []byte) *Pending {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := &Pending{r: r, prev: r.tail, done: make(chan struct{})}
	r.tail = p.done
	r.stats.batches.Add(1)
	r.stats.bytes.Add(uint64(len(raw)))
	if r.failed != nil {
		p.err = r.failed
		return p
	}

	h, events, err := wal.DecodeBatch(raw, r.events[:0])
	r.events = events[:0]
	if err != nil {
		r.stats.corrupt.Add(1)
		p.err = err
		return p
	}

	// The Applier's read view (see Applier): indexed unless the Applier says
	// it does not read this batch (BatchReader). Closed once its commit is
	// waited for.
	var b *pebble.Batch
	if br, ok := r.applier.(BatchReader); ok && !br.ReadsBatch(events) {
		b = r.db.NewBatch()
	} else {
		b = r.db.NewIndexedBatch()
	}
	ttx := r.tracker.Begin(b)
	pl, err := r.decide(ttx, h, events)
	if err != nil {
		pl = refuse(refusedStore, err) // a load failure: a staging error, not a decision
	}
	inPebble := false
	if pl.verdict == verdictStage {
		pl.refusal, inPebble = r.stage(b, ttx, &pl, p.idle())
	}
	switch pl.verdict {
	case verdictRedelivery:
		ttx.Abort()
		_ = b.Close()
		r.stats.acct.Lock()
		r.stats.events.Add(uint64(len(events)))
		r.stats.duplicateBatches.Add(1)
		r.stats.discardedPosition.Add(uint64(len(events)))
		r.stats.acct.Unlock()
		p.res.Discarded = len(events)
		return p
	case verdictRefuse:
		ttx.Abort()
		if r.failed == nil && pebble.IsCorruptionError(pl.refusal.err) {
			// A read met a block that fails its checksum: no retry of
			// the batch helps, so the store is failed (sticky, as after a
			// failed commit) and the embedder reopens or rebuilds it.
			r.failed = fmt.Errorf("%w: %w", ErrFailed, pl.refusal.err)
			pl.refusal.err = r.failed
		}
		if !inPebble {
			// A batch Pebble failed to commit may still be in its commit
			// pipeline; the store is failed and the batch is left to it.
			_ = b.Close()
		}
		r.stats.acct.Lock()
		r.stats.events.Add(uint64(len(events)))
		pl.refusal.counter(&r.stats).Add(1)
		r.stats.refusedEvents.Add(uint64(len(events)))
		r.stats.acct.Unlock()
		p.err = pl.refusal.err
		return p
	}
	r.publish(ttx, &pl)
	p.committed, p.started = true, pl.started
	p.pos = position{r.applied, r.epoch, r.last}
	p.lastTime = events[len(events)-1].Time
	p.counts, p.applied, p.events = pl.counts, len(pl.keep), len(events)
	p.res = pl.result()
	p.lazy = pl.lazy
	if pl.syncing {
		p.b = b
	} else {
		p.latency = time.Since(pl.started)
		_ = b.Close()
	}
	return p
}

// Wait waits until the batch and every batch started before it are
// durable (or failed) and returns what Apply returns. A failed WAL sync
// makes the store failed: this batch and every later one are refused
// (ErrFailed), also those already in the store's memtable; the
// embedder reopens the follower, which recovers from disk.
//
// A position-only batch stage committed without a sync (Pending.lazy) is
// durable only once a later commit is synced: until then its ack carries
// the last synced position, not its own. When no batch was started after
// this one, nothing later would sync it, so Wait syncs the WAL itself
// (syncIfPaused): the last batch of a burst is acked at its own position.
func (p *Pending) Wait() (Result, error) {
	if p.fixed {
		return p.res, p.err
	}
	r := p.r
	var syncErr error
	if p.b != nil {
		if err := p.b.SyncWait(); err != nil {
			syncErr = fmt.Errorf("%w: WAL sync: %w", ErrFailed, err)
		} else {
			_ = p.b.Close()
		}
		p.b = nil
		p.latency = time.Since(p.started)
	}
	if p.prev != nil {
		<-p.prev
	}
	defer close(p.done)
	synced := false
	if syncErr == nil {
		synced, syncErr = r.syncIfPaused(p)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if syncErr != nil && r.failed == nil {
		r.failed = syncErr
	}
	if p.committed {
		// A batch's events are counted with their outcomes, under acct, so
		// that a Stats snapshot accounts for every event it counts.
		r.stats.acct.Lock()
		r.stats.events.Add(uint64(p.events))
		if r.failed != nil {
			// This batch, or one before it, did not become durable.
			r.stats.applyErrors.Add(1)
			r.stats.refusedEvents.Add(uint64(p.events))
			p.res, p.err = Result{}, r.failed
		} else {
			r.stats.add(&p.counts, p.applied)
			r.stats.committed.Add(1)
		}
		r.stats.acct.Unlock()
		if p.err == nil {
			r.stats.commitLatency.Observe(p.latency)
			r.lastTime.Store(p.lastTime)
			if p.lazy {
				r.unsynced, r.hasUnsynced = p.pos, true
			} else {
				// Synced (or NoSync): it covers every commit before it.
				r.pos.Store(&p.pos)
				r.hasUnsynced = false
			}
		}
	}
	if synced && r.failed == nil && r.hasUnsynced {
		pos := r.unsynced
		r.pos.Store(&pos)
		r.hasUnsynced = false
		if r.tail == p.done {
			r.lazyRun = 0 // nothing was started since the sync: it covered every commit
		}
	}
	pos := r.pos.Load()
	p.res.Ack = replication.Ack{Shard: r.opts.Shard, Epoch: pos.epoch, AppliedLSN: pos.applied, Refused: p.err != nil}
	return p.res, p.err
}

// syncIfPaused syncs Pebble's WAL when p leaves a commit unsynced — its own
// (lazy) or an earlier Pending's — and no batch was started after p: no
// later commit is coming to sync it, and its ack would hold back a
// position the leader may be waiting for (a quorum) for as long as the
// stream stays idle. The sync runs outside mu so that a batch arriving
// meanwhile is decided and staged; it covers every commit before it in
// the WAL, this one's included. synced reports that it ran and
// succeeded; a failure wraps ErrFailed.
func (r *Receiver) syncIfPaused(p *Pending) (synced bool, err error) {
	if p.committed && !p.lazy {
		return false, nil // synced (or NoSync): it covers every commit before it
	}
	r.mu.Lock()
	due := r.failed == nil && r.tail == p.done && (p.lazy || r.hasUnsynced)
	r.mu.Unlock()
	if !due {
		return false, nil
	}
	if err := recoverFatal(func() error { return r.db.LogData(nil, pebble.Sync) }); err != nil {
		return false, fmt.Errorf("%w: WAL sync: %w", ErrFailed, err)
	}
	return true, nil
}

// idle reports that every Pending started before p was waited for: no
// batch is in flight, as for every Apply, or when the stream had paused.
func (p *Pending) idle() bool {
	if p.prev == nil {
		return true
	}
	select {
	case <-p.prev:
		return true
	default:
		return false
	}
}

// stage writes plan p into b — the HWM advances decided (ttx, then
// ttx.Flush), the Applier's writes of the surviving events, session GC every GCEvery-th commit, the
// window journal, the position, batch identity and epoch — and hands b to
// Pebble: with Sync, without waiting for the WAL sync (p.syncing; Wait
// waits), or, for a batch that changed only the position, maybe without
// a sync (p.lazy; syncPolicy, told whether idle). It returns the refusal
// if any step fails, and whether b reached Pebble's commit pipeline (then
// it must not be closed on failure); a failed commit also makes the store
// failed (sticky). Memory is untouched.
func (r *Receiver) stage(b *pebble.Batch, ttx *session.TrackerTx, p *plan, idle bool) (_ *refusal, inPebble bool) {
	fail := func(kind refusalKind, err error) *refusal {
		p.verdict = verdictRefuse
		return &refusal{kind: kind, err: err}
	}
	if err := stageHWMs(ttx, p, r.in.slots); err != nil {
		return fail(refusedStore, err), false
	}
	if err := callApplier(r.opts.Logger, r.applier.Apply, b, p.keep); err != nil {
		return fail(refusedApply, applyFailed(p.h, err)), false
	}
	if err := ttx.Flush(); err != nil {
		return fail(refusedStore, fmt.Errorf("%w: HWM flush: %w", ErrStaging, err)), false
	}
	if r.opts.GCEvery > 0 && (r.commits+1)%uint64(r.opts.GCEvery) == 0 {
		if _, err := ttx.CollectGarbage(r.opts.GCLimit); err != nil {
			return fail(refusedStore, fmt.Errorf("%w: session GC: %w", ErrStaging, err)), false
		}
	}
	if err := r.journal.stage(b, p.h.LastLSN(), p.record, r.window); err != nil {
		return fail(refusedStore, fmt.Errorf("%w: window journal: %w", ErrStaging, err)), false
	}
	// Position-only, exactly: nothing written before the metadata (no
	// state row, HWM delta or checkpoint, clock, GC deletion, journal
	// entry or pruning), and the metadata only the position and batch
	// identity (stageMeta adds the epoch and format keys when they change).
	positionOnly := b.Empty() && p.epoch == r.epoch && r.applied != 0
	if err := r.stageMeta(b, p.h.LastLSN(), p.epoch, p.last); err != nil {
		return fail(refusedStore, fmt.Errorf("%w: metadata: %w", ErrStaging, err)), false
	}
	p.syncing, p.lazy = r.syncPolicy(positionOnly, idle)
	p.started = time.Now()
	if err := startCommit(r.db, b, p.syncing); err != nil {
		r.failed = fmt.Errorf("%w: %w", ErrFailed, err)
		return fail(refusedStore, r.failed), true
	}
	r.commits++
	switch {
	case p.lazy:
		r.lazyRun++
	case p.syncing:
		r.lazyRun = 0
	}
	return nil, true
}

// syncPolicy says how stage commits a batch: with Sync (syncing), or
// without, its durability left to a later synced commit (lazy).
//
// No ack reports a position a crash could lose (invariant 7): the leader
// deletes its log up to an acknowledged position (its replication slot),
// and a follower that came back below it would need a batch the leader no
// longer holds. A batch that changed anything besides the position is
// synced before its ack, as its own commit. One that changed only the
// position (positionOnly: its events all discarded or skipped, stage
// wrote nothing but the position and batch identity, the epoch unchanged)
// holds nothing a crash could lose but the position — re-delivered, it
// is decided the same way — so it is committed without a sync and its
// ack reports the last synced position instead: Pebble's WAL is one
// ordered log, so the next synced commit (or Pending.Wait's sync when the
// stream pauses) makes it durable too. The PositionSyncEvery-th such
// batch in a row is synced, which bounds how far the acks lag. So is one
// started idle (every earlier Pending waited for: an Apply, the first batch
// after a pause): nothing in flight suggests a later batch soon, and Wait
// would sync it anyway, with a second commit (DB.LogData). With NoSync
// nothing is synced.
func (r *Receiver) syncPolicy(positionOnly, idle bool) (syncing, lazy bool) {
	switch {
	case r.opts.NoSync:
		return false, false
	case positionOnly && !idle && r.lazyRun+1 < r.opts.PositionSyncEvery:
		return false, true
	}
	return true, false
}

// Validate runs the Applier's Validate (a Validator's; see there) on a
// batch not logged yet, with header h and events stamped and given their
// LSNs: decide picks the events Apply would get, as it would for the
// logged batch, and Validate reads a scratch indexed batch over the
// store. Nothing is written and memory is untouched (decide changes
// nothing; ttx only caches what it read). It returns Validate's reason
// wrapped in ErrRejected, or ErrApply for a panic; a failure to load what
// deciding needs is returned as it is (ErrStaging).
func (r *Receiver) Validate(v Validator, h wal.Header, events []wal.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed != nil {
		return r.failed
	}
	b := r.db.NewIndexedBatch()
	defer b.Close()
	ttx := r.tracker.Begin(b)
	defer ttx.Abort()
	p, err := r.decide(ttx, h, events)
	if err != nil {
		return err
	}
	if p.verdict != verdictStage || len(p.keep) == 0 {
		return nil // a refusal here is the logged batch's to report
	}
	err = callApplier(r.opts.Logger, v.Validate, b, p.keep)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrApplierPanic):
		return applyFailed(h, err)
	}
	return fmt.Errorf("%w: %w", ErrRejected, err)
}

// stageHWMs records in ttx the HWM advances p decided (every event step 3
// let through, with a SeqNo; the close of a closing one), finding each
// session by the slot load numbered it (slots). ttx checks each against its
// own view, so a decision the tracker disagrees with fails the batch
// (ErrStaging wrapping the tracker's error) instead of writing it.
func stageHWMs(ttx *session.TrackerTx, p *plan, slots []int32) error {
	if !p.advanced {
		return nil
	}
	for i, f := range p.fates {
		if f != fateApply && f != fateInBatch && f != fateWindow {
			continue
		}
		ev := &p.events[i]
		if ev.Seq == 0 {
			continue
		}
		if err := ttx.AdvanceLoaded(slots[i], ev.Session, ev.Seq, ev.Time); err != nil {
			return fmt.Errorf("%w: HWM advance: %w", ErrStaging, err)
		}
		if ev.Op == wal.OpClose {
			if err := ttx.MarkClosed(ev.Session, ev.Time); err != nil {
				return fmt.Errorf("%w: HWM close: %w", ErrStaging, err)
			}
		}
	}
	return nil
}

// publish makes memory follow the batch stage handed to the store
// (invariant 4 of doc.go): the tracker's HWMs, the window, the journal's
// state, and the position, epoch and batch identity the next decision
// starts from. The position reported outside (Position, Hello, acks) moves
// in Pending.Wait, after the WAL sync.
func (r *Receiver) publish(ttx *session.TrackerTx, p *plan) {
	ttx.Commit()
	for _, k := range p.record {
		r.window.CheckAndRecord(k)
	}
	r.journal.committed(r.window.Evictions())
	r.applied, r.epoch, r.last = p.h.LastLSN(), p.epoch, p.last
}

// commit commits b (LedgerLog's writes), turning Pebble's fatal-commit log
// call into an error (see recoverFatal).
func commit(b *pebble.Batch, sync bool) error {
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
	}
	return recoverFatal(func() error { return b.Commit(opts) })
}

// startCommit hands b to db: with sync through DB.ApplyNoSyncWait, which
// returns once b is in the memtable (the caller must Batch.SyncWait before
// closing b), without as a NoSync apply.
func startCommit(db *pebble.DB, b *pebble.Batch, sync bool) error {
	if !sync {
		return recoverFatal(func() error { return db.Apply(b, pebble.NoSync) })
	}
	return recoverFatal(func() error { return db.ApplyNoSyncWait(b, pebble.Sync) })
}

// recoverFatal runs f, turning Pebble's fatal-commit log call (which our
// FatalLogger turns into a panic) into an error.
func recoverFatal(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			fe, ok := p.(*FatalError)
			if !ok {
				panic(p)
			}
			err = fe
		}
	}()
	return f()
}

// FatalError is the panic value of FatalLogger.Fatalf and the error Apply
// returns (wrapped in ErrFailed) when Pebble declares a commit fatal.
type FatalError struct{ Msg string }

func (e *FatalError) Error() string { return e.Msg }

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
	// NoSync commits batches without waiting for fsync. Default false: every
	// batch is synced before it is acknowledged, also one whose events were
	// all discarded (it changes only the position): the leader deletes its
	// log up to an acknowledged position (replication slots), so that
	// position must survive a crash. With NoSync an ack may cover any batch
	// a power failure loses; the follower then reports its real position at
	// the next handshake and the leader resends, so exactly-once still
	// holds, but the ack no longer proves durability: if the leader's
	// retention deleted what the follower now needs, it is refused (behind
	// retention) until it is rebuilt.
	NoSync bool
	// GCEvery runs session garbage collection (see session.Tracker) inside
	// every GCEvery-th committed batch. Default 64; negative disables.
	GCEvery int
	// GCLimit bounds the sessions collected per GC pass. Default 1024.
	GCLimit int
	// Logger receives rare diagnostic lines (journal problems). Default
	// slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills unset fields with their defaults and returns o.
func (o *ReceiverOptions) EnsureDefaults() *ReceiverOptions {
	if o.GCEvery == 0 {
		o.GCEvery = 64
	}
	if o.GCLimit <= 0 {
		o.GCLimit = 1024
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
	failed  error        // sticky after a fatal store error
	commits uint64
	tail    <-chan struct{}          // done of the last Pending (nil: none yet)
	pos     atomic.Pointer[position] // the durable (synced) applied/epoch/last, read without mu
	// lastTime is the WAL time of the last event of the last committed
	// batch (0 before the first commit of this Receiver).
	lastTime atomic.Int64

	// Scratch reused across batches; guarded by mu.
	events  []wal.Event
	keep    []wal.Event
	fates   []fate
	inBatch map[idempotency.Key]struct{}
	cand    []int32           // events decide's step 4 looks at
	warm    []idempotency.Key // their keys, prefetched in the window together
	record  []idempotency.Key
	meta    [lastBatchSize]byte

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
		inBatch: make(map[idempotency.Key]struct{}),
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
// Applying is three steps, the way etcd raft separates deciding (Step) from
// doing (Ready/Advance): decide reads the receiver's position, the tracker's
// view and the window and returns a plan without writing anything; stage
// writes the plan into one Pebble batch and hands it to Pebble; publish
// changes memory after that. The order of decisions is decide's, and is
// stated there once.
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
	pl := r.decide(ttx, h, events)
	inPebble := false
	if pl.verdict == verdictStage {
		pl.refusal, inPebble = r.stage(b, ttx, &pl)
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
	p.res = Result{Committed: true, Applied: len(pl.keep),
		Discarded: pl.counts.position + pl.counts.hwm + pl.counts.window + pl.counts.inBatch,
		Skipped:   pl.counts.closed + pl.counts.tooOld}
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
	r.mu.Lock()
	defer r.mu.Unlock()
	defer close(p.done)
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
			r.pos.Store(&p.pos)
			r.lastTime.Store(p.lastTime)
		}
	}
	pos := r.pos.Load()
	p.res.Ack = replication.Ack{Shard: r.opts.Shard, Epoch: pos.epoch, AppliedLSN: pos.applied, Refused: p.err != nil}
	return p.res, p.err
}

// verdict is decide's answer for a whole batch.
type verdict uint8

const (
	// verdictStage: stage and commit the plan (some events may be
	// discarded; the position advances either way).
	verdictStage verdict = iota
	// verdictRedelivery: the batch lies wholly at or below the applied
	// position (or is empty); nothing is written and the ack repeats the
	// position.
	verdictRedelivery
	// verdictRefuse: nothing is written; the ack is refused.
	verdictRefuse
)

// fate is what decide did with one event.
type fate uint8

const (
	fateApply    fate = iota // handed to the Applier
	fatePosition             // at or below the applied position
	fateHWM                  // SeqNo at or below its session's HWM
	fateClosed               // session closed
	fateTooOld               // session expired and SeqNo > 1
	fateInBatch              // idempotency key seen earlier in the batch
	fateWindow               // idempotency key in the window (SeqNo consumed)
	fateGap                  // SeqNo above HWM+1: the batch is refused
)

var fateNames = [...]string{"apply", "position", "hwm", "closed", "too-old", "in-batch", "window", "gap"}

func (f fate) String() string { return fateNames[f] }

// refusalKind names the Stats counter a refusal adds to.
type refusalKind uint8

const (
	refusedWrongShard refusalKind = iota
	refusedStaleEpoch
	refusedOutOfOrder
	refusedSeqGap
	refusedStore // I/O failure while deciding or staging (incl. the commit)
	refusedApply // the Applier failed
)

// refusal is a refused batch: the error Apply returns and its counter.
type refusal struct {
	kind refusalKind
	err  error
}

func (f *refusal) counter(s *statsCounters) *counter {
	switch f.kind {
	case refusedWrongShard:
		return &s.wrongShard
	case refusedStaleEpoch:
		return &s.staleEpochs
	case refusedOutOfOrder:
		return &s.outOfOrder
	case refusedSeqGap:
		return &s.seqGaps
	}
	return &s.applyErrors
}

// plan is decide's result for one batch: a refusal, a redelivery, or what to
// stage — the surviving events, the idempotency keys to record, whether any
// HWM advanced, the epoch and batch identity to persist, and the counts.
// Its slices are the receiver's scratch, valid until the next Apply.
type plan struct {
	verdict  verdict
	refusal  *refusal
	h        wal.Header
	events   []wal.Event
	fates    []fate // fates[i]: what happened to events[i] (verdictStage, or up to a gap)
	keep     []wal.Event
	record   []idempotency.Key
	advanced bool // some session's HWM advanced (its SeqNo was consumed)
	epoch    uint64
	last     wal.BatchRef
	counts   batchCounts
	syncing  bool      // stage committed b with Sync and did not wait for it
	started  time.Time // when stage handed b to Pebble
}

func refuse(kind refusalKind, err error) plan {
	return plan{verdict: verdictRefuse, refusal: &refusal{kind: kind, err: err}}
}

// maxKeptMap is the most entries a per-batch scratch map may have held for
// the receiver to clear and keep it rather than allocate a new one.
const maxKeptMap = 1 << 13

// decide takes every decision about a batch before anything is written, in
// this order:
//  1. shard (ErrWrongShard) and epoch fencing (ErrStaleEpoch; a newer epoch
//     overlapping applied LSNs: ErrDiverged);
//  2. position: a batch wholly at or below the applied LSN (or empty) is a
//     redelivery; one starting past applied+1 is refused (ErrOutOfOrder);
//  3. per event, in log order: an LSN at or below the applied position is
//     discarded; then the SeqNo against the session's HWM as the tracker's
//     overlay sees it (duplicate, closed, too old: skipped; a gap refuses the
//     whole batch, ErrSeqGap); an applied SeqNo advances the HWM in the
//     overlay (and closes the session for OpClose) whether or not the window
//     then suppresses the operation, so the next SeqNo is not a gap;
//  4. then, per event step 3 let through, in log order, the idempotency key
//     (data events only): a key seen earlier in the batch, then one in the
//     window, suppresses the operation; every distinct key is recorded.
//     (Running step 3 over the whole batch first decides exactly what
//     running both steps event by event would: see below.)
//
// Decoding and checksums come before decide (wal.DecodeBatch). decide
// changes only ttx's pending overlay, which Abort drops.
func (r *Receiver) decide(ttx *session.TrackerTx, h wal.Header, events []wal.Event) plan {
	if h.Shard != r.opts.Shard {
		return refuse(refusedWrongShard, fmt.Errorf("%w: batch shard %d, receiver shard %d", replication.ErrWrongShard, h.Shard, r.opts.Shard))
	}
	if h.Epoch < r.epoch {
		return refuse(refusedStaleEpoch, fmt.Errorf("%w: batch epoch %d < %d: it comes from a deposed leader; point this follower at the current leader", replication.ErrStaleEpoch, h.Epoch, r.epoch))
	}
	if h.Epoch > r.epoch && h.FirstLSN <= r.applied {
		return refuse(refusedStaleEpoch, fmt.Errorf("%w: epoch %d batch starts at LSN %d, but LSNs up to %d were applied under epoch %d",
			replication.ErrDiverged, h.Epoch, h.FirstLSN, r.applied, r.epoch))
	}
	if len(events) == 0 || h.LastLSN() <= r.applied {
		return plan{verdict: verdictRedelivery, h: h, events: events}
	}
	if h.FirstLSN > r.applied+1 {
		return refuse(refusedOutOfOrder, fmt.Errorf("%w: batch starts at LSN %d, applied %d", replication.ErrOutOfOrder, h.FirstLSN, r.applied))
	}

	p := plan{verdict: verdictStage, h: h, events: events, epoch: max(r.epoch, h.Epoch), last: h.Ref(),
		fates: r.fates[:0], keep: r.keep[:0], record: r.record[:0]}
	defer func() { r.fates, r.keep, r.record = p.fates[:0], p.keep[:0], p.record[:0] }()
	if len(r.inBatch) > maxKeptMap {
		// A Go map keeps the capacity it grew to, and clearing it costs
		// that capacity: after one huge batch (a catch-up, a preload)
		// every later batch would pay it (~90 µs per batch after a
		// 25,000-event one). Start over instead.
		r.inBatch = make(map[idempotency.Key]struct{}, len(events))
	} else {
		clear(r.inBatch)
	}
	// Touch every session's cache slot first, so that the batch's cache
	// misses overlap instead of stalling the checks one at a time (a hint:
	// it reads no Pebble and changes nothing). With 100K random sessions
	// this takes a duplicate's HWM check from ~290 to ~110 cpu-ns
	// (go test ./bench -bench 'TrackerCheckDuplicate/warm').
	for i := range events {
		if ev := &events[i]; ev.Seq != 0 && ev.LSN > r.applied {
			ttx.Prefetch(ev.Session)
		}
	}
	// Step 3 for every event, then step 4 for those it let through, in log
	// order: the window's outcome never changes an HWM decision (the HWM
	// advances either way) and a gap refuses the whole batch, so this is
	// the same as both steps event by event. It lets the window's lines of
	// the events that reach it be prefetched between the steps, all
	// together (Store.PrefetchKeys: a retry's key is resident, and its
	// slot, entry and neighbours are read by the check and by publish's
	// recency update), without prefetching them for duplicates the HWM
	// stops. One Store.Prefetch per event as step 3 found it waited for two
	// cache misses per key in turn (~160 ns per retry, a sixth of the retry
	// path's CPU).
	cand, warm := r.cand[:0], r.warm[:0]
	defer func() { r.cand, r.warm = cand[:0], warm[:0] }()
	for i := range events {
		ev := &events[i]
		f, err := r.decideHWM(ttx, ev, &p)
		if err != nil {
			r.decideWindow(&p, cand)
			fates := p.fates
			p = refuse(refusedStore, err)
			p.fates = fates
			return p
		}
		p.fates = append(p.fates, f)
		if f == fateGap {
			r.decideWindow(&p, cand)
			hwm, _, _, _ := r.tracker.Get(ev.Session)
			fates := p.fates
			p = refuse(refusedSeqGap, fmt.Errorf("%w: session %s SeqNo %d at LSN %d, HWM %d",
				replication.ErrSeqGap, ev.Session, ev.Seq, ev.LSN, hwm))
			p.fates = fates
			return p
		}
		// Ledger records never enter the window: the position gate admits
		// each once and re-applying one is harmless, and the window's slots
		// are promised to operations ("the last Capacity distinct
		// operations"). Leaders before wal.OpExtend gave them keys; ignored.
		if f == fateApply && ev.HasIdemKey && !ev.Op.IsLedger() {
			cand = append(cand, int32(i))
			warm = append(warm, ev.IdemKey)
		}
	}
	r.window.PrefetchKeys(warm)
	r.decideWindow(&p, cand)
	for i, f := range p.fates {
		switch f {
		case fateApply:
			p.keep = append(p.keep, events[i])
		case fatePosition:
			p.counts.position++
		case fateHWM:
			p.counts.hwm++
		case fateClosed:
			p.counts.closed++
		case fateTooOld:
			p.counts.tooOld++
		case fateInBatch:
			p.counts.inBatch++
		case fateWindow:
			p.counts.window++
		}
	}
	return p
}

// decideHWM is step 3 of decide for one event: the position and its
// session's HWM. fateApply means it passed (its SeqNo, if any, consumed);
// step 4 may still suppress it. An error is an I/O failure (wrapping
// ErrStaging and the cause).
func (r *Receiver) decideHWM(ttx *session.TrackerTx, ev *wal.Event, p *plan) (fate, error) {
	if ev.LSN <= r.applied { // overlap with an already applied prefix
		return fatePosition, nil
	}
	if ev.Seq != 0 {
		d, err := ttx.Check(ev.Session, ev.Seq, ev.Time)
		if err != nil {
			return 0, fmt.Errorf("%w: reading HWM: %w", ErrStaging, err)
		}
		switch d {
		case session.Duplicate:
			return fateHWM, nil
		case session.Gap:
			return fateGap, nil
		case session.Closed:
			return fateClosed, nil
		case session.TooOld:
			return fateTooOld, nil
		}
		p.advanced = true
		if err := ttx.Advance(ev.Session, ev.Seq, ev.Time); err != nil {
			return 0, fmt.Errorf("%w: HWM advance: %w", ErrStaging, err)
		}
		if ev.Op == wal.OpClose {
			if err := ttx.MarkClosed(ev.Session, ev.Time); err != nil {
				return 0, fmt.Errorf("%w: HWM close: %w", ErrStaging, err)
			}
		}
	}
	return fateApply, nil
}

// decideWindow is step 4 of decide for the events at indexes cand (keyed
// operations step 3 let through, in log order): a key seen earlier in the
// batch, then one in the window, suppresses the operation; every distinct
// key is recorded.
func (r *Receiver) decideWindow(p *plan, cand []int32) {
	for _, i := range cand {
		k := &p.events[i].IdemKey
		if _, dup := r.inBatch[*k]; dup {
			p.fates[i] = fateInBatch
			continue
		}
		r.inBatch[*k] = struct{}{}
		p.record = append(p.record, *k)
		if r.window.Contains(*k) {
			p.fates[i] = fateWindow
		}
	}
}

// stage writes plan p into b — the Applier's writes of the surviving events,
// the HWM advances (ttx.Flush), session GC every GCEvery-th commit, the
// window journal, the position, batch identity and epoch — and hands b to
// Pebble: with Sync, without waiting for the WAL sync (p.syncing; Wait
// waits). It returns the refusal if any step fails, and whether b reached
// Pebble's commit pipeline (then it must not be closed on failure); a failed
// commit also makes the store failed (sticky). Memory is untouched.
func (r *Receiver) stage(b *pebble.Batch, ttx *session.TrackerTx, p *plan) (_ *refusal, inPebble bool) {
	fail := func(kind refusalKind, err error) *refusal {
		p.verdict = verdictRefuse
		return &refusal{kind: kind, err: err}
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
	if err := r.stageMeta(b, p.h.LastLSN(), p.epoch, p.last); err != nil {
		return fail(refusedStore, fmt.Errorf("%w: metadata: %w", ErrStaging, err)), false
	}
	// Every batch is synced before its ack, also one that changed nothing
	// but the position (all its events discarded): the ack tells the leader
	// it may delete the log up to that position (its replication slot), so
	// a crash must not lose it — the follower would come back needing a
	// batch the leader no longer holds.
	p.syncing = !r.opts.NoSync
	p.started = time.Now()
	if err := startCommit(r.db, b, p.syncing); err != nil {
		r.failed = fmt.Errorf("%w: %w", ErrFailed, err)
		return fail(refusedStore, r.failed), true
	}
	r.commits++
	return nil, true
}

// Validate runs the Applier's Validate (a Validator's; see there) on a
// batch not logged yet, with header h and events stamped and given their
// LSNs: decide picks the events Apply would get, as it would for the
// logged batch, and Validate reads a scratch indexed batch over the
// store. Nothing is written and memory is untouched (decide changes only
// ttx's overlay, which Abort drops). It returns Validate's reason wrapped
// in ErrRejected, or ErrApply for a panic.
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
	p := r.decide(ttx, h, events)
	if p.verdict != verdictStage || len(p.keep) == 0 {
		return nil // a refusal here is the logged batch's to report
	}
	err := callApplier(r.opts.Logger, v.Validate, b, p.keep)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrApplierPanic):
		return applyFailed(h, err)
	}
	return fmt.Errorf("%w: %w", ErrRejected, err)
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
	r.journal.committed(r.window)
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

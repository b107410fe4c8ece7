package replication

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Errors returned by Receiver.Apply. Each refusal leaves the store and the
// receiver's memory exactly as they were; the ack that goes with it tells the
// shipper to resend from the follower's applied position.
var (
	// ErrWrongShard: the batch belongs to a shard this receiver does not serve.
	ErrWrongShard = errors.New("replication: batch for wrong shard")
	// ErrStaleEpoch: the batch comes from a leader epoch lower than the highest
	// this follower has committed. It fences a deposed leader.
	ErrStaleEpoch = errors.New("replication: batch from stale leader epoch")
	// ErrSeqGap: an event's SeqNo is above its session's HWM+1; events are
	// missing, so the whole batch is refused and nothing past the hole applies.
	ErrSeqGap = errors.New("replication: session SeqNo gap")
	// ErrOutOfOrder: the batch starts beyond the applied position + 1; an earlier
	// batch has not arrived (dropped or reordered in transit).
	ErrOutOfOrder = errors.New("replication: batch ahead of applied position")
	// ErrDiverged: a batch from a newer epoch overlaps LSNs this follower
	// already applied under an older epoch. A promoted leader rewrites the
	// log from its own applied position, so the follower holds entries of a
	// deposed leader that the new history does not have: it must be rebuilt
	// from the new leader (or a snapshot), never patched by skipping.
	ErrDiverged = errors.New("replication: follower history diverged from the leader's")
	// ErrApply: the Applier returned an error; the batch was not committed.
	ErrApply = errors.New("replication: applier failed")
	// ErrStoreFailed: the Pebble commit failed. Pebble treats a failed WAL
	// write or sync as fatal, so the receiver refuses all further batches; the
	// embedder must close and reopen the follower, which recovers from disk.
	ErrStoreFailed = errors.New("replication: store failed")
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
	// batch that changes state (or raises the epoch) is synced before it is
	// acknowledged. A batch whose events were all discarded changes only the
	// position and is committed without fsync: a crash may lose that position
	// advance, after which the follower reports the lower position in its
	// handshake and the batch is redelivered and discarded again. With
	// NoSync an ack may cover any batch a power failure loses; the follower
	// then reports its real position at the next handshake and the leader
	// resends, so exactly-once still holds, but the ack no longer proves
	// durability.
	NoSync bool
	// GCEvery runs session garbage collection (see session.Tracker) inside
	// every GCEvery-th committed batch. Default 64; negative disables.
	GCEvery int
	// GCLimit bounds the sessions collected per GC pass. Default 1024.
	GCLimit int
	// Logger receives rare diagnostic lines (journal problems). Default:
	// discard.
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
		o.Logger = discardLogger
	}
	return o
}

// Result describes what Apply did with one batch.
type Result struct {
	Ack       Ack  // what to send back to the leader
	Committed bool // a Pebble batch was committed
	Applied   int  // events handed to the Applier
	Discarded int  // events recognised as already applied
	Skipped   int  // events skipped as closed / too old
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
	applied uint64   // highest LSN committed; batches are applied in LSN order
	epoch   uint64   // highest epoch committed
	last    BatchRef // the batch ending at applied (zero: unknown)
	failed  error    // sticky after a fatal store error
	commits uint64
	pos     atomic.Pointer[position] // published copy of applied/epoch, read without mu
	// lastTime is the WAL time of the last event of the last committed
	// batch (0 before the first commit of this Receiver).
	lastTime atomic.Int64

	// Scratch reused across batches; guarded by mu.
	events  []wal.Event
	keep    []wal.Event
	inBatch map[idempotency.Key]struct{}
	record  []idempotency.Key
	meta    [lastBatchSize]byte

	stats statsCounters
}

// NewReceiver reads the applied position, epoch and window journal from db and
// returns a receiver that continues from them.
func NewReceiver(db *pebble.DB, tracker *session.Tracker, window *idempotency.Store, applier Applier, opts *ReceiverOptions) (*Receiver, error) {
	if db == nil || tracker == nil || window == nil || applier == nil {
		return nil, errors.New("replication: NewReceiver needs a db, tracker, window and applier")
	}
	var o ReceiverOptions
	if opts != nil {
		o = *opts
	}
	if err := ValidFollowerID(o.FollowerID); err != nil {
		return nil, fmt.Errorf("replication: NewReceiver: %w", err)
	}
	o.EnsureDefaults()
	r := &Receiver{
		db: db, tracker: tracker, window: window, applier: applier, opts: o,
		inBatch: make(map[idempotency.Key]struct{}),
	}
	var err error
	if r.applied, err = readMetaU64(db, KeyPosition); err != nil {
		return nil, err
	}
	if r.epoch, err = readMetaU64(db, KeyEpoch); err != nil {
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

// Position returns the highest applied LSN and the highest committed epoch.
// It does not wait for a batch being applied.
func (r *Receiver) Position() (appliedLSN, epoch uint64) {
	p := r.pos.Load()
	return p.applied, p.epoch
}

type position struct {
	applied, epoch uint64
	last           BatchRef
}

// LastEventTime returns the WAL time (the leader's timestamp, unix ns) of
// the last event of the last batch this Receiver committed; 0 before its
// first commit.
func (r *Receiver) LastEventTime() int64 { return r.lastTime.Load() }

// Err returns the sticky store failure (wrapping ErrStoreFailed), or nil.
func (r *Receiver) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// Hello is the handshake a follower sends on (re)connect: its shard, ID,
// committed epoch, applied position and the identity of the batch that ends
// there (zero when the store does not know it).
func (r *Receiver) Hello() Ack {
	p := r.pos.Load()
	return Ack{Shard: r.opts.Shard, Epoch: p.epoch, AppliedLSN: p.applied, FollowerID: r.opts.FollowerID, LastBatch: p.last}
}

// Apply decodes, validates and applies one shipped batch. The returned Result
// always carries the ack to send, also when err is non-nil; Ack.Refused tells
// the leader to resend from Ack.AppliedLSN+1.
//
// Order of decisions, each taken before anything is written:
//  1. decode and verify checksums, version, limits (wal errors);
//  2. shard (ErrWrongShard) and epoch (ErrStaleEpoch) fencing;
//  3. position: a batch wholly at or below the applied LSN is a redelivery and
//     is discarded; one starting past applied+1 is refused (ErrOutOfOrder);
//  4. per event, the SeqNo HWM (duplicate / gap → refuse all / closed / too old);
//  5. per event, the idempotency-key window (and keys seen earlier in the batch);
//  6. the Applier writes survivors into one Pebble batch with the HWM advances,
//     the window journal, the position and the epoch; the batch is committed;
//  7. only then do the in-memory HWMs, window, position and epoch change.
func (r *Receiver) Apply(raw []byte) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := Result{Ack: Ack{Shard: r.opts.Shard, Epoch: r.epoch, AppliedLSN: r.applied}}
	r.stats.batches.Add(1)
	r.stats.bytes.Add(uint64(len(raw)))
	if r.failed != nil {
		res.Ack.Refused = true
		return res, r.failed
	}

	h, events, err := wal.DecodeBatch(raw, r.events[:0])
	r.events = events[:0]
	if err != nil {
		r.stats.corrupt.Add(1)
		res.Ack.Refused = true
		return res, err
	}
	r.stats.events.Add(uint64(len(events)))
	refuse := func(counter *counter, err error) (Result, error) {
		counter.Add(1)
		r.stats.refusedEvents.Add(uint64(len(events)))
		res.Ack.Refused = true
		return res, err
	}
	if h.Shard != r.opts.Shard {
		return refuse(&r.stats.wrongShard, fmt.Errorf("%w: batch shard %d, receiver shard %d", ErrWrongShard, h.Shard, r.opts.Shard))
	}
	if h.Epoch < r.epoch {
		return refuse(&r.stats.staleEpochs, fmt.Errorf("%w: batch epoch %d < %d", ErrStaleEpoch, h.Epoch, r.epoch))
	}
	if h.Epoch > r.epoch && h.FirstLSN <= r.applied {
		return refuse(&r.stats.staleEpochs, fmt.Errorf("%w: epoch %d batch starts at LSN %d, but LSNs up to %d were applied under epoch %d",
			ErrDiverged, h.Epoch, h.FirstLSN, r.applied, r.epoch))
	}
	if len(events) == 0 || h.LastLSN() <= r.applied {
		r.stats.duplicateBatches.Add(1)
		r.stats.discardedPosition.Add(uint64(len(events)))
		res.Discarded = len(events)
		return res, nil
	}
	if h.FirstLSN > r.applied+1 {
		return refuse(&r.stats.outOfOrder, fmt.Errorf("%w: batch starts at LSN %d, applied %d", ErrOutOfOrder, h.FirstLSN, r.applied))
	}

	b := r.db.NewIndexedBatch() // the Applier's read view (see Applier)
	defer b.Close()
	ttx := r.tracker.Begin(b)
	committed := false
	defer func() {
		if !committed {
			ttx.Abort()
		}
	}()

	var c batchCounts
	advanced := false
	keep := r.keep[:0]
	record := r.record[:0]
	clear(r.inBatch)
	for i := range events {
		ev := &events[i]
		if ev.LSN <= r.applied { // overlap with an already applied prefix
			c.position++
			continue
		}
		if ev.Seq != 0 {
			d, err := ttx.Check(ev.Session, ev.Seq, ev.Time)
			if err != nil {
				return refuse(&r.stats.applyErrors, fmt.Errorf("%w: reading HWM: %v", ErrStoreFailed, err))
			}
			switch d {
			case session.Duplicate:
				c.hwm++
				continue
			case session.Gap:
				hwm, _, _, _ := r.tracker.Get(ev.Session)
				return refuse(&r.stats.seqGaps, fmt.Errorf("%w: session %s SeqNo %d at LSN %d, HWM %d",
					ErrSeqGap, ev.Session, ev.Seq, ev.LSN, hwm))
			case session.Closed:
				c.closed++
				continue
			case session.TooOld:
				c.tooOld++
				continue
			}
			// Apply: the SeqNo is consumed whether or not the window
			// suppresses the operation, so the next SeqNo is not a gap.
			advanced = true
			if err := ttx.Advance(ev.Session, ev.Seq, ev.Time); err != nil {
				return refuse(&r.stats.applyErrors, fmt.Errorf("%w: HWM advance: %v", ErrStoreFailed, err))
			}
			if ev.Op == wal.OpClose {
				if err := ttx.MarkClosed(ev.Session, ev.Time); err != nil {
					return refuse(&r.stats.applyErrors, fmt.Errorf("%w: HWM close: %v", ErrStoreFailed, err))
				}
			}
		}
		// Ledger records never enter the window: the position gate admits
		// each once and re-applying one is harmless, and the window's slots
		// are promised to operations ("the last Capacity distinct
		// operations"). Leaders before wal.OpExtend gave them keys; ignored.
		if ev.HasIdemKey && !ev.Op.IsLedger() {
			if _, dup := r.inBatch[ev.IdemKey]; dup {
				c.inBatch++
				continue
			}
			r.inBatch[ev.IdemKey] = struct{}{}
			record = append(record, ev.IdemKey)
			if r.window.Contains(ev.IdemKey) {
				c.window++
				continue
			}
		}
		keep = append(keep, *ev)
	}
	r.keep, r.record = keep[:0], record[:0]

	if err := r.applier.Apply(b, keep); err != nil {
		return refuse(&r.stats.applyErrors, fmt.Errorf("%w: %v", ErrApply, err))
	}
	if err := ttx.Flush(); err != nil {
		return refuse(&r.stats.applyErrors, fmt.Errorf("%w: HWM flush: %v", ErrStoreFailed, err))
	}
	if r.opts.GCEvery > 0 && (r.commits+1)%uint64(r.opts.GCEvery) == 0 {
		if _, err := ttx.CollectGarbage(r.opts.GCLimit); err != nil {
			return refuse(&r.stats.applyErrors, fmt.Errorf("%w: session GC: %v", ErrStoreFailed, err))
		}
	}
	if err := r.journal.stage(b, h.LastLSN(), record, r.window); err != nil {
		return refuse(&r.stats.applyErrors, fmt.Errorf("%w: window journal: %v", ErrStoreFailed, err))
	}
	epoch := max(r.epoch, h.Epoch)
	last := batchRef(h)
	if err := r.stageMeta(b, h.LastLSN(), epoch, last); err != nil {
		return refuse(&r.stats.applyErrors, fmt.Errorf("%w: %v", ErrStoreFailed, err))
	}
	// A batch that changed nothing but the position need not wait for fsync:
	// if a crash loses it, the batch is redelivered and discarded again. A
	// raised epoch is always synced: the fence it sets must survive a crash.
	sync := !r.opts.NoSync && (len(keep) > 0 || advanced || epoch != r.epoch)
	start := time.Now()
	if err := commit(b, sync); err != nil {
		r.failed = fmt.Errorf("%w: %v", ErrStoreFailed, err)
		return refuse(&r.stats.applyErrors, r.failed)
	}
	r.stats.commitLatency.Observe(time.Since(start))
	committed = true
	r.commits++

	// Invariant 4: memory follows the store, never leads it.
	ttx.Commit()
	for _, k := range record {
		r.window.CheckAndRecord(k)
	}
	r.journal.committed()
	r.applied, r.epoch, r.last = h.LastLSN(), epoch, last
	r.pos.Store(&position{r.applied, r.epoch, r.last})
	r.lastTime.Store(events[len(events)-1].Time)
	r.stats.add(&c, len(keep))
	r.stats.committed.Add(1)
	res.Committed = true
	res.Applied = len(keep)
	res.Discarded = c.position + c.hwm + c.window + c.inBatch
	res.Skipped = c.closed + c.tooOld
	res.Ack = Ack{Shard: r.opts.Shard, Epoch: r.epoch, AppliedLSN: r.applied}
	return res, nil
}

// commit commits b, turning Pebble's fatal-commit log call (which our
// FatalLogger turns into a panic) into an error.
func commit(b *pebble.Batch, sync bool) (err error) {
	defer func() {
		if p := recover(); p != nil {
			fe, ok := p.(*FatalError)
			if !ok {
				panic(p)
			}
			err = fe
		}
	}()
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
	}
	return b.Commit(opts)
}

// FatalError is the panic value of FatalLogger.Fatalf and the error Apply
// returns (wrapped in ErrStoreFailed) when Pebble declares a commit fatal.
type FatalError struct{ Msg string }

func (e *FatalError) Error() string { return e.Msg }

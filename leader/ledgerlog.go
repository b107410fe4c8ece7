package leader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/oncewal/oncewal/internal/badopts"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/replication"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/diskguard"
	"github.com/oncewal/oncewal/internal/leaderhook"
	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// ErrLogFailed: a LedgerLog whose WAL or local apply failed refuses all
// further appends; reopen it (OpenLedgerLog recovers from the WAL). When it
// wraps ErrApply, fix the Applier first: reopening re-applies the batch it
// failed (the Applier contract in doc.go).
var ErrLogFailed = errors.New("leader: ledger log failed")

// ErrBadEvent: an event given to LedgerLog.Append or Commit that the log
// must stamp itself (an explicit SeqNo, a ledger op).
var ErrBadEvent = errors.New("leader: event not accepted by ledger log")

// ErrSessionExpired: an event for a session idle longer than the retention
// horizon (on the WAL clock). Followers have forgotten the session, so its
// next SeqNo could never apply; the client must open a new session.
var ErrSessionExpired = errors.New("leader: session expired")

// errLogClosed answers an append to a closed LedgerLog: the package's
// ErrClosed, wrapping wal.ErrClosed, which callers tested before.
var errLogClosed = fmt.Errorf("%w: %w", ErrClosed, wal.ErrClosed)

// LedgerLogOptions configures OpenLedgerLog.
type LedgerLogOptions struct {
	// WALDir is the leader's WAL directory. Required.
	WALDir string
	// Shard is the shard whose log this is. Default 0.
	Shard uint32
	// Epoch is the leader epoch. It must be at least the epoch the store has
	// committed and the epoch of the WAL's last batch (ErrStaleEpoch
	// otherwise), and at most MaxEpoch (ErrEpochExhausted); a higher one is
	// persisted once the store holds the whole WAL, and starts a new
	// history at the WAL's end. Default: the higher of the store's epoch and
	// the WAL's last, or 1 for a fresh store and log. Promotion passes the
	// store's epoch + 1 (NextEpoch).
	Epoch uint64
	// DB, Tracker, Window and Table are the node's store and its layers
	// (follower.Follower owns them). Required.
	DB      *pebble.DB
	Tracker *session.Tracker
	Window  *idempotency.Store
	Table   *idempotency.LedgerTable
	// Applier applies batches to the local store. Default
	// SessionApplier{State: State, Ledger: Table}. A custom Applier gets
	// every event but the ledger records, which go to Table
	// (RouteLedger). One that is a Validator judges every append before
	// it is logged (the Applier contract in doc.go), and the log then
	// appends one batch at a time.
	Applier store.Applier
	// State is the session state machine of the default Applier.
	State *session.State
	// KV reads the committed key space of the local store
	// (store.Store.KVReader): what CommitResolved's resolvers read, under
	// the overlay of what is logged but not yet applied. nil: the key space
	// is read as empty (a store without one).
	KV kv.Reader
	// Ledger configures the Ledger (TTL, Lease, FailureTTL, NewToken); Now
	// and Log are set by the LedgerLog.
	Ledger idempotency.LedgerOptions
	// Wall is the wall clock in unix nanos. Default time.Now().UnixNano.
	Wall func() int64
	// SegmentSize is the WAL segment size (wal default when 0). Batches are
	// always synced before they are applied or answered.
	SegmentSize int64
	// Logger receives rare diagnostic lines. Default slog.Default().
	Logger *slog.Logger
	// FS is the filesystem of the WAL (the store's is the DB's own).
	// Default vfs.Default.
	FS vfs.FS
	// MinFreeBytes is the free space the WAL's disk keeps: below it every
	// append is refused with ErrDiskFull and nothing is logged (see
	// internal/diskguard). 0: the guard is off (leader.Open passes its
	// store's store.Options.MinFreeBytes).
	MinFreeBytes int64
	// OnAppend, if set, is called after every append with the batch's header
	// and encoded bytes (those in the WAL), synced, one batch at a time in
	// log order, just before the batch is applied locally and before the
	// append returns (a shipper's cache of recent batches). raw is only
	// valid during the call.
	OnAppend func(h wal.Header, raw []byte)
}

// EnsureDefaults fills unset fields with their documented defaults (the
// Applier's is set by OpenLedgerLog, which also routes a custom one).
func (o *LedgerLogOptions) EnsureDefaults() *LedgerLogOptions {
	ensureShared(&o.Wall, &o.Logger, &o.FS)
	return o
}

// Validate reports every missing or invalid field in one error wrapping
// ErrBadOptions.
func (o *LedgerLogOptions) Validate() error {
	if o == nil {
		return fmt.Errorf("%w: nil options", ErrBadOptions)
	}
	var errs []error
	for _, f := range []struct {
		name    string
		missing bool
	}{{"WALDir", o.WALDir == ""}, {"DB", o.DB == nil}, {"Tracker", o.Tracker == nil}, {"Window", o.Window == nil},
		{"Table", o.Table == nil}, {"State or Applier", o.State == nil && o.Applier == nil}} {
		if f.missing {
			errs = append(errs, fmt.Errorf("%s is required", f.name))
		}
	}
	if o.SegmentSize < 0 {
		errs = append(errs, fmt.Errorf("SegmentSize %d is negative", o.SegmentSize))
	}
	if err := replication.CheckEpoch("Epoch", o.Epoch); err != nil {
		errs = append(errs, err)
	}
	return badopts.Wrap(ErrBadOptions, "LedgerLogOptions", errs)
}

// LedgerLog is a leader for one shard with a request ledger. It is safe for
// concurrent use. Appends are stamped and written to the WAL one at a time,
// in LSN order, then share fdatasyncs (wal.Writer.SyncTo: group commit), then
// are applied locally and handed to OnAppend one at a time, in LSN order.
type LedgerLog struct {
	cfg        LedgerLogOptions
	epoch      uint64
	epochStart uint64       // first LSN of this epoch's history (0: unknown)
	epochPrev  wal.BatchRef // the batch ending at epochStart-1 (zero: unknown)
	w          *wal.Writer
	disk       *diskguard.Guard // MinFreeBytes, checked before each append
	recv       *store.Receiver
	ledger     *idempotency.Ledger
	// validator is the Applier's Validate (behind RouteLedger), nil when
	// the Applier is no Validator. validMu then makes each append wait for
	// the previous one's local apply before it is stamped, so Validate
	// sees the store after every batch logged before its own.
	validator store.Validator
	validMu   sync.Mutex
	notify    chan struct{}

	clockMu sync.Mutex
	last    int64

	mu  sync.Mutex // serializes stamping and WAL writes: SeqNo order = LSN order
	evs []wal.Event
	// pending holds the key-space rows of batches written but perhaps not
	// yet applied locally, so a resolver judges the state after every
	// batch logged before its own (kv.Layer over cfg.KV). Under mu.
	pending kv.Pending
	failed  error
	closed  bool
	// sessions is what stamping knows of every session it stamped and has
	// not forgotten (closed, expired): it replaces the store's view for a
	// session whose last batch is not applied yet (see admitSession).
	sessions map[session.ID]stamped
	closing  []closingRef // sessions closed by batches perhaps not applied yet
	undos    []undoRef    // scratch of stampAndWrite

	applyMu   sync.Mutex
	applyTurn *sync.Cond    // on applyMu: applyNext or failFrom moved
	applyNext uint64        // first LSN of the next batch to apply locally
	failFrom  uint64        // every batch from this LSN on fails (0: none)
	applied   atomic.Uint64 // last LSN applied locally
	bufs      sync.Pool     // *[]byte: encoded batches between write and apply
}

// stamped is a session as stamping left it: its last SeqNo and, of the
// last batch that stamped it, the last LSN, the WAL time and whether it
// closes the session.
type stamped struct {
	seq    session.SeqNo
	lsn    uint64
	ts     int64
	closed bool
}

// undoRef is a session as it was before an append changed it.
type undoRef struct {
	id    session.ID
	prev  stamped
	known bool
}

// closingRef is a session closed by the batch ending at lsn.
type closingRef struct {
	id  session.ID
	lsn uint64
}

// OpenLedgerLog opens the leader: it fences older epochs, opens (recovering)
// the WAL, brings the local store up to the end of the WAL, and opens the
// Ledger over the store's ledger table.
func OpenLedgerLog(opts *LedgerLogOptions) (*LedgerLog, error) {
	if err := opts.Validate(); err != nil { // nil opts too
		return nil, err
	}
	cfg := *opts
	cfg.EnsureDefaults()
	var validator store.Validator
	if cfg.Applier == nil {
		cfg.Applier = store.SessionApplier{State: cfg.State, Ledger: cfg.Table}
	} else {
		_, validates := cfg.Applier.(store.Validator)
		cfg.Applier = store.RouteLedger(cfg.Table, cfg.Applier)
		if validates {
			validator = cfg.Applier.(store.Validator)
		}
	}
	// The receiver applies the log to the local store. The WAL is synced
	// before anything is applied, so the store needs no fsync of its own: a
	// crash loses at most a suffix, re-applied below. Opening it reads the
	// store's position; it writes nothing.
	recv, err := store.NewReceiver(cfg.DB, cfg.Tracker, cfg.Window, cfg.Applier, &store.ReceiverOptions{Shard: cfg.Shard, NoSync: true, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	applied, stored := recv.Position()
	// The WAL is the authority on the leader's epoch (invariant 6): a store
	// rebuilt from it after it was lost knows no epoch until it re-applies
	// the log, and a leader serving below its log's last epoch would append
	// batches every reader refuses. Read-only: a refusal below changes
	// nothing.
	logged, err := wal.InspectFS(cfg.FS, cfg.WALDir, cfg.Shard)
	if err != nil {
		return nil, err
	}
	if cfg.Epoch, err = LeaderEpoch(cfg.Epoch, stored, logged.LastEpoch, cfg.WALDir); err != nil {
		return nil, err
	}
	if err := CheckPromise(cfg.Epoch, recv.Promised(), fmt.Sprintf("the store of shard %d", cfg.Shard)); err != nil {
		return nil, err
	}
	l := &LedgerLog{cfg: cfg, recv: recv, epoch: cfg.Epoch, notify: make(chan struct{}, 1),
		disk: diskguard.New(cfg.FS, cfg.WALDir, cfg.MinFreeBytes), sessions: make(map[session.ID]stamped), validator: validator}
	l.applyTurn = sync.NewCond(&l.applyMu)
	l.w, err = wal.OpenWriter(cfg.WALDir, &wal.WriterOptions{Shard: cfg.Shard, SegmentSize: cfg.SegmentSize, FirstLSN: applied + 1, FS: cfg.FS})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*LedgerLog, error) {
		_ = l.w.Close()
		return nil, err
	}
	if end := l.w.NextLSN() - 1; end < applied {
		return fail(fmt.Errorf("leader: store applied LSN %d but the WAL in %s ends at %d: not this store's log", applied, cfg.WALDir, end))
	}
	// The store first takes in the whole log, at the log's epochs; only
	// then is a raised epoch persisted, so that it starts after the log's
	// end and never fences the log's own batches.
	rise, err := l.catchUp(applied)
	if err != nil {
		return fail(err)
	}
	if err := l.persistEpoch(rise); err != nil {
		return fail(err)
	}
	l.applyNext = l.w.NextLSN()
	l.applied.Store(l.applyNext - 1)
	clock, err := cfg.Table.Clock()
	if err != nil {
		return fail(err)
	}
	l.last = max(clock, cfg.Tracker.Clock())
	lo := cfg.Ledger
	lo.Now, lo.Log = l.Now, l.logRecords
	lo.AtomicCommit = "leader.Shard.Commit" // commit: the outcome travels with the events
	if l.ledger, err = idempotency.OpenLedger(cfg.Table, &lo); err != nil {
		return fail(err)
	}
	return l, nil
}

// epochRise is where the log re-applied by catchUp last moved to a higher
// epoch: the first LSN of that epoch's history and the batch before it.
type epochRise struct {
	start uint64 // 0: the re-applied batches did not raise the epoch
	prev  wal.BatchRef
}

// catchUp applies the WAL from applied+1 to its end to the local store, and
// returns where the re-applied batches last raised the epoch: a batch whose
// epoch is above its predecessor's starts an epoch, whose boundary a store
// rebuilt from the log must know to check its followers.
func (l *LedgerLog) catchUp(applied uint64) (epochRise, error) {
	var rise epochRise
	if l.w.NextLSN()-1 == applied {
		return rise, nil
	}
	r, err := l.w.OpenReader()
	if err != nil {
		return rise, err
	}
	defer r.Close()
	if err := r.Seek(applied + 1); err != nil {
		return rise, err
	}
	_, prevEpoch := l.recv.Position()
	_, prev, err := store.ReadLastBatch(l.cfg.DB)
	if err != nil {
		return rise, err
	}
	for {
		h, raw, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return rise, err
		}
		if _, err := l.recv.Apply(raw); err != nil {
			return rise, fmt.Errorf("leader: re-applying own WAL: %w", err)
		}
		if h.Epoch > prevEpoch {
			rise = epochRise{start: h.FirstLSN, prev: prev}
		}
		prevEpoch, prev = h.Epoch, h.Ref()
	}
	if lsn, _ := l.recv.Position(); lsn != l.w.NextLSN()-1 {
		return rise, fmt.Errorf("leader: store at LSN %d after re-applying a WAL that ends at %d", lsn, l.w.NextLSN()-1)
	}
	return rise, nil
}

// persistEpoch fences the store at the leader's epoch once it holds the
// whole log (Receiver.RaiseEpoch) and loads the boundary the log checks
// followers against.
func (l *LedgerLog) persistEpoch(rise epochRise) error {
	start, prev, err := l.recv.RaiseEpoch(l.epoch, rise.start, rise.prev)
	if err != nil {
		return err
	}
	l.epochStart, l.epochPrev = start, prev
	return nil
}

// Now returns the WAL clock for the next record: the wall clock, strictly
// increasing, never below what the store has applied.
func (l *LedgerLog) Now() int64 {
	l.clockMu.Lock()
	defer l.clockMu.Unlock()
	l.last = max(l.last+1, l.cfg.Wall())
	return l.last
}

// Ledger returns the request ledger; its decisions are logged through this
// log.
func (l *LedgerLog) Ledger() *idempotency.Ledger { return l.ledger }

// Epoch is the leader epoch stamped on every batch.
func (l *LedgerLog) Epoch() uint64 { return l.epoch }

// Writer is the WAL writer (for a Shipper's DurableLSN).
func (l *LedgerLog) Writer() *wal.Writer { return l.w }

// WALDir is the WAL directory (for a Shipper's WALDir).
func (l *LedgerLog) WALDir() string { return l.cfg.WALDir }

// Notify is signalled after every append (for ShipperOptions.Notify).
func (l *LedgerLog) Notify() <-chan struct{} { return l.notify }

// Position is the local store's applied LSN and epoch.
func (l *LedgerLog) Position() (appliedLSN, epoch uint64) { return l.recv.Position() }

// ReceiverStats are the counters of the receiver that applies the log to
// the local store.
func (l *LedgerLog) ReceiverStats() store.ReceiverStats { return l.recv.Stats() }

// LastEventTime is the WAL time of the last event applied to the local
// store since the log was opened (Receiver.LastEventTime).
func (l *LedgerLog) LastEventTime() int64 { return l.recv.LastEventTime() }

// EpochStartLSN is the first LSN this leader's epoch wrote (0 if the store
// does not know, e.g. a store older than this record). Give it to the
// Shipper (ShipperOptions.EpochStartLSN) so a follower that applied a deposed
// leader's entries at or beyond it is refused instead of silently diverging.
func (l *LedgerLog) EpochStartLSN() uint64 { return l.epochStart }

// Boundary is where this leader's epoch starts in its history, for
// CheckHello.
func (l *LedgerLog) Boundary() EpochBoundary {
	return EpochBoundary{Epoch: l.epoch, StartLSN: l.epochStart, Prev: l.epochPrev}
}

// logRecords is the Ledger's LogFunc.
func (l *LedgerLog) logRecords(recs []idempotency.Record) error {
	evs := make([]wal.Event, len(recs))
	for i := range recs {
		evs[i] = wal.LedgerEvent(&recs[i])
	}
	_, err := l.append(evs, 0, len(evs))
	return err
}

// Append logs data events as one batch (synced, then applied locally). The
// log stamps them: Time is the WAL clock; an event with a session gets the
// session's next SeqNo (continuing from the store's HWM) and, unless it has
// one, an idempotency key derived from it. Events must come with Seq 0 and
// must not be ledger ops (ErrBadEvent). The events slice is not retained.
func (l *LedgerLog) Append(events ...wal.Event) (wal.Header, error) {
	return l.append(events, l.Now(), 0)
}

// commit (Shard.Commit, the one spelling embedders get) completes claim c with outcome and logs the operation's data
// events (stamped as in Append) and the complete record in ONE batch, so
// the effect and the outcome are durable — here and on every follower —
// together or not at all. If c no longer owns its key (idempotency.ErrNotOwner)
// or the log fails, nothing is logged and the effect did not happen.
func (l *LedgerLog) commit(c *idempotency.Claim, outcome []byte, events ...wal.Event) (wal.Header, error) {
	var h wal.Header
	err := l.ledger.CompleteWith(c, outcome, func(rec idempotency.Record) error {
		evs := make([]wal.Event, 0, len(events)+1)
		evs = append(evs, events...)
		evs = append(evs, wal.LedgerEvent(&rec))
		var err error
		h, err = l.append(evs, rec.Time, 1)
		return err
	})
	return h, err
}

// A Resolver turns a request into the data events to log and the outcome
// to record with them, judged against r: the key space as it stands after
// every batch logged before the request's own, whose first event will be
// at firstLSN. It runs under the shard's stamping lock, so no batch is
// logged between its judgement and its own batch: keep it short, and read
// nothing but r. An error logs nothing.
type Resolver func(r kv.Reader, firstLSN uint64) (events []wal.Event, outcome []byte, err error)

// commitResolved (Shard.CommitResolved) completes claim c with what
// resolve makes of the state, in one batch with the complete record. It
// returns the batch's header and the outcome recorded.
func (l *LedgerLog) commitResolved(c *idempotency.Claim, resolve Resolver) (wal.Header, []byte, error) {
	var (
		h       wal.Header
		outcome []byte
	)
	err := l.ledger.CompleteWith(c, nil, func(rec idempotency.Record) error {
		var err error
		h, outcome, err = l.appendResolved(resolve, rec)
		return err
	})
	return h, outcome, err
}

// appendResolved runs resolve under mu, and appends its events and the
// complete record rec, its outcome set to resolve's, as one batch (as
// append does).
func (l *LedgerLog) appendResolved(resolve Resolver, rec idempotency.Record) (wal.Header, []byte, error) {
	var outcome []byte
	resolved := func(first uint64) ([]wal.Event, error) {
		events, out, err := resolve(kv.Layer(&l.pending, l.kvReader()), first)
		if err != nil {
			return nil, err
		}
		if len(out) > idempotency.MaxOutcomeSize {
			return nil, fmt.Errorf("%w: %d bytes", idempotency.ErrOutcomeTooLarge, len(out))
		}
		rec.Outcome, outcome = out, out
		return append(events, wal.LedgerEvent(&rec)), nil
	}
	h, err := l.appendWith(nil, rec.Time, 1, resolved)
	return h, outcome, err
}

// kvReader is the committed key space (an empty one without
// LedgerLogOptions.KV).
func (l *LedgerLog) kvReader() kv.Reader {
	if l.cfg.KV == nil {
		return emptyKV{}
	}
	return l.cfg.KV
}

type emptyKV struct{}

func (emptyKV) Get([]byte) (kv.Row, bool, error) { return kv.Row{}, false, nil }

// append stamps the data events with ts (ledger events keep their decision
// time), appends them as one batch and applies it locally. The last
// ledgerTail events are ledger records made by the Ledger; no others may be.
//
// Three steps, so that concurrent appenders share fsyncs: under mu, stamp
// and write (encoded once: the WAL's bytes are the ones applied and shipped);
// then wait for a sync covering the batch; then, in LSN order, hand it to
// OnAppend and apply it locally. Nothing of a batch is applied, shipped or
// answered before its sync, and a batch whose sync or local apply failed
// fails every later one.
func (l *LedgerLog) append(events []wal.Event, ts int64, ledgerTail int) (wal.Header, error) {
	return l.appendWith(events, ts, ledgerTail, nil)
}

// appendWith is append, the events made under mu by resolved (given the
// batch's first LSN) when it is not nil.
func (l *LedgerLog) appendWith(events []wal.Event, ts int64, ledgerTail int, resolved func(first uint64) ([]wal.Event, error)) (wal.Header, error) {
	if l.validator != nil {
		// Validate must judge against every earlier logged batch, which
		// the store shows only once it is applied: one append at a time
		// (store invariant 9; the Applier contract in store's doc.go says why not a
		// speculative view).
		l.validMu.Lock()
		defer l.validMu.Unlock()
	}
	bp, _ := l.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	defer func() {
		if cap(*bp) <= 4<<20 { // do not pin a rare huge batch
			l.bufs.Put(bp)
		}
	}()
	h, raw, err := l.stampAndWrite(events, ts, ledgerTail, *bp, resolved)
	if err != nil {
		return wal.Header{}, err
	}
	*bp = raw
	if err := l.w.SyncTo(h.LastLSN()); err != nil {
		return wal.Header{}, l.fail(h.FirstLSN, err)
	}
	if err := l.applyInOrder(h, raw); err != nil {
		return wal.Header{}, err
	}
	return h, nil
}

// stampAndWrite stamps the events and writes them to the WAL as one batch
// encoded into buf, under mu.
func (l *LedgerLog) stampAndWrite(events []wal.Event, ts int64, ledgerTail int, buf []byte, resolved func(first uint64) ([]wal.Event, error)) (wal.Header, []byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return wal.Header{}, nil, errLogClosed
	}
	if l.failed != nil {
		return wal.Header{}, nil, l.failed
	}
	if err := l.disk.Check(); err != nil {
		return wal.Header{}, nil, err
	}
	l.forgetClosed()
	l.pending.Forget(l.applied.Load())
	if resolved != nil {
		var err error
		if events, err = resolved(l.w.NextLSN()); err != nil {
			return wal.Header{}, nil, err
		}
	}
	evs := append(l.evs[:0], events...)
	l.evs = evs[:0]
	// Writes happen only under mu, so the batch will end here.
	last := l.w.NextLSN() + uint64(len(evs)) - 1
	undos := l.undos[:0] // sessions this call changed, to restore on refusal
	defer func() { l.undos = undos[:0] }()
	undo := func() {
		for i := len(undos) - 1; i >= 0; i-- { // newest first: each ends as before the call
			if u := undos[i]; u.known {
				l.sessions[u.id] = u.prev
			} else {
				delete(l.sessions, u.id)
			}
		}
	}
	refuse := func(err error) (wal.Header, []byte, error) {
		undo()
		return wal.Header{}, nil, err
	}
	closes, kvs := false, false
	for i := range evs {
		ev := &evs[i]
		kvs = kvs || ev.Op.IsKV()
		if isTail := i >= len(evs)-ledgerTail; ev.Op.IsLedger() != isTail {
			return refuse(fmt.Errorf("%w: event %d: %s; ledger records are logged by the Ledger", ErrBadEvent, i, ev.Op))
		} else if isTail {
			continue
		}
		if ev.Seq != 0 {
			return refuse(fmt.Errorf("%w: event %d has SeqNo %d; the log assigns SeqNos", ErrBadEvent, i, ev.Seq))
		}
		ev.Time = ts
		if ev.Session == (session.ID{}) {
			continue
		}
		prev, known := l.sessions[ev.Session]
		if known && prev.closed && prev.lsn == last {
			return refuse(fmt.Errorf("%w: event %d: session %s closed earlier in the batch", session.ErrSessionClosed, i, ev.Session))
		}
		st, err := l.admitSession(ev.Session, prev, known, ts)
		if err != nil {
			return refuse(fmt.Errorf("%w: event %d: session %s", err, i, ev.Session))
		}
		undos = append(undos, undoRef{ev.Session, prev, known})
		st.seq++
		st.lsn, st.ts, st.closed = last, ts, ev.Op == wal.OpClose
		closes = closes || st.closed
		l.sessions[ev.Session] = st
		ev.Seq = st.seq
		if !ev.HasIdemKey {
			var op [64]byte
			ev.HasIdemKey, ev.IdemKey = true, idempotency.DeriveKey(ev.Session, ev.Seq, ev.AppendOpBytes(op[:0]))
		}
	}
	if l.validator != nil && len(evs) > 0 {
		// validMu is held: the store holds every batch written so far.
		first := l.w.NextLSN()
		for i := range evs {
			evs[i].LSN = first + uint64(i)
		}
		h := wal.Header{Shard: l.cfg.Shard, Epoch: l.epoch, FirstLSN: first, Count: uint32(len(evs))}
		if err := l.recv.Validate(l.validator, h, evs); err != nil {
			return refuse(err)
		}
	}
	h, raw, err := l.w.Write(buf, l.epoch, evs)
	if err != nil {
		undo()
		if errors.Is(err, wal.ErrInvalidEvent) || errors.Is(err, wal.ErrTooLarge) {
			return wal.Header{}, nil, err // nothing was written
		}
		l.failed = fmt.Errorf("%w: %w", ErrLogFailed, err)
		return wal.Header{}, nil, l.failed
	}
	if kvs {
		l.noteKV(h.FirstLSN, evs)
	}
	if closes {
		for _, u := range undos {
			if l.sessions[u.id].closed {
				l.closing = append(l.closing, closingRef{u.id, last})
			}
		}
	}
	return h, raw, nil
}

// noteKV records the key-space rows of a batch that holds some, written
// from first on, in the overlay resolvers read. Holds mu.
func (l *LedgerLog) noteKV(first uint64, evs []wal.Event) {
	for i := range evs {
		evs[i].LSN = first + uint64(i)
	}
	l.pending.Note(evs)
}

// admitSession checks that the session may take its next SeqNo at WAL time
// ts and returns it as stamped so far (st, known: its entry in sessions).
// A session whose last batch is written but perhaps not applied is judged
// by that batch: the store does not show it yet. Any other is judged by the
// tracker, as followers will judge it, and a session stamping does not know
// continues from its HWM there. Holds mu.
func (l *LedgerLog) admitSession(id session.ID, st stamped, known bool, ts int64) (stamped, error) {
	if known && st.lsn > l.applied.Load() {
		if st.closed {
			return st, session.ErrSessionClosed
		}
		if l.cfg.Tracker.ExpiredSince(st.ts, ts) {
			return st, ErrSessionExpired // kept: its batch is still to apply
		}
		return st, nil
	}
	if known && st.closed {
		return st, session.ErrSessionClosed // applied since forgetClosed ran
	}
	expired, err := l.cfg.Tracker.Expired(id, ts)
	if err != nil {
		return st, err
	}
	if expired {
		delete(l.sessions, id) // followers forgot it; so does stamping
		return st, ErrSessionExpired
	}
	if !known {
		hwm, closed, _, err := l.cfg.Tracker.Get(id)
		if err != nil {
			return st, err
		}
		if closed {
			return st, session.ErrSessionClosed
		}
		st = stamped{seq: hwm}
	}
	return st, nil
}

// admit reports whether session id may log an event now, by the rule
// stamping applies (admitSession, on the WAL clock, the log's pending
// batches included), without stamping anything: ErrSessionExpired,
// session.ErrSessionClosed, or the log's closed or failed error. The door of
// Shard.Claim.
func (l *LedgerLog) admit(id session.ID) error {
	ts := l.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errLogClosed
	}
	if l.failed != nil {
		return l.failed
	}
	l.forgetClosed()
	prev, known := l.sessions[id]
	_, err := l.admitSession(id, prev, known, ts)
	return err
}

// forgetClosed forgets the sessions closed by applied batches: from now on
// the tracker answers "closed" for them. Holds mu.
func (l *LedgerLog) forgetClosed() {
	applied := l.applied.Load()
	n := 0
	for _, c := range l.closing {
		if c.lsn > applied {
			l.closing[n] = c
			n++
		} else if st := l.sessions[c.id]; st.closed && st.lsn == c.lsn {
			delete(l.sessions, c.id)
		}
	}
	l.closing = l.closing[:n]
}

// applyInOrder waits for the batch's turn, hands it to OnAppend and applies
// it to the local store. raw is the batch as written and synced.
func (l *LedgerLog) applyInOrder(h wal.Header, raw []byte) error {
	l.applyMu.Lock()
	for l.applyNext != h.FirstLSN && (l.failFrom == 0 || h.FirstLSN < l.failFrom) {
		l.applyTurn.Wait()
	}
	if l.failFrom != 0 && h.FirstLSN >= l.failFrom {
		l.applyMu.Unlock()
		return l.failure()
	}
	// Ship before the local apply: the batch is synced, so the followers
	// apply it while this store does, instead of after (with one appender
	// the local apply would otherwise sit in every batch's replication
	// latency). A failed local apply fails the log; the batch is in the
	// synced WAL and is re-applied at reopen, so what a follower got is
	// still the log's.
	if l.cfg.OnAppend != nil {
		l.cfg.OnAppend(h, raw)
	}
	select {
	case l.notify <- struct{}{}:
	default:
	}
	_, err := l.recv.Apply(raw)
	if err != nil {
		l.applyMu.Unlock()
		// The batch is in the WAL but not in the store: stop, so nothing is
		// answered from a store that disagrees with the log. Reopening
		// re-applies the WAL.
		return l.fail(h.FirstLSN, fmt.Errorf("local apply of LSN %d: %w", h.FirstLSN, err))
	}
	l.applied.Store(h.LastLSN())
	l.applyNext = h.LastLSN() + 1
	l.applyTurn.Broadcast()
	l.applyMu.Unlock()
	return nil
}

// fail marks the log failed from the batch at first on: that batch, and
// every later one whether written or not, fails with the same error
// wrapping ErrLogFailed and cause.
func (l *LedgerLog) fail(first uint64, cause error) error {
	l.mu.Lock()
	if l.failed == nil {
		l.failed = fmt.Errorf("%w: %w", ErrLogFailed, cause)
	}
	err := l.failed
	l.mu.Unlock()
	l.applyMu.Lock()
	if l.failFrom == 0 || first < l.failFrom {
		l.failFrom = first
	}
	l.applyTurn.Broadcast()
	l.applyMu.Unlock()
	return err
}

// failure is the error of a failed log.
func (l *LedgerLog) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed
}

// Close closes the Ledger and the WAL writer (not the store, which belongs
// to the caller), after the appends in flight have ended: it refuses new
// ones (ErrClosed, wrapping wal.ErrClosed) and waits until every written batch is applied or
// failed. Idempotent.
func (l *LedgerLog) Close() error {
	_ = l.ledger.Close()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	end := l.w.NextLSN() // nothing is written after closed
	l.mu.Unlock()
	l.applyMu.Lock()
	for l.applyNext < end && (l.failFrom == 0 || l.applyNext < l.failFrom) {
		l.applyTurn.Wait()
	}
	l.applyMu.Unlock()
	return l.w.Close()
}

func init() {
	leaderhook.Commit = func(l any, c *idempotency.Claim, outcome []byte, events ...wal.Event) (wal.Header, error) {
		return l.(*LedgerLog).commit(c, outcome, events...)
	}
	leaderhook.WaitAcked = func(s any, ctx context.Context, lsn uint64) error {
		switch s := s.(type) {
		case *Shipper:
			return s.f.waitAcked(ctx, lsn, AckAll)
		case *Fanout:
			return s.waitAcked(ctx, lsn, AckAll)
		}
		panic(fmt.Sprintf("leaderhook.WaitAcked: %T is neither a *Shipper nor a *Fanout", s))
	}
}

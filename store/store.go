package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/internal/badopts"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/diskguard"
	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/internal/lifegate"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/wal"
)

// ErrNotStore: a directory or Pebble store that is not an oncewal shard
// store (Open refuses it unchanged).
var ErrNotStore = errors.New("store: not an oncewal shard store")

// ErrClosed is returned by methods of a closed Store.
var ErrClosed = errors.New("store: closed")

// ErrBadOptions: Open or NewReceiver was given unusable Options or
// ReceiverOptions (every problem is listed in the joined error). Nothing was
// changed on disk.
var ErrBadOptions = errors.New("store: bad options")

// Options configures a Store. Every zero field takes the default named
// in its comment (see EnsureDefaults); Open validates the result and reports
// all problems at once.
type Options struct {
	// Shard is the shard this follower serves; batches of other shards are
	// refused with replication.ErrWrongShard. Default 0.
	Shard uint32
	// ID is the follower's stable name, sent in every hello; a leader that
	// ships to several followers of a shard (leader.Fanout) tells them
	// apart by it and serves only the IDs it has registered. 1..64 bytes of
	// [A-Za-z0-9._-] (replication.ValidFollowerID). Default "" (anonymous:
	// served only by a single-follower leader.Shipper).
	ID string
	// WindowCapacity is the number of idempotency keys remembered.
	// Default idempotency.DefaultCapacity (100,000).
	WindowCapacity int
	// HWMCacheSize bounds the in-memory cache of session HWMs; misses read
	// Pebble. Default session.DefaultCacheSize (1<<20 sessions).
	HWMCacheSize int
	// HWMLogBatches and HWMLogSessions configure the HWM log (see
	// session.TrackerOptions LogBatches and LogSessions): a batch writes its
	// HWM changes as one value; a session whose entry is HWMLogBatches
	// batches old is logged again (carried forward, twice at most) or has
	// its row rewritten. Defaults
	// session.DefaultLogBatches (256) and session.DefaultLogSessions (1<<17);
	// HWMLogBatches -1 turns the log off (one HWM row per changed session
	// per batch).
	HWMLogBatches  int
	HWMLogSessions int
	// RetentionHorizon is how long, on the WAL clock, a closed or idle
	// session's HWM is kept before garbage collection. It must exceed the
	// longest delay with which an event can be redelivered. Default
	// session.DefaultRetentionHorizon (24h).
	RetentionHorizon time.Duration
	// NoSync commits without waiting for fsync (see
	// ReceiverOptions.NoSync). Default false: every ack is durable.
	NoSync bool
	// Applier is the state machine events are applied to. Default: the
	// session state machine and the request-ledger table
	// (SessionApplier with State and Ledger). A custom Applier
	// reads the store through the batch it is handed and never sees the
	// request-ledger records: the follower applies them to LedgerTable()
	// itself (replication.RouteLedger), so it needs nothing from the
	// Follower and can be given before Open. It must keep the Applier
	// contract (package replication): deterministic, rejections as
	// results; on a leader, a replication.Validator refuses before logging.
	Applier Applier
	// Ledger configures the request-ledger table (sweep interval and limit,
	// on the WAL clock). Default: idempotency.TableOptions defaults.
	Ledger idempotency.TableOptions
	// Logger receives the follower's log lines. Default slog.Default().
	Logger *slog.Logger
	// FS is the filesystem Pebble uses. Default vfs.Default (the OS). Tests
	// pass vfs.NewCrashableMem() or an errorfs wrapper.
	FS vfs.FS
	// MemTableSize is the size of the store's memtable (Pebble's
	// MemTableSize). The rows that live only briefly — the HWM log's deltas
	// (kept for HWMLogBatches batches) and the window journal's entries
	// (kept for about WindowCapacity keys) — then mostly die in the memtable instead
	// of being flushed and compacted: at Pebble's 4 MiB they outlive it,
	// and flushes and compactions of them were the largest part of a
	// follower's CPU. Memory: a shard that writes holds about two memtables
	// (the one being filled and the one being flushed or kept for reuse),
	// so 64 MiB per shard at the default (doc.go, "Memory per shard").
	// Default DefaultMemTableSize (32 MiB); MinMemTableSize (256 KiB) to
	// MaxMemTableSize (2 GiB). PebbleOptions may still change it.
	MemTableSize int64
	// PebbleOptions, if set, may adjust the Pebble options before Open (cache
	// size, memtable size, …). It must not replace FS or Logger.
	PebbleOptions func(*pebble.Options)
	// MinFreeBytes is the free space the store's disk keeps: below it no
	// batch is applied (Apply and Start refuse it with
	// replication.ErrDiskFull; Serve holds it and waits for room), so
	// that Pebble never meets a full disk, which it cannot survive
	// gracefully (internal/diskguard). Default diskguard.DefaultMinFree
	// (64 MiB); negative: off.
	MinFreeBytes int64
}

// EnsureDefaults fills unset fields with their documented defaults.
func (o *Options) EnsureDefaults() *Options {
	if o.WindowCapacity == 0 {
		o.WindowCapacity = idempotency.DefaultCapacity
	}
	if o.HWMCacheSize == 0 {
		o.HWMCacheSize = session.DefaultCacheSize
	}
	if o.HWMLogBatches == 0 {
		o.HWMLogBatches = session.DefaultLogBatches
	}
	if o.HWMLogSessions == 0 {
		o.HWMLogSessions = session.DefaultLogSessions
	}
	if o.RetentionHorizon == 0 {
		o.RetentionHorizon = session.DefaultRetentionHorizon
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.MinFreeBytes == 0 {
		o.MinFreeBytes = diskguard.DefaultMinFree
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = DefaultMemTableSize
	}
	return o
}

// Validate reports every invalid field in one error wrapping ErrBadOptions.
func (o *Options) Validate() error { return badOptions("Options", o.problems()) }

// badOptions wraps the problems found in one options type, if any.
func badOptions(typ string, errs []error) error { return badopts.Wrap(ErrBadOptions, typ, errs) }

// problems lists every invalid field.
func (o *Options) problems() []error {
	var errs []error
	if o.WindowCapacity < 0 {
		errs = append(errs, fmt.Errorf("WindowCapacity %d is negative", o.WindowCapacity))
	}
	if o.HWMCacheSize < 0 {
		errs = append(errs, fmt.Errorf("HWMCacheSize %d is negative", o.HWMCacheSize))
	}
	if o.HWMLogBatches < -1 {
		errs = append(errs, fmt.Errorf("HWMLogBatches %d is below -1 (off)", o.HWMLogBatches))
	}
	if o.HWMLogSessions < 0 {
		errs = append(errs, fmt.Errorf("HWMLogSessions %d is negative", o.HWMLogSessions))
	}
	if o.RetentionHorizon < 0 {
		errs = append(errs, fmt.Errorf("RetentionHorizon %v is negative", o.RetentionHorizon))
	}
	if o.MemTableSize < MinMemTableSize || o.MemTableSize > MaxMemTableSize {
		errs = append(errs, fmt.Errorf("MemTableSize %d is outside [%d, %d]", o.MemTableSize, MinMemTableSize, int64(MaxMemTableSize)))
	}
	if err := replication.ValidFollowerID(o.ID); err != nil {
		errs = append(errs, fmt.Errorf("ID: %w", err))
	}
	return errs
}

// Bounds and default of Options.MemTableSize. The default is where the
// CPU saved levels off on the fresh and retry benchmarks (doc.go, "Memory
// per shard"). Pebble refuses 4 GiB − 1 and more.
const (
	DefaultMemTableSize = 32 << 20
	MinMemTableSize     = 256 << 10
	MaxMemTableSize     = 2 << 30
)

// Store is one shard's store, opened: a Pebble store with its recorded
// identity, the HWM tracker, the idempotency-key window, the session state,
// the request-ledger table and the receiver that applies batches to them,
// wired. A follower serves it from a leader (package follower); a leader
// applies its own log to it (package leader).
type Store struct {
	dir     string
	opts    Options
	db      *pebble.DB
	events  *storeEvents
	tracker *session.Tracker
	window  *idempotency.Store
	state   *session.State
	ledger  *idempotency.LedgerTable
	recv    *Receiver

	// life orders Apply and Start (holds) against Close and Kill: after
	// them no Apply is in flight and none can start.
	life *lifegate.Gate

	stall stallGuard
	disk  *diskguard.Guard // MinFreeBytes
	full  atomic.Bool      // the last check found the disk full

	closeOnce sync.Once
	closeErr  error
}

// Open opens (or creates) the store in dir and recovers its applied
// position, epoch, HWMs and window from it. It is OpenContext without
// a deadline.
func Open(dir string, opts *Options) (*Store, error) {
	return OpenContext(context.Background(), dir, opts)
}

// OpenContext opens (or creates) the store in dir and recovers its
// applied position, epoch, HWMs and window from it.
//
// It refuses, before anything on disk changes: a directory that is not a
// store or empty (*LayoutError: a node directory, a WAL or leader directory,
// unrelated files), a Pebble store that is not oncewal's (ErrNotStore), and
// a store whose recorded identity — kind, shard, WindowCapacity,
// RetentionHorizon — differs from opts (*MismatchError; see
// SetRecordedOptions). A new store records opts' identity in its first
// commit. A store Pebble cannot open because its recovery fails in the
// background (a full disk, I/O errors) gives ErrUnavailable in bounded time
// instead of hanging, and ctx ending gives ctx.Err() (see the notes in
// open.go). A store whose files fail Pebble's checksums gives
// ErrCorrupt.
func OpenContext(ctx context.Context, dir string, opts *Options) (*Store, error) {
	s, err := openContext(ctx, dir, opts)
	return s, CorruptError(dir, err)
}

func openContext(ctx context.Context, dir string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: opening store %s: %w", dir, err)
	}
	_, statErr := o.FS.Stat(dir)
	existed := statErr == nil
	asked := identityOf(&o)
	fresh := false
	// An open of this directory given up earlier (ErrUnavailable, ctx)
	// holds the store's lock while it retries: join it; its store's
	// identity is checked below.
	if !pendingOpenOf(o.FS, dir) {
		// A snapshot install a crash interrupted is finished (or a fetch
		// it interrupted removed) before the directory is looked at: the
		// store opens as the old one or the new one, never a mix.
		if err := snapshot.Recover(o.FS, dir); err != nil {
			return nil, fmt.Errorf("store: opening store %s: %w", dir, err)
		}
		_, statErr = o.FS.Stat(dir)
		existed = statErr == nil
		layout, detail, err := DirLayout(o.FS, dir)
		if err != nil {
			return nil, fmt.Errorf("store: opening store %s: %w", dir, err)
		}
		switch layout {
		case LayoutEmpty:
			fresh = true
			if err := clearInterruptedCreation(o.FS, dir, o.Logger); err != nil {
				return nil, fmt.Errorf("store: opening store %s: %w", dir, err)
			}
		case LayoutStore:
			found, recorded, err := peekIdentity(o.FS, dir)
			if err != nil {
				return nil, err
			}
			if recorded && found != asked {
				return nil, &MismatchError{Dir: dir, Found: found, Asked: asked}
			}
			// A store older than the identity record: its directory name,
			// if it is a node's shard directory, still says which shard it
			// is.
			if s, ok := parseShardDirName(filepath.Base(dir)); !recorded && ok && s != o.Shard {
				found = asked
				found.Shard = s
				return nil, &MismatchError{Dir: dir, Found: found, Asked: asked}
			}
		default:
			return nil, &LayoutError{Dir: dir, Found: layout, Want: LayoutStore, Detail: detail}
		}
	}
	// Pebble creates a missing directory without syncing its parent, and a
	// store whose directory a power failure takes loses every batch it
	// acknowledged.
	if err := wal.MkdirAllSynced(o.FS, dir); err != nil {
		if fresh {
			removeNewStore(o.FS, dir, existed)
		}
		return nil, fmt.Errorf("store: creating store directory %s: %w", dir, err)
	}
	ev := newStoreEvents(o.Logger)
	db, ev, err := openPebble(ctx, dir, pebbleOptions(&o, ev), ev)
	if err != nil {
		if fresh && !errors.Is(err, ErrUnavailable) && ctx.Err() == nil {
			removeNewStore(o.FS, dir, existed)
		}
		return nil, err
	}
	found, recorded, err := ReadIdentity(db)
	if err == nil && recorded && found != asked {
		err = &MismatchError{Dir: dir, Found: found, Asked: asked}
	}
	if err != nil {
		_ = guard(db.Close)
		return nil, err
	}
	s, err := func() (*Store, error) {
		if !recorded {
			if err := writeIdentity(db, asked); err != nil {
				return nil, fmt.Errorf("store: recording the identity of store %s: %w", dir, err)
			}
			if !fresh {
				o.Logger.Info("oncewal store: recorded the identity of a store that had none", "dir", dir, "identity", asked.String())
			}
		}
		return wire(dir, db, ev, o)
	}()
	if err != nil {
		_ = guard(db.Close)
		if fresh {
			removeNewStore(o.FS, dir, existed)
		}
		return nil, err
	}
	return s, nil
}

func wire(dir string, db *pebble.DB, ev *storeEvents, o Options) (*Store, error) {
	tracker, err := session.OpenTracker(db, &session.TrackerOptions{
		CacheSize:        o.HWMCacheSize,
		RetentionHorizon: o.RetentionHorizon,
		LogBatches:       o.HWMLogBatches,
		LogSessions:      o.HWMLogSessions,
	})
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	s := &Store{
		dir: dir, opts: o, db: db, events: ev, tracker: tracker,
		window: idempotency.NewStore(o.WindowCapacity),
		state:  session.NewState(db),
	}
	if s.ledger, err = idempotency.OpenLedgerTable(db, &o.Ledger); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	var applier Applier = SessionApplier{State: s.state, Ledger: s.ledger}
	if o.Applier != nil {
		applier = RouteLedger(s.ledger, o.Applier)
	}
	s.recv, err = NewReceiver(db, tracker, s.window, applier, &ReceiverOptions{
		Shard:      o.Shard,
		FollowerID: o.ID,
		NoSync:     o.NoSync,
		Logger:     o.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	s.life = lifegate.New()
	s.disk = diskguard.New(o.FS, dir, o.MinFreeBytes)
	return s, nil
}

// Apply applies one shipped batch (see Receiver.Apply).
func (s *Store) Apply(batch []byte) (Result, error) {
	return s.Start(batch).Wait()
}

// Start starts applying one shipped batch without waiting for its WAL sync
// (see Receiver.Start): callers that pipeline batches Wait for each
// Pending in order and send its ack. Wait for every Pending before Close.
func (s *Store) Start(batch []byte) *Pending {
	release, ok := s.life.Hold()
	if !ok {
		return Refused(s.recv.Hello(), ErrClosed)
	}
	defer release()
	if err := s.checkDisk(); err != nil {
		return Refused(s.recv.Hello(), err)
	}
	return s.recv.Start(batch)
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Shard is the shard the store holds.
func (s *Store) Shard() uint32 { return s.opts.Shard }

// Options returns the options the store was opened with, defaults filled.
func (s *Store) Options() Options { return s.opts }

// Position returns the applied LSN and the highest committed epoch.
func (s *Store) Position() (appliedLSN, epoch uint64) { return s.recv.Position() }

// Hello is the store's hello: its shard, ID, position and the batch that
// ends there (Receiver.Hello).
func (s *Store) Hello() replication.Ack { return s.recv.Hello() }

// Err is the store's failure (ErrFailed, ErrApply), or nil.
func (s *Store) Err() error { return s.recv.Err() }

// Stats returns a snapshot of the store's counters.
func (s *Store) Stats() Stats {
	return Stats{Receiver: s.recv.Stats(), WindowLen: s.window.Len(), WindowCapacity: s.window.Capacity(),
		HWMCacheLen: s.tracker.CachedLen(), AppliedWALTime: max(s.recv.LastEventTime(), s.tracker.Clock()),
		Ledger: s.ledger.Stats(), BackgroundErrors: s.events.count.Load(), WriteStalled: s.events.stalled.Load(), DiskFull: s.full.Load()}
}

// State is the read API of the default session state machine (valid when
// Options.Applier was left nil).
func (s *Store) State() *session.State { return s.state }

// LedgerTable is the replicated request-ledger table (read-only use; a
// leader serves requests from it).
func (s *Store) LedgerTable() *idempotency.LedgerTable { return s.ledger }

// Tracker exposes the session HWMs (read-only use: Get, Clock).
func (s *Store) Tracker() *session.Tracker { return s.tracker }

// Window is the idempotency-key window.
func (s *Store) Window() *idempotency.Store { return s.window }

// Close waits for the Applies in flight, refuses new ones and closes the
// store. Writes are durable before Close (every ack follows a sync); Close
// flushes the memtable so the next Open replays no WAL. Close is idempotent.
//
// After ErrFailed the Pebble instance is wedged (its commit
// pipeline stopped mid-write): Close then skips the flush and closes what it
// can, and returns the store failure. Reopening the directory recovers.
//
// While Pebble cannot flush (a full disk), Close does not wait for it for
// ever: it returns ErrStalled, wrapping the disk's error, after a few
// failed retries, and the store closes itself later if the disk recovers
// (see ErrStalled).
func (s *Store) Close() error {
	return s.shutdown(true)
}

// kill closes the store the way a killed process stops, for fault drills
// (internal/drill): without the clean-shutdown flush, so the next Open
// replays Pebble's WAL. (Power loss, where unsynced writes vanish, is
// simulated in tests with vfs.CrashClone.)
func (s *Store) kill() error {
	return s.shutdown(false)
}

func init() {
	drill.Register(func(x any) (error, bool) {
		if s, ok := x.(*Store); ok {
			return s.kill(), true
		}
		return nil, false
	})
}

func (s *Store) shutdown(flush bool) error {
	s.closeOnce.Do(func() {
		s.life.Close()
		s.stall.mu.Lock()
		stalled := s.stall.abandoned != nil // its Start holds the receiver
		s.stall.mu.Unlock()
		if !stalled {
			if failed := s.recv.Err(); failed != nil {
				_ = guard(s.db.Close) // best effort on a wedged store
				s.closeErr = failed
				return
			}
		}
		s.closeErr = s.closeStore(flush)
	})
	return s.closeErr
}

// guard runs a Pebble call, converting the panics of a failed store (our
// FatalLogger's, or Pebble's own after a fatal commit) into errors.
func guard(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if pe, ok := p.(error); ok {
				err = fmt.Errorf("%w: %w", ErrFailed, pe)
			} else {
				err = fmt.Errorf("%w: %v", ErrFailed, p)
			}
		}
	}()
	return fn()
}

// Stats is a store's readable state.
type Stats struct {
	Receiver       ReceiverStats
	WindowLen      int
	WindowCapacity int
	// HWMCacheLen is the number of sessions whose HWM is cached in memory
	// (session.Tracker.CachedLen).
	HWMCacheLen int
	// AppliedWALTime is the leader's timestamp (unix ns, the WAL clock) of
	// the newest event applied: of the last batch committed since Open, or
	// of the newest session event the store holds (session.Tracker.Clock).
	AppliedWALTime int64
	// Ledger counts the request-ledger records applied to the store.
	Ledger idempotency.TableStats
	// BackgroundErrors counts the errors Pebble reported from its
	// background work (flushes, compactions) on this store, its open
	// included; each is retried after a backoff (see open.go).
	BackgroundErrors uint64
	// WriteStalled is true while Pebble holds the store's writes back
	// (pebble.EventListener WriteStallBegin to WriteStallEnd): too many
	// memtables waiting for a flush, or too many level-0 files. Brief
	// stalls are normal under load; one that lasts, with BackgroundErrors
	// growing, is a disk that cannot take a flush (full, failing).
	WriteStalled bool
	// DiskFull is true while the store's disk has less free space than
	// Options.MinFreeBytes: batches wait (Serve) or are refused
	// (ErrDiskFull) until there is room again.
	DiskFull bool
}

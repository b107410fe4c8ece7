package follower

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/diskguard"
	"github.com/oncewal/oncewal/internal/lifegate"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/wal"
)

// ErrFollowerClosed is returned by methods of a closed Follower.
var ErrFollowerClosed = errors.New("follower: closed")

// ErrNotStore: a directory or Pebble store that is not an oncewal follower
// store (Open refuses it unchanged).
var ErrNotStore = errors.New("follower: not an oncewal follower store")

// ErrPermanentRefusal: Serve stopped because the leader (or the transport's
// authentication) refused the follower in a way no retry can fix, and
// Options.StopOnPermanentRefusal is set. It wraps the refusal, so
// errors.Is(err, replication.ErrWrongShard) and the like work.
var ErrPermanentRefusal = errors.New("follower: refused for good")

// Options configures a Follower. Every zero field takes the default named in
// its comment (see EnsureDefaults); Open validates the result and reports all
// problems at once.
type Options struct {
	// Shard is the shard this follower serves; batches of other shards are
	// refused with replication.ErrWrongShard. Default 0.
	Shard uint32
	// ID is the follower's stable name, sent in every hello; a leader that
	// ships to several followers of a shard (replication.Fanout) tells them
	// apart by it and serves only the IDs it has registered. 1..64 bytes of
	// [A-Za-z0-9._-] (replication.ValidFollowerID). Default "" (anonymous:
	// served only by a single-follower replication.Shipper).
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
	// replication.ReceiverOptions.NoSync). Default false: every ack is durable.
	NoSync bool
	// Applier is the state machine events are applied to. Default: the
	// session state machine and the request-ledger table
	// (replication.SessionApplier with State and Ledger). A custom Applier
	// reads the store through the batch it is handed and never sees the
	// request-ledger records: the follower applies them to LedgerTable()
	// itself (replication.RouteLedger), so it needs nothing from the
	// Follower and can be given before Open. It must keep the Applier
	// contract (package replication): deterministic, rejections as
	// results; on a leader, a replication.Validator refuses before logging.
	Applier store.Applier
	// Ledger configures the request-ledger table (sweep interval and limit,
	// on the WAL clock). Default: idempotency.TableOptions defaults.
	Ledger idempotency.TableOptions
	// Logger receives the follower's log lines. Default slog.Default().
	Logger *slog.Logger
	// LeaderStore: the store is a leader's own (package leader sets it),
	// so its open and Promote are not logged as a follower's — the leader
	// logs what it did, once. Default false.
	LeaderStore bool
	// FS is the filesystem Pebble uses. Default vfs.Default (the OS). Tests
	// pass vfs.NewCrashableMem() or an errorfs wrapper.
	FS vfs.FS
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
	// Rebuild says what Run does when the leader refuses the store in a way
	// only a rebuild fixes (replication.ErrDiverged, ErrBehindRetention —
	// which is also what an empty store gets from a leader whose log no
	// longer starts at LSN 1): RebuildAuto replaces the store with a
	// snapshot from RebuildFrom and serves on from its LSN; RebuildNever
	// (the default here, as a library cannot know where to rebuild from)
	// leaves the refusal standing. The CLI's default is auto (README).
	Rebuild RebuildMode
	// RebuildFrom is the donor a rebuild fetches from: the shard's leader
	// or another follower (snapshot.Donor in process, or grpctransport's
	// snapshot client). Required with RebuildAuto. A donor that answers
	// snapshot.ErrDonorClosed (its leader closed) is asked once, not
	// retried: after MaxReconnectBackoff the store goes back to the
	// Dialer, which reaches whichever leader serves now; a new refusal
	// asks RebuildFrom again.
	RebuildFrom snapshot.Source
	// Snapshot configures the rebuild's transfer (chunk size, the RateLimit
	// throttle, retries). Default: snapshot.Options defaults.
	Snapshot snapshot.Options
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
	// rebuilder is set by Run and Node when Rebuild is RebuildAuto: Serve
	// then returns ErrPermanentRefusal at a refusal only a rebuild fixes
	// (NeedsRebuild), for them to rebuild the store, and keeps redialling
	// at the others unless StopOnPermanentRefusal.
	rebuilder bool
	// MinFreeBytes is the free space the store's disk keeps: below it no
	// batch is applied (Apply and Start refuse it with
	// replication.ErrDiskFull; Serve holds it and waits for room), so
	// that Pebble never meets a full disk, which it cannot survive
	// gracefully (internal/diskguard). Default diskguard.DefaultMinFree
	// (64 MiB); negative: off.
	MinFreeBytes int64
}

// Bounds and default of Options.MemTableSize. The default is where the
// CPU saved levels off on the fresh and retry benchmarks (doc.go, "Memory
// per shard"). Pebble refuses 4 GiB − 1 and more.
const (
	DefaultMemTableSize = 32 << 20
	MinMemTableSize     = 256 << 10
	MaxMemTableSize     = 2 << 30
)

// Defaults of the redial options (see Options).
const (
	DefaultReconnectBackoff    = 100 * time.Millisecond
	DefaultMaxReconnectBackoff = 5 * time.Second
	DefaultReconnectJitter     = 0.5
	DefaultLeaderTimeout       = 5 * time.Second
)

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
	if o.MinFreeBytes == 0 {
		o.MinFreeBytes = diskguard.DefaultMinFree
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = DefaultMemTableSize
	}
	return o
}

// Validate reports every invalid field in one error.
func (o *Options) Validate() error {
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
	if o.ReconnectBackoff < 0 {
		errs = append(errs, fmt.Errorf("ReconnectBackoff %v is negative", o.ReconnectBackoff))
	}
	if o.MaxReconnectBackoff < o.ReconnectBackoff {
		errs = append(errs, fmt.Errorf("MaxReconnectBackoff %v is below ReconnectBackoff %v", o.MaxReconnectBackoff, o.ReconnectBackoff))
	}
	if !(o.ReconnectJitter <= 1) { // NaN too
		errs = append(errs, fmt.Errorf("ReconnectJitter %v is above 1", o.ReconnectJitter))
	}
	if err := replication.ValidFollowerID(o.ID); err != nil {
		errs = append(errs, fmt.Errorf("ID: %w", err))
	}
	if o.Rebuild > RebuildAuto {
		errs = append(errs, fmt.Errorf("Rebuild %d is neither RebuildNever nor RebuildAuto", o.Rebuild))
	}
	if o.Rebuild == RebuildAuto && o.RebuildFrom == nil {
		errs = append(errs, errors.New("Rebuild is RebuildAuto but RebuildFrom is nil"))
	}
	sn := o.Snapshot
	if err := sn.EnsureDefaults().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Snapshot: %w", err))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("follower: invalid options: %w", errors.Join(errs...))
}

// Follower is an embeddable follower node for one shard: a Pebble store, the
// HWM tracker, the idempotency-key window and the segment receiver, wired.
type Follower struct {
	dir     string
	opts    Options
	db      *pebble.DB
	events  *storeEvents
	link    linkCounters
	tracker *session.Tracker
	window  *idempotency.Store
	state   *session.State
	ledger  *idempotency.LedgerTable
	recv    *store.Receiver

	// life orders Apply (a hold) and Serve (a run) against stop (Close,
	// Kill, Promote): after stop no Apply is in flight, every Serve has
	// returned and neither can start.
	life *lifegate.Gate

	stall stallGuard
	disk  *diskguard.Guard // MinFreeBytes
	full  atomic.Bool      // the last check found the disk full

	closeOnce sync.Once
	closeErr  error
}

// Open opens (or creates) the follower store in dir and recovers its applied
// position, epoch, HWMs and window from it. It is OpenContext without a
// deadline.
func Open(dir string, opts *Options) (*Follower, error) {
	return OpenContext(context.Background(), dir, opts)
}

// OpenContext opens (or creates) the follower store in dir and recovers its
// applied position, epoch, HWMs and window from it.
//
// It refuses, before anything on disk changes: a directory that is not a
// store or empty (*LayoutError: a node directory, a WAL or leader directory,
// unrelated files), a Pebble store that is not oncewal's (ErrNotStore), and
// a store whose recorded identity — kind, shard, WindowCapacity,
// RetentionHorizon — differs from opts (*MismatchError; see
// SetRecordedOptions). A new store records opts' identity in its first
// commit. A store Pebble cannot open because its recovery fails in the
// background (a full disk, I/O errors) gives ErrStoreUnavailable in bounded time
// instead of hanging, and ctx ending gives ctx.Err() (see the notes in
// open.go). A store whose files fail Pebble's checksums gives
// ErrStoreCorrupt.
func OpenContext(ctx context.Context, dir string, opts *Options) (*Follower, error) {
	f, err := openContext(ctx, dir, opts)
	return f, CorruptStoreError(dir, err)
}

func openContext(ctx context.Context, dir string, opts *Options) (*Follower, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("follower: opening store %s: %w", dir, err)
	}
	_, statErr := o.FS.Stat(dir)
	existed := statErr == nil
	asked := identityOf(&o)
	fresh := false
	// An open of this directory given up earlier (ErrStoreUnavailable, ctx)
	// holds the store's lock while it retries: join it; its store's
	// identity is checked below.
	if !pendingOpenOf(o.FS, dir) {
		// A snapshot install a crash interrupted is finished (or a fetch
		// it interrupted removed) before the directory is looked at: the
		// store opens as the old one or the new one, never a mix.
		if err := snapshot.Recover(o.FS, dir); err != nil {
			return nil, fmt.Errorf("follower: opening store %s: %w", dir, err)
		}
		_, statErr = o.FS.Stat(dir)
		existed = statErr == nil
		layout, detail, err := DirLayout(o.FS, dir)
		if err != nil {
			return nil, fmt.Errorf("follower: opening store %s: %w", dir, err)
		}
		switch layout {
		case LayoutEmpty:
			fresh = true
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
		return nil, fmt.Errorf("follower: creating store directory %s: %w", dir, err)
	}
	ev := newStoreEvents(o.Logger)
	db, ev, err := openPebble(ctx, dir, pebbleOptions(&o, ev), ev)
	if err != nil {
		if fresh && !errors.Is(err, ErrStoreUnavailable) && ctx.Err() == nil {
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
	f, err := func() (*Follower, error) {
		if !recorded {
			if err := writeIdentity(db, asked); err != nil {
				return nil, fmt.Errorf("follower: recording the identity of store %s: %w", dir, err)
			}
			if !fresh {
				o.Logger.Info("oncewal follower: recorded the identity of a store that had none", "dir", dir, "identity", asked.String())
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
	return f, nil
}

func wire(dir string, db *pebble.DB, ev *storeEvents, o Options) (*Follower, error) {
	tracker, err := session.OpenTracker(db, &session.TrackerOptions{
		CacheSize:        o.HWMCacheSize,
		RetentionHorizon: o.RetentionHorizon,
		LogBatches:       o.HWMLogBatches,
		LogSessions:      o.HWMLogSessions,
	})
	if err != nil {
		return nil, fmt.Errorf("follower: %w", err)
	}
	f := &Follower{
		dir: dir, opts: o, db: db, events: ev, tracker: tracker,
		window: idempotency.NewStore(o.WindowCapacity),
		state:  session.NewState(db),
	}
	if f.ledger, err = idempotency.OpenLedgerTable(db, &o.Ledger); err != nil {
		return nil, fmt.Errorf("follower: %w", err)
	}
	var applier store.Applier = store.SessionApplier{State: f.state, Ledger: f.ledger}
	if o.Applier != nil {
		applier = store.RouteLedger(f.ledger, o.Applier)
	}
	f.recv, err = store.NewReceiver(db, tracker, f.window, applier, &store.ReceiverOptions{
		Shard:      o.Shard,
		FollowerID: o.ID,
		NoSync:     o.NoSync,
		Logger:     o.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("follower: %w", err)
	}
	f.life = lifegate.New()
	f.disk = diskguard.New(o.FS, dir, o.MinFreeBytes)
	if !o.LeaderStore {
		lsn, epoch := f.recv.Position()
		o.Logger.Info("oncewal follower opened", "dir", dir, "shard", o.Shard,
			"applied_lsn", lsn, "epoch", epoch, "window", f.window.Len())
	}
	return f, nil
}

// Apply applies one shipped batch (see replication.Receiver.Apply). Embedders
// with their own transport call it directly and send back the returned ack.
func (f *Follower) Apply(batch []byte) (store.Result, error) {
	return f.Start(batch).Wait()
}

// Start starts applying one shipped batch without waiting for its WAL sync
// (see replication.Receiver.Start): embedders with their own transport that
// pipeline batches call it, then Wait for each Pending in order and send
// its ack. Wait for every Pending before Close.
func (f *Follower) Start(batch []byte) *store.Pending {
	release, ok := f.life.Hold()
	if !ok {
		return store.Refused(f.recv.Hello(), ErrFollowerClosed)
	}
	defer release()
	if err := f.checkDisk(); err != nil {
		return store.Refused(f.recv.Hello(), err)
	}
	return f.recv.Start(batch)
}

// stop cancels every Serve, waits for in-flight Applies, forbids new ones and
// new Serves, and waits for the Serves to return. It reports false if the
// follower was already stopped.
func (f *Follower) stop() bool { return f.life.Close() }

// Serve connects through d and applies what the leader ships until ctx ends,
// Close is called, or the store fails (replication.ErrStoreFailed, after
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
		return ErrFollowerClosed
	}
	defer done()

	log := f.opts.Logger
	backoff := newRedialBackoff(&f.opts)
	var streak linkStreak
	for ctx.Err() == nil {
		start := time.Now()
		f.link.attempts.Add(1)
		conn, err := d.Dial(ctx, f.recv.Hello())
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
			streak.fail(log, err, capped, wait, next, f.opts.ID)
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
	case f.opts.StopOnPermanentRefusal && permanent(err):
		return "stopping: StopOnPermanentRefusal is set (oncewal follower --stop-on-refusal: the process exits 1)", true
	}
	return fmt.Sprintf("retrying in %v, then at most every %v until the leader accepts it",
		wait.Round(time.Millisecond), f.opts.MaxReconnectBackoff), false
}

// pipelineDepth is how many batches serveConn keeps between Start and the
// ack: while batch N's WAL sync is in flight, up to pipelineDepth-1 later
// batches are decided and staged. The shipper keeps more in flight
// (replication.ShipperOptions.MaxInFlight, default 32), so the pipe stays
// full.
const pipelineDepth = 4

// serveConn applies what conn delivers until it fails; delivered is called
// once, at the first batch. Batches are pipelined: the receive loop starts
// each (Receiver.Start) and an acknowledger waits for them in order
// (Pending.Wait) and sends their acks, so no ack precedes its batch's sync.
func (f *Follower) serveConn(ctx context.Context, conn replication.FollowerConn, delivered func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pending := make(chan *store.Pending, pipelineDepth-1)
	ackErr := make(chan error, 1)
	var abandoned <-chan *store.Pending // see start; set before pending is closed
	go func() {
		defer func() {
			if abandoned != nil {
				f.finishAbandoned(abandoned)
			}
		}()
		var failed error
		for p := range pending {
			res, err := p.Wait() // every Pending is waited for, also after a failure
			if failed != nil {
				continue
			}
			if storeTrouble(err) {
				_ = conn.Send(ctx, res.Ack)
				failed = err
				cancel()
				continue
			}
			if err != nil && !errors.Is(err, replication.ErrSeqGap) && !errors.Is(err, replication.ErrOutOfOrder) {
				f.opts.Logger.Warn("oncewal follower: batch refused", "err", err)
			}
			if err := conn.Send(ctx, res.Ack); err != nil {
				failed = err
				cancel()
			}
		}
		ackErr <- failed
	}()
	var err error
	for first := true; f.waitStalled(ctx); first = false {
		var batch []byte
		if batch, err = f.recvLive(ctx, conn); err != nil {
			break
		}
		f.link.lastBatch.Store(time.Now().UnixNano())
		if first {
			delivered()
		}
		if !f.waitForRoom(ctx) {
			break // the batch is resent after the reconnect
		}
		var p *store.Pending
		if p, abandoned = f.start(ctx, batch); p == nil {
			err = fmt.Errorf("%w: %w", ErrStoreStalled, ctx.Err())
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

// Shard is the shard the follower serves.
func (f *Follower) Shard() uint32 { return f.opts.Shard }

// Position returns the applied LSN and the highest committed epoch.
func (f *Follower) Position() (appliedLSN, epoch uint64) { return f.recv.Position() }

// Stats returns a snapshot of the receiver's counters plus the window size.
func (f *Follower) Stats() Stats {
	return Stats{Receiver: f.recv.Stats(), WindowLen: f.window.Len(), WindowCapacity: f.window.Capacity(),
		HWMCacheLen: f.tracker.CachedLen(), AppliedWALTime: max(f.recv.LastEventTime(), f.tracker.Clock()),
		Ledger: f.ledger.Stats(), BackgroundErrors: f.events.count.Load(), WriteStalled: f.events.stalled.Load(), DiskFull: f.full.Load(),
		Link: f.link.snapshot()}
}

// State is the read API of the default session state machine (valid when
// Options.Applier was left nil).
func (f *Follower) State() *session.State { return f.state }

// LedgerTable is the replicated request-ledger table (read-only use; see
// Promote for serving requests from it).
func (f *Follower) LedgerTable() *idempotency.LedgerTable { return f.ledger }

// Tracker exposes the session HWMs (read-only use: Get, Clock).
func (f *Follower) Tracker() *session.Tracker { return f.tracker }

// DB returns the underlying Pebble store, for embedders that read their own
// Applier's rows. Writing to it outside an Applier voids every guarantee.
func (f *Follower) DB() *pebble.DB { return f.db }

// Close stops every Serve, waits for them, and closes the store. Writes are
// already durable (each batch commits with Sync unless NoSync); Close also
// flushes the memtable so the next Open replays no WAL. Close is idempotent.
//
// After replication.ErrStoreFailed the Pebble instance is wedged (its commit
// pipeline stopped mid-write): Close then skips the flush and closes what it
// can, and returns the store failure. Reopening the directory recovers.
//
// While Pebble cannot flush (a full disk), Close does not wait for it for
// ever: it returns ErrStoreStalled, wrapping the disk's error, after a few
// failed retries, and the store closes itself later if the disk recovers
// (see ErrStoreStalled).
func (f *Follower) Close() error {
	return f.shutdown(true)
}

// Retired is what a store retired from following hands to the leader
// promoted on it (leader.Promote). It goes when the store layer opens a
// leader's store directly.
type Retired struct {
	Dir     string
	Options Options
	Window  *idempotency.Store
}

// Retire stops the follower for good — Serve returns, Apply answers
// ErrFollowerClosed — so that a leader can take its store over
// (leader.Promote). It refuses a store that has failed.
func (f *Follower) Retire() (Retired, error) {
	if !f.stop() {
		return Retired{}, ErrFollowerClosed
	}
	if err := f.recv.Err(); err != nil {
		return Retired{}, fmt.Errorf("follower: cannot promote a failed store: %w", err)
	}
	return Retired{Dir: f.dir, Options: f.opts, Window: f.window}, nil
}

// Kill stops the follower the way a killed process stops, for fault drills:
// Serve is cancelled wherever it is and the store is closed without the
// clean-shutdown flush, so the next Open replays Pebble's WAL. (Power loss,
// where unsynced writes vanish, is simulated in tests with vfs.CrashClone.)
func (f *Follower) Kill() error {
	return f.shutdown(false)
}

func (f *Follower) shutdown(flush bool) error {
	f.closeOnce.Do(func() {
		f.stop()
		f.stall.mu.Lock()
		stalled := f.stall.abandoned != nil // its Start holds the receiver
		f.stall.mu.Unlock()
		if !stalled {
			if failed := f.recv.Err(); failed != nil {
				_ = guard(f.db.Close) // best effort on a wedged store
				f.closeErr = failed
				return
			}
		}
		f.closeErr = f.closeStore(flush)
	})
	return f.closeErr
}

// guard runs a Pebble call, converting the panics of a failed store (our
// FatalLogger's, or Pebble's own after a fatal commit) into errors.
func guard(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if pe, ok := p.(error); ok {
				err = fmt.Errorf("%w: %w", store.ErrStoreFailed, pe)
			} else {
				err = fmt.Errorf("%w: %v", store.ErrStoreFailed, p)
			}
		}
	}()
	return fn()
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

// Stats is a follower's readable state.
type Stats struct {
	Receiver       store.Stats
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
	// Link describes the connection to the leader (Serve).
	Link LinkStats
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
	// (replication.ErrDiskFull) until there is room again.
	DiskFull bool
}

var _ io.Closer = (*Follower)(nil)

// storeTrouble: err ends Serve so that the embedder closes and reopens the
// follower — the store failed for good (replication.ErrStoreFailed), or an
// I/O error composed no batch (replication.ErrStaging: the receiver is still
// usable, but a store that cannot be read is not retried in a loop), or the
// Applier failed (replication.ErrApply: deterministic, it would fail the
// resent batch again, so only a fixed Applier, after a restart, goes on).
func storeTrouble(err error) bool {
	return errors.Is(err, store.ErrStoreFailed) || errors.Is(err, store.ErrStaging) ||
		errors.Is(err, store.ErrApply)
}

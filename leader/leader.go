package leader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/lifegate"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Errors returned by Open and the append paths. Every refusal leaves the
// node's directory and memory as they were.
var (
	// ErrBadOptions: Open, OpenLedgerLog, NewShipper, NewFanout or Promote
	// was given unusable options (every problem is listed in the joined
	// error, which names the options type). Nothing was changed.
	ErrBadOptions = errors.New("leader: bad options")
	// ErrForeignShard: the directory holds a store or WAL segments of a
	// shard outside the deployment's 0..Shards-1 (a wrong --shards, or
	// another deployment's directory).
	ErrForeignShard = errors.New("leader: directory holds a shard this leader does not own")
	// ErrCrossShard: one Append was given events of sessions that route to
	// different shards; a batch is atomic only within one shard's log.
	ErrCrossShard = errors.New("leader: events route to more than one shard")
	// ErrNotLeaderStore: the directory holds a follower's store — a
	// follower's node directory, or a store no leader ever raised — which
	// a leader would serve at its old leader's epoch without fencing it.
	// Promote it first (oncewal promote, or Options.Promote). Nothing was
	// changed.
	ErrNotLeaderStore = errors.New("leader: not a leader's store")
	// ErrEpochRegression: a shard's WAL holds a batch of an older epoch
	// after a newer one (wal.ErrEpochRegression); the message names the LSN,
	// both epochs and the command that cuts it (oncewal waldump
	// --cut-epoch-regression). Nothing was changed.
	ErrEpochRegression = wal.ErrEpochRegression
	// ErrClosed: a call on a closed Leader or LedgerLog — Run, Retain,
	// Register, Unregister, WaitAcked, Donor, a Begin of its donors'
	// snapshots, and Append (wrapping wal.ErrClosed); Commit and the
	// ledger answer with the ledger's idempotency.ErrClosed.
	ErrClosed = errors.New("leader: closed")
)

// LockFileName is the file a Leader locks in its directory for as long as
// it is open: a second Leader on the directory, in this process or another,
// fails at once with wal.ErrLocked.
const LockFileName = store.LeaderLockFileName

// WALDirName is the directory, inside a leader's directory, that holds every
// shard's WAL segments (segment names carry the shard).
const WALDirName = store.LeaderWALDirName

// Options configures a Leader. Zero fields take the defaults named in their
// comments; Open validates the result and reports every problem at once.
type Options struct {
	// Shards is the deployment's fixed shard count: the leader owns shards
	// 0..Shards-1 and routes sessions with replication.ShardRouter. Required,
	// 1..replication.MaxShards.
	Shards int
	// Epoch is the leader epoch stamped on every batch. Default 0 keeps the
	// epoch the shard stores have committed (1 for new stores). A higher
	// epoch is a promotion: it is persisted in each shard's store before the
	// first append, and from then on that store and every follower that sees
	// the new epoch refuse the old one. A lower epoch than a store has
	// committed, or than the last batch of its WAL (the authority on the
	// epoch: a store rebuilt from the log takes the log's), is refused
	// (replication.ErrStaleEpoch); one above replication.MaxEpoch too
	// (replication.ErrEpochExhausted).
	Epoch uint64
	// Store is the template for every shard's local store (Shard is set per
	// shard). The leader applies its own log to it with the same receiver a
	// follower runs, so WindowCapacity and RetentionHorizon must equal the
	// followers'. Default: store.Options defaults.
	Store store.Options
	// Ledger configures every shard's request ledger (TTL, lease, failure
	// TTL). Default: idempotency.LedgerOptions defaults.
	Ledger idempotency.LedgerOptions
	// Wall is the wall clock in unix nanoseconds, read to advance the WAL
	// clock (see the package doc: the WAL clock never goes back). Default
	// time.Now().UnixNano.
	Wall func() int64
	// SegmentSize is the WAL segment size. Default wal.DefaultSegmentSize.
	SegmentSize int64
	// Logger receives the leader's log lines. Default slog.Default().
	Logger *slog.Logger
	// FS is the filesystem of the whole directory: every shard's store
	// (it replaces Store.FS), the WAL and the lock file. Default
	// vfs.Default; tests crash a leader with vfs.NewCrashableMem.
	FS vfs.FS

	// Listener returns the listener shard's followers connect to; it is
	// called once per shard by Open. nil: the leader does not ship (Run and
	// WaitAcked return ErrNotShipping) — an embedder that ships the WAL by
	// other means.
	Listener func(shard uint32) replication.Listener
	// Followers are the registered followers of every shard (stable IDs,
	// replication.ValidFollowerID, sent in each follower's hello). Each gets
	// one shipping stream per shard, counts towards WaitAcked's policies and
	// has a replication slot that pins the WAL it still needs. A hello with
	// another ID is refused (replication.ErrUnknownFollower). This is the
	// exact set: Open deletes the slots of followers no longer listed.
	Followers []string
	// Shipping is the template of every follower stream's options
	// (MaxInFlight, timeouts); the WAL, shard, listener, epoch, durability
	// bound and hello check are set per shard. Default: the
	// ShipperOptions defaults.
	Shipping ShipperOptions
	// MaxRetainedBytes bounds each shard's WAL: when the segments its slots
	// pin exceed it, the most lagging followers are dropped from retention
	// (and refused with replication.ErrBehindRetention once what they need
	// is deleted, until they are rebuilt). It counts the batches' bytes; on
	// disk each segment may also hold up to wal.DefaultZeroAhead of zeros
	// written ahead of its appends. Default 4 GiB.
	MaxRetainedBytes int64
	// RetentionInterval is how often Run advances the slots and deletes
	// segments no slot needs. Default 1s.
	RetentionInterval time.Duration
	// AckTimeout bounds every Shard.WaitAcked: a batch its policy's
	// followers have not acknowledged by then fails with ErrAckTimeout
	// instead of waiting as long as the caller's context. Default
	// DefaultAckTimeout (5s); negative: no bound (the caller's context
	// only).
	AckTimeout time.Duration
	// Promote lets Open take over follower stores (a follower's node
	// directory, or stores no leader raised): each such store's epoch is
	// raised — to Epoch, which must exceed every epoch the store and its
	// log have seen, default the highest + 1 — and the store is marked a
	// leader's (see the package doc). Without it such a store is refused
	// (ErrNotLeaderStore). Set only by a promotion that has checked this
	// follower is the most advanced (oncewal promote). Default false.
	Promote bool
}

// Defaults of Options.
const (
	DefaultMaxRetainedBytes  = 4 << 30
	DefaultRetentionInterval = time.Second
	// DefaultAckTimeout is half the client's attempt bound
	// (client.DefaultAttemptTimeout, 10s; clientapi waits as long as the
	// caller's deadline): a write stuck on absent followers is answered
	// Unavailable, naming the followers, while the client's attempt still
	// runs, so the client learns why and has time to retry, instead of
	// its own deadline ending the attempt without a reason. Healthy
	// followers acknowledge in milliseconds, so 5s only ends waits that
	// would not end.
	DefaultAckTimeout = 5 * time.Second
)

// EnsureDefaults fills unset fields with their documented defaults and
// returns o.
func (o *Options) EnsureDefaults() *Options {
	o.Store.EnsureDefaults()
	ensureShared(&o.Wall, &o.Logger, &o.FS)
	o.Store.FS = o.FS
	if o.SegmentSize == 0 {
		o.SegmentSize = wal.DefaultSegmentSize
	}
	if o.MaxRetainedBytes == 0 {
		o.MaxRetainedBytes = DefaultMaxRetainedBytes
	}
	if o.RetentionInterval == 0 {
		o.RetentionInterval = DefaultRetentionInterval
	}
	if o.AckTimeout == 0 {
		o.AckTimeout = DefaultAckTimeout
	}
	return o
}

// ensureShared fills the defaults the leader's options types share: the
// wall clock, the logger (nil: the type has none) and the WAL's filesystem.
func ensureShared(wall *func() int64, logger **slog.Logger, fs *vfs.FS) {
	if *wall == nil {
		*wall = func() int64 { return time.Now().UnixNano() }
	}
	if logger != nil && *logger == nil {
		*logger = slog.Default()
	}
	if *fs == nil {
		*fs = vfs.Default
	}
}

// Validate reports every invalid field in one error.
func (o *Options) Validate() error {
	var errs []error
	if _, err := NewShardRouter(o.Shards); err != nil {
		errs = append(errs, err)
	}
	if o.SegmentSize < 0 {
		errs = append(errs, fmt.Errorf("SegmentSize %d is negative", o.SegmentSize))
	}
	if err := replication.CheckEpoch("Epoch", o.Epoch); err != nil {
		errs = append(errs, err)
	}
	if err := o.Store.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.MaxRetainedBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxRetainedBytes %d is negative", o.MaxRetainedBytes))
	}
	if o.RetentionInterval < 0 {
		errs = append(errs, fmt.Errorf("RetentionInterval %v is negative", o.RetentionInterval))
	}
	for i, id := range o.Followers {
		if id == "" {
			errs = append(errs, fmt.Errorf("Followers[%d] is empty", i))
		} else if err := replication.ValidFollowerID(id); err != nil {
			errs = append(errs, fmt.Errorf("Followers[%d]: %w", i, err))
		} else if slices.Index(o.Followers, id) != i {
			errs = append(errs, fmt.Errorf("Followers: %q listed twice", id))
		}
	}
	if len(o.Followers) > 0 && o.Listener == nil {
		errs = append(errs, errors.New("Followers without a Listener: nothing would ship to them"))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
}

// Leader is the leader of every shard of a deployment on one node. Per shard
// it owns the WAL writer, the stamping of every event (SeqNo, idempotency
// key, WAL clock), the session-expiry decision and the request ledger. It is
// safe for concurrent use: appends to one shard are serialised, shards run
// in parallel.
type Leader struct {
	dir    string
	opts   Options
	router ShardRouter
	shards []*Shard
	lock   io.Closer

	// life orders every use of the shard stores outside their logs —
	// retention passes, slot writes, donors' cuts (hold) — and every Run
	// against Close; its Context stops every WaitAcked.
	life *lifegate.Gate

	closeOnce sync.Once
	closeErr  error
}

// Shard is one shard of a Leader: its local store, its log and its ledger.
type Shard struct {
	l      *Leader
	id     uint32
	walDir string
	fs     vfs.FS // of walDir
	store  *store.Store
	log    *LedgerLog
	ship   *shipping // nil without a Listener
}

// Open opens (creating if needed) the leader of opts.Shards shards in dir:
// per shard a local store in follower.ShardDir(dir, shard) and a WAL in
// dir/wal. Before it changes anything it checks, read-only, what dir holds
// (see the package doc, "Where a leader opens"): it refuses a directory
// holding other shards or another shard count, a follower's directory or
// store (ErrNotLeaderStore, unless opts.Promote), a log it cannot read or
// whose epochs go back, a store its log cannot bring up to date, and an
// epoch below the stores' or the log's. Then it locks the directory
// (wal.ErrLocked if another Leader holds it), recovers each log (repairing
// a torn tail), re-applies to each store what its log has beyond it,
// restores every session's SeqNo from there, and persists a raised epoch
// before anything is appended.
func Open(dir string, opts *Options) (*Leader, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if dir == "" {
		return nil, fmt.Errorf("%w: directory is required", ErrBadOptions)
	}
	router, _ := NewShardRouter(o.Shards)
	// Everything is checked before anything is created, the lock file
	// included (taking an existing one changes its mtime); a leader of this
	// process that holds the directory is refused at once, before the checks
	// read its stores (one of another process shows at LockFile).
	if err := wal.CheckLockFile(o.FS, dir, LockFileName); err != nil {
		return nil, err
	}
	p, err := preflight(o.FS, dir, &o)
	if err != nil {
		return nil, err
	}
	if err := wal.MkdirAllSynced(o.FS, dir); err != nil {
		return nil, err
	}
	lock, err := wal.LockFile(o.FS, dir, LockFileName)
	if err != nil {
		return nil, err
	}
	if p.recordShards {
		if err := store.RecordShardCount(o.FS, dir, o.Shards); err != nil {
			_ = lock.Close()
			return nil, err
		}
	}
	l := &Leader{dir: dir, opts: o, router: router, lock: lock}
	l.life = lifegate.New()
	for s := range uint32(o.Shards) {
		sh, err := l.openShard(s, p.epochs[s])
		if err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("leader: shard %d: %w", s, err)
		}
		l.shards = append(l.shards, sh)
	}
	opened := "opened"
	if p.promoted {
		opened = "promoted"
	}
	o.Logger.Info("oncewal leader "+opened, "dir", dir, "shards", o.Shards, "epochs", p.epochs)
	return l, nil
}

// plan is what preflight decided for Open.
type plan struct {
	epochs       []uint64 // per shard, the epoch it serves at
	recordShards bool     // the shard count is to be recorded
	promoted     bool     // some store was made a leader's (Options.Promote)
}

// preflight checks, read-only, that dir can be opened as asked, and decides
// each shard's epoch. Nothing on disk changes whatever it finds.
func preflight(fs vfs.FS, dir string, o *Options) (plan, error) {
	p := plan{epochs: make([]uint64, o.Shards), recordShards: true}
	st, err := fs.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		for s := range p.epochs {
			p.epochs[s] = max(o.Epoch, 1)
		}
		return p, nil
	case err != nil:
		return p, err
	case !st.IsDir():
		return p, fmt.Errorf("%w: %s is not a directory", ErrBadOptions, dir)
	}
	// A single store or a WAL directory given as the node directory would
	// get a store and a log created inside it; a follower's node directory
	// would be served at its old leader's epoch (ErrNotLeaderStore below).
	layout, detail, err := store.DirLayout(fs, dir)
	switch {
	case err != nil:
		return p, err
	case layout == store.LayoutStore || layout == store.LayoutWAL:
		return p, &store.LayoutError{Dir: dir, Found: layout, Want: store.LayoutLeader, Detail: detail}
	case layout == store.LayoutNode && !o.Promote:
		return p, fmt.Errorf("%w: %s is a follower node directory (%s, no %s or %s/): serving it would take its old leader's epoch "+
			"without fencing it; promote it first with oncewal promote --dir %s (it checks that it is the most advanced follower "+
			"and raises the epoch), then start the leader", ErrNotLeaderStore, dir, detail, LockFileName, WALDirName, dir)
	}
	stores, err := store.NodeShards(fs, dir)
	if err != nil {
		return p, err
	}
	walDir := filepath.Join(dir, WALDirName)
	var logs []uint32
	if _, err := fs.Stat(walDir); err == nil {
		if logs, err = wal.ListShardsFS(fs, walDir); err != nil {
			return p, err
		}
	}
	present := 0
	if len(stores) > 0 {
		present = int(stores[len(stores)-1]) + 1
	}
	if len(logs) > 0 {
		present = max(present, int(logs[len(logs)-1])+1)
	}
	if i := slices.IndexFunc(stores, func(s uint32) bool { return int(s) >= o.Shards }); i >= 0 {
		return p, fmt.Errorf("%w: %s holds the store of shard %d, this leader owns shards 0..%d",
			ErrForeignShard, dir, stores[i], o.Shards-1)
	}
	if i := slices.IndexFunc(logs, func(s uint32) bool { return int(s) >= o.Shards }); i >= 0 {
		return p, fmt.Errorf("%w: %s holds the WAL of shard %d, this leader owns shards 0..%d",
			ErrForeignShard, walDir, logs[i], o.Shards-1)
	}
	if p.recordShards, err = store.CheckShardCount(fs, dir, o.Shards, present); err != nil {
		return p, err
	}
	// Every log and store is read before any store is opened: opening a
	// Pebble store writes (its own recovery), and a refused leader must
	// leave the directory as it found it.
	for s := range uint32(o.Shards) {
		if p.epochs[s], err = preflightShard(fs, dir, walDir, s, layout, o, &p); err != nil {
			return p, fmt.Errorf("leader: shard %d: %w", s, err)
		}
	}
	return p, nil
}

// preflightShard checks shard s's log and store and returns its epoch.
func preflightShard(fs vfs.FS, dir, walDir string, s uint32, layout store.Layout, o *Options, p *plan) (uint64, error) {
	logged, err := wal.InspectFS(fs, walDir, s)
	if reg := (*wal.EpochRegressionError)(nil); errors.As(err, &reg) {
		return 0, fmt.Errorf("%w: the WAL at LSN %d holds a batch of epoch %d after a batch of epoch %d (%w); "+
			"a leader served below its own log's epoch, and every replica refused that batch and everything after it, so none of it "+
			"was acknowledged: run oncewal waldump --cut-epoch-regression --shard %d %s to move it to a side file, then start the leader again",
			ErrEpochRegression, reg.LSN, reg.Epoch, reg.Prev, err, s, walDir)
	}
	if err != nil {
		return 0, err
	}
	storeDir := store.ShardDir(dir, s)
	info, err := store.PeekStore(fs, storeDir)
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) {
		// Its Pebble lock: a process has the store open.
		return 0, fmt.Errorf("%w: directory %s: store %s is open in another process: %w", wal.ErrLocked, dir, storeDir, err)
	}
	if err != nil {
		return 0, err
	}
	// Invariant 9 (DESIGN): a leader opens only on a leader's store — one a
	// leader raised (the m/leader mark), one this directory's log already
	// continues (a leader directory written before the mark existed), or a
	// store with nothing in it.
	mine := info.Leader || (layout == store.LayoutLeader && logged.FirstLSN > 0) || (info.Applied == 0 && info.Epoch == 0)
	promote := !mine && o.Promote
	if !mine && !promote {
		return 0, fmt.Errorf("%w: %s is a follower's store (applied LSN %d at epoch %d, never promoted): serving it would take its "+
			"old leader's epoch without fencing it; promote it first with oncewal promote --dir %s (it checks that it is the most "+
			"advanced follower and raises the epoch), then start the leader",
			ErrNotLeaderStore, storeDir, info.Applied, info.Epoch, dir)
	}
	if logged.FirstLSN > info.Applied+1 {
		return 0, fmt.Errorf("%w: the store %s has applied LSN %d but the WAL in %s starts at LSN %d: the batches between are gone, "+
			"so the store cannot be brought up to date from the log; restore the store (from a copy, or promote an up-to-date follower)",
			wal.ErrCompacted, storeDir, info.Applied, walDir, logged.FirstLSN)
	}
	asked := o.Epoch
	if promote {
		p.promoted = true
		var err error
		if asked, err = PromotionEpoch(asked, "leader.Options.Epoch", max(info.Epoch, logged.LastEpoch), storeDir); err != nil {
			return 0, err
		}
	}
	epoch, err := LeaderEpoch(asked, info.Epoch, logged.LastEpoch, walDir)
	if err != nil {
		return 0, err
	}
	return epoch, CheckPromise(epoch, info.Promise, "store "+storeDir)
}

func (l *Leader) openShard(s uint32, epoch uint64) (*Shard, error) {
	so := l.opts.Store
	so.Shard = s
	f, err := store.Open(store.ShardDir(l.dir, s), &so)
	if err != nil {
		return nil, err
	}
	sh := &Shard{l: l, id: s, walDir: l.WALDir(), fs: l.opts.FS, store: f}
	sh.log, err = Promote(f, PromoteOptions{
		WALDir:      sh.walDir,
		Epoch:       epoch,
		Ledger:      l.opts.Ledger,
		Wall:        l.opts.Wall,
		SegmentSize: l.opts.SegmentSize,
		WALFS:       l.opts.FS,
		// Every follower stream reads recent batches from the Fanout's
		// cache instead of each re-reading the WAL (set before any append:
		// ship is assigned below, before Open returns).
		OnAppend: func(h wal.Header, raw []byte) {
			if sh.ship != nil {
				sh.ship.fan.Appended(h, raw)
			}
		},
	})
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if l.opts.Listener != nil {
		if err := l.openShipping(sh); err != nil {
			_ = sh.log.Close()
			_ = f.Close()
			return nil, err
		}
	}
	return sh, nil
}

// Router is the deployment's session → shard mapping.
func (l *Leader) Router() ShardRouter { return l.router }

// Shards is the number of shards the leader owns.
func (l *Leader) Shards() int { return len(l.shards) }

// Dir is the leader's directory.
func (l *Leader) Dir() string { return l.dir }

// WALDir is the directory holding every shard's WAL.
func (l *Leader) WALDir() string { return filepath.Join(l.dir, WALDirName) }

// Shard returns shard s (replication.ErrNoSuchShard outside 0..Shards-1).
func (l *Leader) Shard(s uint32) (*Shard, error) {
	if int(s) >= len(l.shards) {
		return nil, fmt.Errorf("%w: %d (deployment has %d)", ErrNoSuchShard, s, len(l.shards))
	}
	return l.shards[s], nil
}

// For returns the shard that owns session id.
func (l *Leader) For(id session.ID) *Shard { return l.shards[l.router.Shard(id)] }

// Append stamps events and logs them as one batch of the shard their
// sessions route to (see Shard.Append). Events without a session go with
// the first session's shard; events of sessions of different shards are
// refused with ErrCrossShard (use Split, or Shard(s).Append per shard).
// After Close it returns ErrClosed (wrapping wal.ErrClosed).
func (l *Leader) Append(events ...wal.Event) (wal.Header, error) {
	s, err := l.route(events)
	if err != nil {
		return wal.Header{}, err
	}
	return l.shards[s].Append(events...)
}

func (l *Leader) route(events []wal.Event) (uint32, error) {
	shard, found := uint32(0), false
	for i := range events {
		if events[i].Session == (session.ID{}) {
			continue
		}
		s := l.router.Shard(events[i].Session)
		if found && s != shard {
			return 0, fmt.Errorf("%w: event %d routes to shard %d, earlier events to %d", ErrCrossShard, i, s, shard)
		}
		shard, found = s, true
	}
	return shard, nil
}

// Split groups events by their session's shard, keeping their order within
// each shard: out[s] holds shard s's events. It reuses out's slices.
func (l *Leader) Split(events []wal.Event, out [][]wal.Event) [][]wal.Event {
	return l.router.Split(events, out)
}

// ID is the shard number.
func (s *Shard) ID() uint32 { return s.id }

// Append stamps events and logs them as one synced batch, applied to the
// shard's local store before it returns. Stamping is the one path every
// event takes: Time is the WAL clock; an event with a session gets the
// session's next SeqNo (continuing the store's HWM, so a restarted leader
// never reuses one) and, unless the caller set one (a client's key for a
// retry, see idempotency.ClientKey), the derived idempotency key. Events
// must come with SeqNo 0 and must not be ledger ops
// (replication.ErrBadEvent). A session the followers have forgotten
// (idle past the retention horizon on the WAL clock) or closed is refused
// (replication.ErrSessionExpired, session.ErrSessionClosed): the client
// must open a new session; nothing is logged.
func (s *Shard) Append(events ...wal.Event) (wal.Header, error) { return s.log.Append(events...) }

// Claim is the door of a request that will log in session sid: it refuses
// a session that can no longer log — idle past the retention horizon on the
// WAL clock (ErrSessionExpired) or closed (session.ErrSessionClosed), by
// the very rule Append applies — before anything is claimed, and otherwise
// claims (scope, key) in the shard's ledger (idempotency.Ledger.ClaimWith).
// Without the door such a claim is Fresh, its Commit then fails, and the
// key stays in flight until its lease ends. sid must route to this shard
// (Leader.For), else ErrCrossShard: a request's claim and its events share
// one log. A session can still expire between Claim and Commit (the
// horizon is a day; a handler is not): Commit then refuses with
// ErrSessionExpired and the caller releases the claim.
func (s *Shard) Claim(ctx context.Context, sid session.ID, scope, key string, payload []byte, o idempotency.ClaimOptions) (*idempotency.Claim, error) {
	if got := s.l.router.Shard(sid); got != s.id {
		return nil, fmt.Errorf("%w: session %s routes to shard %d, not %d: claim on Leader.For(session)", ErrCrossShard, sid, got, s.id)
	}
	if err := s.log.admit(sid); err != nil {
		if errors.Is(err, ErrSessionExpired) || errors.Is(err, session.ErrSessionClosed) {
			return nil, fmt.Errorf("%w: session %s can no longer log, so request %q was not claimed: open a new session and retry with the same request ID",
				err, sid, key)
		}
		return nil, err
	}
	return s.log.Ledger().ClaimWith(ctx, scope, key, payload, o)
}

// Commit completes claim c with outcome and logs the operation's events
// (stamped as in Append) with the ledger's complete record in one batch:
// the effect and the outcome are durable together or not at all, here and
// on every follower.
func (s *Shard) Commit(c *idempotency.Claim, outcome []byte, events ...wal.Event) (wal.Header, error) {
	return s.log.commit(c, outcome, events...)
}

// CommitResolved completes claim c with what resolve makes of the key
// space as it stands after every batch logged before this one (a
// conditional transaction, kv.Resolve), logging resolve's events with the
// complete record, whose outcome is resolve's, in one batch, as Commit
// does. It returns the batch and the outcome. resolve runs under the
// shard's stamping lock (see Resolver); appends of the shard still share
// fsyncs. If resolve fails, nothing is logged and the claim stays with
// the caller: release it, or record the refusal (Ledger().Fail).
func (s *Shard) CommitResolved(c *idempotency.Claim, resolve Resolver) (wal.Header, []byte, error) {
	return s.log.commitResolved(c, resolve)
}

// Ledger is the shard's request ledger; its decisions are logged through
// the shard's WAL.
func (s *Shard) Ledger() *idempotency.Ledger { return s.log.Ledger() }

// Epoch is the epoch stamped on the shard's batches.
func (s *Shard) Epoch() uint64 { return s.log.Epoch() }

// Now is the shard's WAL clock: the time the next event will carry.
func (s *Shard) Now() int64 { return s.log.Now() }

// NextLSN is the LSN the next appended event will get.
func (s *Shard) NextLSN() uint64 { return s.log.Writer().NextLSN() }

// Store is the shard's local store (read-only use: State, Tracker,
// Position, View).
func (s *Shard) Store() *store.Store { return s.store }

// StoreStats are the figures of the shard's local store: the receiver that
// applies the log to it (LedgerLog.ReceiverStats, not the store's own), its
// window, HWM cache, ledger table and Pebble background errors.
func (s *Shard) StoreStats() store.Stats {
	st := s.store.Stats()
	st.Receiver = s.log.ReceiverStats()
	st.AppliedWALTime = max(st.AppliedWALTime, s.log.LastEventTime())
	return st
}

// Position is the shard's local store's applied LSN and epoch.
func (s *Shard) Position() (appliedLSN, epoch uint64) { return s.log.Position() }

// hold keeps Close from closing the stores until release is called; after
// Close it returns ErrClosed. Holds do not nest: a waiting Close would
// deadlock a second one.
func (l *Leader) hold() (release func(), err error) {
	release, ok := l.life.Hold()
	if !ok {
		return nil, ErrClosed
	}
	return release, nil
}

// Close stops every Run and WaitAcked (Run returns nil, WaitAcked
// ErrClosed), waits for them and for every retention pass, slot write and
// snapshot cut in progress, then closes every shard's log and store. It is
// safe while any other method runs; afterwards they return ErrClosed (Append
// and the ledger their log's closed errors). Idempotent.
func (l *Leader) Close() error {
	l.closeOnce.Do(func() {
		l.life.Close()
		var errs []error
		for _, sh := range l.shards {
			if err := sh.log.Close(); err != nil {
				errs = append(errs, fmt.Errorf("shard %d: log: %w", sh.id, err))
			}
			if err := sh.store.Close(); err != nil {
				errs = append(errs, fmt.Errorf("shard %d: store: %w", sh.id, err))
			}
		}
		if err := l.lock.Close(); err != nil {
			errs = append(errs, err)
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

package snapshot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/oncewal/oncewal/internal/badopts"
	"github.com/oncewal/oncewal/internal/ctxtime"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/wal"
	"lukechampine.com/blake3"
)

// Describer reads the cut of the store in dir (a checkpoint or a staged
// snapshot) from its own files. Package follower provides the one for shard
// stores (store.Describe).
type Describer func(fs vfs.FS, dir string) (Cut, error)

// Source serves snapshots: a Donor in process, or a remote donor through
// package grpctransport's client.
type Source interface {
	// Begin takes a snapshot of the shard's store and returns its manifest.
	Begin(ctx context.Context, shard uint32) (Manifest, error)
	// Read reads up to len(p) bytes of file name of snapshot id at offset
	// off. It returns io.EOF (with n possibly > 0) at the end of the file,
	// and ErrUnknownSnapshot when it no longer holds the snapshot.
	Read(ctx context.Context, id, name string, off int64, p []byte) (int, error)
	// End releases the snapshot (its files and its retention pin).
	End(ctx context.Context, id string) error
}

// HeldSource is a Source that tells its fetchers apart. BeginFor is Begin
// for holder, a name the fetcher keeps across its retries and restarts:
// the source first releases every snapshot it still serves to that holder
// — one whose Begin answer was lost (the fetcher retried), or one a fetcher
// that was killed never ended — so neither pins the donor's checkpoint and
// retained log until the idle timeout. An empty holder is Begin. Fetch uses
// BeginFor when its source has it (Options.Holder).
type HeldSource interface {
	Source
	BeginFor(ctx context.Context, shard uint32, holder string) (Manifest, error)
}

// DonorOptions configures a Donor. Every zero field takes the default named
// in its comment (see EnsureDefaults); NewDonor refuses unusable ones with
// ErrBadOptions.
type DonorOptions struct {
	// FS is the store's filesystem. Default vfs.Default.
	FS vfs.FS
	// Dir holds the donor's checkpoints while they are served. It must be
	// on the store's filesystem (a checkpoint hard-links the sstables).
	// Required.
	Dir string
	// Describe reads a checkpoint's cut. Required.
	Describe Describer
	// RateLimit caps what the donor serves, bytes per second, over all its
	// snapshots: a rebuild must not starve the donor's replication of disk.
	// Default DefaultRateLimit; negative: no limit.
	RateLimit int64
	// Pin, if set, is called before the cut and must keep the log the
	// rebuilt store needs (from the store's position on) until release is
	// called: a leader pins its retention (invariant 4).
	Pin func() (release func(), err error)
	// IdleTimeout releases a snapshot nobody has read for that long (a
	// fetcher that died and never came back; one that comes back releases
	// its own at its next BeginFor). Default DefaultIdleTimeout (2 minutes).
	IdleTimeout time.Duration
	// Hold, if set, is called before each use of the store (a Begin's cut)
	// and its release after it; an error refuses the Begin (ErrClosed,
	// wrapping the error: the owner is closing the store). The owner of
	// the store holds off its close with it: a leader's Close waits for a
	// cut in progress, and a Begin after it is refused (leader.ErrClosed)
	// instead of cutting a closed store.
	Hold func() (release func(), err error)
}

// DefaultIdleTimeout is DonorOptions.IdleTimeout's default.
const DefaultIdleTimeout = 2 * time.Minute

// EnsureDefaults fills unset fields with their documented defaults.
func (o *DonorOptions) EnsureDefaults() *DonorOptions {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.RateLimit == 0 {
		o.RateLimit = DefaultRateLimit
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	return o
}

// Validate reports every unusable field in one error wrapping ErrBadOptions.
func (o *DonorOptions) Validate() error {
	var errs []error
	if o.Dir == "" {
		errs = append(errs, errors.New("Dir is empty"))
	}
	if o.Describe == nil {
		errs = append(errs, errors.New("Describe is nil"))
	}
	if o.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("IdleTimeout %v is negative", o.IdleTimeout))
	}
	return badOptions("DonorOptions", errs)
}

// badOptions wraps the problems found in one options type, if any.
func badOptions(typ string, errs []error) error { return badopts.Wrap(ErrBadOptions, typ, errs) }

// ErrBadOptions: invalid Options or DonorOptions (every problem is listed
// in the joined error).
var ErrBadOptions = errors.New("snapshot: bad options")

// Donor serves snapshots of one open Pebble store.
type Donor struct {
	db   *pebble.DB
	opts DonorOptions

	// name is this Donor's random name, in every Manifest.Serial it seals.
	name string

	mu     sync.Mutex
	closed bool // Close ran: Begin answers ErrClosed
	next   int
	snaps  map[string]*served
	pace   pacer
	stats  DonorStats
}

type served struct {
	dir      string
	m        Manifest
	holder   string
	release  func()
	lastUsed time.Time
}

// DonorStats are a Donor's figures. Every snapshot begun is served until it
// is released for one of three reasons.
type DonorStats struct {
	Serving    int    // snapshots held now (each pins a checkpoint and, for a leader, its log)
	Begun      uint64 // snapshots taken
	Ended      uint64 // released by their fetcher's End
	Superseded uint64 // released by a later BeginFor of their holder (a lost Begin answer, a restarted fetcher)
	IdledOut   uint64 // released after IdleTimeout unread
	// OldestUnread is how long the least recently read snapshot held has
	// gone unread (0 with none): what IdleTimeout bounds.
	OldestUnread time.Duration
}

// NewDonor returns a Donor of db.
func NewDonor(db *pebble.DB, opts *DonorOptions) (*Donor, error) {
	var o DonorOptions
	if opts != nil {
		o = *opts
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	// Checkpoints of an earlier process are not served any more.
	if err := o.FS.RemoveAll(o.Dir); err != nil {
		return nil, fmt.Errorf("snapshot: clearing donor directory %s: %w", o.Dir, err)
	}
	if err := wal.MkdirAllSynced(o.FS, o.Dir); err != nil {
		return nil, fmt.Errorf("snapshot: creating donor directory %s: %w", o.Dir, err)
	}
	return &Donor{db: db, opts: o, name: rand.Text(), snaps: map[string]*served{}, pace: pacer{rate: o.RateLimit}}, nil
}

// Begin implements Source: a new checkpoint of the store.
func (d *Donor) Begin(ctx context.Context, shard uint32) (Manifest, error) {
	return d.BeginFor(ctx, shard, "")
}

// BeginFor implements HeldSource: Begin, after releasing every snapshot the
// donor serves to holder (none for an empty holder).
func (d *Donor) BeginFor(ctx context.Context, shard uint32, holder string) (Manifest, error) {
	d.mu.Lock()
	d.releaseIdleLocked()
	var stale []*served
	if holder != "" {
		for id, s := range d.snaps {
			if s.holder == holder {
				delete(d.snaps, id)
				d.stats.Superseded++
				stale = append(stale, s)
			}
		}
	}
	d.next++
	serial := strconv.Itoa(d.next)
	dir := d.opts.FS.PathJoin(d.opts.Dir, "snap-"+serial)
	d.mu.Unlock()
	for _, s := range stale {
		d.drop(s)
	}

	if d.opts.Hold != nil {
		done, err := d.opts.Hold()
		if err != nil {
			return Manifest{}, fmt.Errorf("%w: %w", ErrClosed, err)
		}
		defer done()
	}
	// After the owner's Hold, so that a closed owner's refusal (which says
	// more) comes first.
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return Manifest{}, errDonorClosed
	}
	release := func() {}
	if d.opts.Pin != nil {
		r, err := d.opts.Pin()
		if err != nil {
			return Manifest{}, fmt.Errorf("snapshot: pinning the donor's log: %w", err)
		}
		release = r
	}
	m, err := Create(d.db, d.opts.FS, dir, d.opts.Describe)
	if err == nil {
		// The ID is the key of d.snaps: it must name this Begin alone.
		m.Serial = d.name + "-" + serial
		m.seal()
	}
	if err == nil && m.Cut.Shard != shard {
		err = fmt.Errorf("%w: donor holds shard %d, asked for shard %d", ErrMismatch, m.Cut.Shard, shard)
	}
	if err != nil {
		release()
		_ = d.opts.FS.RemoveAll(dir)
		return Manifest{}, err
	}
	s := &served{dir: dir, m: m, holder: holder, release: release, lastUsed: time.Now()}
	d.mu.Lock()
	closed = d.closed
	if !closed {
		d.snaps[m.ID] = s
		d.stats.Begun++
	}
	d.mu.Unlock()
	if closed { // Close ran during the cut: nobody would end this one
		_ = d.drop(s)
		return Manifest{}, errDonorClosed
	}
	return m, nil
}

// drop releases a snapshot taken out of d.snaps: its pin, then its files.
func (d *Donor) drop(s *served) error {
	s.release()
	return d.opts.FS.RemoveAll(s.dir)
}

// Read implements Source, paced to DonorOptions.RateLimit.
func (d *Donor) Read(ctx context.Context, id, name string, off int64, p []byte) (int, error) {
	d.mu.Lock()
	s := d.snaps[id]
	if s != nil {
		s.lastUsed = time.Now()
	}
	d.mu.Unlock()
	if s == nil {
		return 0, fmt.Errorf("%w: %s", ErrUnknownSnapshot, id)
	}
	known := false
	for _, f := range s.m.Files {
		known = known || f.Name == name
	}
	if !known || off < 0 {
		return 0, fmt.Errorf("%w: snapshot %s has no file %q at %d", ErrUnknownSnapshot, id, name, off)
	}
	f, err := d.opts.FS.Open(d.opts.FS.PathJoin(s.dir, name))
	if err != nil {
		return 0, fmt.Errorf("snapshot: donor: %w", err)
	}
	defer f.Close()
	n, err := f.ReadAt(p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return n, fmt.Errorf("snapshot: donor: reading %s: %w", name, err)
	}
	d.mu.Lock()
	wait := d.pace.reserve(n)
	d.mu.Unlock()
	if err := ctxtime.Sleep(ctx, wait); err != nil {
		return 0, err
	}
	return n, err
}

// End implements Source.
func (d *Donor) End(_ context.Context, id string) error {
	d.mu.Lock()
	s := d.snaps[id]
	delete(d.snaps, id)
	if s != nil {
		d.stats.Ended++
	}
	d.mu.Unlock()
	if s == nil {
		return nil
	}
	return d.drop(s)
}

// errDonorClosed answers a Begin after Close. (A Read after Close finds its
// snapshot released: ErrUnknownSnapshot, and the fetch starts over.)
var errDonorClosed = fmt.Errorf("%w: Close was called", ErrClosed)

// Close releases every snapshot; later Begins answer ErrClosed.
// Idempotent.
func (d *Donor) Close() error {
	d.mu.Lock()
	d.closed = true
	ids := make([]string, 0, len(d.snaps))
	for id := range d.snaps {
		ids = append(ids, id)
	}
	d.mu.Unlock()
	var errs []error
	for _, id := range ids {
		errs = append(errs, d.End(context.Background(), id))
	}
	return errors.Join(errs...)
}

// Serving is the number of snapshots the donor holds, after it released
// the idle ones (a fetcher that never came back, a Begin whose answer was
// lost and that no BeginFor of the same holder followed).
func (d *Donor) Serving() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.releaseIdleLocked()
	return len(d.snaps)
}

// Stats returns the donor's figures, after it released the idle snapshots.
func (d *Donor) Stats() DonorStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.releaseIdleLocked()
	st := d.stats
	st.Serving = len(d.snaps)
	for _, s := range d.snaps {
		st.OldestUnread = max(st.OldestUnread, time.Since(s.lastUsed))
	}
	return st
}

func (d *Donor) releaseIdleLocked() {
	for id, s := range d.snaps {
		if time.Since(s.lastUsed) > d.opts.IdleTimeout {
			delete(d.snaps, id)
			d.stats.IdledOut++
			_ = d.drop(s)
		}
	}
}

// Create checkpoints db into dir (which must not exist) and returns the
// sealed manifest of the checkpoint. The WAL is flushed first so the
// checkpoint holds every committed batch; a checkpoint is a cut at a batch
// boundary because every batch is one Pebble commit. A closed db gives an
// error wrapping ErrClosed and pebble.ErrClosed (Pebble panics with it).
func Create(db *pebble.DB, fs vfs.FS, dir string, describe Describer) (m Manifest, err error) {
	defer func() {
		if p := recover(); p != nil {
			pe, ok := p.(error)
			if !ok || !errors.Is(pe, pebble.ErrClosed) {
				panic(p)
			}
			m, err = Manifest{}, fmt.Errorf("%w: checkpoint into %s: %w", ErrClosed, dir, pe)
		}
	}()
	if err := db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return Manifest{}, fmt.Errorf("snapshot: checkpoint into %s: %w", dir, err)
	}
	cut, err := describe(fs, dir)
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot: describing checkpoint %s: %w", dir, err)
	}
	files, err := hashDir(fs, dir)
	if err != nil {
		return Manifest{}, err
	}
	m = Manifest{Cut: cut, Files: files}
	m.seal()
	return m, nil
}

// hashDir lists dir's files, sorted, with size and BLAKE3 sum.
func hashDir(fs vfs.FS, dir string) ([]File, error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot: listing %s: %w", dir, err)
	}
	sort.Strings(names)
	files := make([]File, 0, len(names))
	buf := make([]byte, 64<<10)
	for _, name := range names {
		path := fs.PathJoin(dir, name)
		st, err := fs.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		if st.IsDir() || !validName(name) {
			return nil, fmt.Errorf("snapshot: checkpoint %s holds an unexpected entry %q", dir, name)
		}
		f, err := fs.Open(path)
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		h := blake3.New(32, nil)
		n, err := io.CopyBuffer(h, f, buf)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("snapshot: hashing %s: %w", path, err)
		}
		files = append(files, File{Name: name, Size: n, Sum: hex.EncodeToString(h.Sum(nil))})
	}
	return files, nil
}

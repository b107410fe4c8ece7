package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/wal"
)

// ErrUnavailable: the store cannot be opened now — Pebble's recovery
// failed in the background (disk full, I/O errors); the error wraps Pebble's.
// Pebble keeps retrying slowly; an Open of the same directory later takes the
// store over if a retry succeeded (see the package documentation).
var ErrUnavailable = errors.New("store: store cannot be opened now")

// ErrCorrupt: a file of the store fails Pebble's checksums (one bad
// byte in an sstable, a damaged MANIFEST): Pebble's corruption error
// (pebble.IsCorruptionError) at the store boundary. It is in the corruption
// class (errors.Is(err, corruption.Err)). Retrying will not help; the
// store must be rebuilt from the leader (a follower with Rebuild auto does
// it by itself) or restored from a copy. Nothing is changed on disk.
var ErrCorrupt = corruption.Mark(errors.New("store: store is damaged"))

// CorruptError returns err typed ErrCorrupt, naming dir and the
// remedy, when it reports Pebble corruption; any other err (nil included)
// comes back as it is. Every entry point that opens or reads a store (Open,
// Describe, a node's shard, oncewal inspect and promote) passes its errors
// through it.
func CorruptError(dir string, err error) error {
	if err == nil || errors.Is(err, ErrCorrupt) || !pebble.IsCorruptionError(err) {
		return err
	}
	return &corruptStoreError{dir: dir, err: err}
}

type corruptStoreError struct {
	dir string
	err error
}

func (e *corruptStoreError) Error() string {
	// Pebble joins its corruption details to the error on a line of their
	// own ("<corruption detail carrier>"); keep the message on one line.
	var parts []string
	for _, line := range strings.Split(e.err.Error(), "\n") {
		if line = strings.TrimSpace(line); line != "" && line != "<corruption detail carrier>" {
			parts = append(parts, line)
		}
	}
	cause := strings.Join(parts, "; ")
	if !strings.Contains(cause, e.dir) {
		cause = e.dir + ": " + cause
	}
	return fmt.Sprintf("%v: %s; its data cannot be trusted: stop the process using it and move %s aside, "+
		"then a follower rebuilds it from the leader's snapshot (oncewal follower --rebuild=auto, the default); "+
		"a leader's store is replaced by promoting a follower (oncewal promote), or restore it from a copy",
		ErrCorrupt, cause, e.dir)
}

func (e *corruptStoreError) Unwrap() []error { return []error{ErrCorrupt, e.err} }

// Background error backoff: the first wait and the cap; how long a
// store's background errors are logged only once; the background errors
// in a row an Open waits through before it gives up (about 0.3s of retries
// from the first backoff, at most ~5s at the cap).
const (
	bgBackoffFirst = 10 * time.Millisecond
	bgBackoffMax   = time.Second
	bgLogEvery     = 30 * time.Second
	openGiveUp     = 5
)

// storeEvents is a store's Pebble EventListener state: background errors
// counted, logged sparingly and slowed down.
type storeEvents struct {
	log     *slog.Logger
	count   atomic.Uint64
	opening atomic.Bool
	stalled atomic.Bool   // Pebble holds writes back (WriteStallBegin..End)
	dead    chan struct{} // closed when Pebble declared the open fatal (storeLogger)
	die     sync.Once

	mu           sync.Mutex
	failed       chan struct{} // closed, and replaced, at every background error
	last         error
	lastLog      time.Time
	lastStallLog time.Time
	suppressed   uint64
	backoff      time.Duration
}

func newStoreEvents(log *slog.Logger) *storeEvents {
	e := &storeEvents{log: log, dead: make(chan struct{}), failed: make(chan struct{}), backoff: bgBackoffFirst}
	e.opening.Store(true)
	return e
}

func (e *storeEvents) listener() pebble.EventListener {
	return pebble.EventListener{
		BackgroundError: e.backgroundError,
		FlushEnd: func(info pebble.FlushInfo) {
			if info.Err == nil {
				e.succeeded()
			}
		},
		CompactionEnd: func(info pebble.CompactionInfo) {
			if info.Err == nil {
				e.succeeded()
			}
		},
		WriteStallBegin: e.writeStallBegin,
		WriteStallEnd:   func() { e.stalled.Store(false) },
	}
}

// failing reports whether a background error came after the last flush or
// compaction that succeeded.
func (e *storeEvents) failing() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.backoff > bgBackoffFirst
}

// writeStallBegin: Pebble holds writes back until flushes or compactions
// catch up. Logged only when background work is failing, at most once per
// bgLogEvery: then the stall lasts until the disk recovers.
func (e *storeEvents) writeStallBegin(info pebble.WriteStallBeginInfo) {
	e.stalled.Store(true)
	failing := e.failing()
	e.mu.Lock()
	now := time.Now()
	logNow := failing && now.Sub(e.lastStallLog) >= bgLogEvery
	if logNow {
		e.lastStallLog = now
	}
	last := e.last
	e.mu.Unlock()
	if logNow {
		e.log.Error("oncewal store: store writes stalled while Pebble's background work fails (disk full?)", "component", "pebble",
			"reason", info.Reason, "err", last)
	}
}

func (e *storeEvents) succeeded() {
	e.mu.Lock()
	e.backoff = bgBackoffFirst
	e.mu.Unlock()
}

// backgroundError runs on Pebble's flush or compaction goroutine (with the
// DB mutex held); Pebble retries the work as soon as it returns, so the
// sleep here is what keeps a failing disk from being retried in a hot loop.
func (e *storeEvents) backgroundError(err error) {
	n := e.count.Add(1)
	now := time.Now()
	e.mu.Lock()
	e.last = err
	wait := e.backoff
	e.backoff = min(2*e.backoff, bgBackoffMax)
	logNow := n == 1 || now.Sub(e.lastLog) >= bgLogEvery
	suppressed := e.suppressed
	if logNow {
		e.lastLog, e.suppressed = now, 0
	} else {
		e.suppressed++
	}
	e.mu.Unlock()
	if logNow {
		e.log.Error("oncewal store: store background error; Pebble retries it", "component", "pebble",
			"err", err.Error(), "errors", n, "not_logged", suppressed, "retry_in", wait)
	}
	// Wake the Opens waiting for this open (logged first: they may report
	// it at once).
	e.mu.Lock()
	close(e.failed)
	e.failed = make(chan struct{})
	e.mu.Unlock()
	time.Sleep(wait)
}

// storeLogger is the Pebble logger of a store the follower opens:
// replication.FatalLogger, except while pebble.Open runs. Pebble declares
// some failures fatal (a MANIFEST write that fails during the flush of the
// replayed WAL, on a full disk) and expects Fatalf not to return; the
// FatalLogger's panic would then crash the process from Pebble's flush
// goroutine. During the open, Fatalf instead records the failure — Open
// returns ErrUnavailable wrapping replication.ErrFailed — and ends
// the goroutine (runtime.Goexit): the half-opened store is abandoned, never
// used, and its lock stays held until the process exits.
type storeLogger struct {
	FatalLogger
	ev *storeEvents
}

func (l storeLogger) Fatalf(format string, args ...any) {
	if !l.ev.opening.Load() {
		l.FatalLogger.Fatalf(format, args...)
		return
	}
	msg := fmt.Sprintf(format, args...)
	l.Errorf("%s", msg)
	l.ev.count.Add(1)
	l.ev.mu.Lock()
	l.ev.last = fmt.Errorf("%w: %w", ErrFailed, &FatalError{Msg: msg})
	for _, a := range args {
		if cause, ok := a.(error); ok { // keep errors.Is(err, syscall.ENOSPC) working
			l.ev.last = fmt.Errorf("%w: %s: %w", ErrFailed, strings.TrimSuffix(msg, ": "+cause.Error()), cause)
			break
		}
	}
	l.ev.mu.Unlock()
	l.ev.die.Do(func() { close(l.ev.dead) })
	runtime.Goexit()
}

// nextFailure is closed at the next background error.
func (e *storeEvents) nextFailure() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failed
}

// waitOut waits until done is closed (true), or until openGiveUp
// background errors have come while it waited, or dead or cancel is closed
// (false; a nil channel never is): how Open and Close wait for a Pebble call
// that a failing flush can hold back for ever. A failed flush can succeed
// when Pebble retries it (the failed attempt's partial file is deleted,
// freeing its space), so one failure is not enough to give up.
func (e *storeEvents) waitOut(done, dead, cancel <-chan struct{}) bool {
	for failures := 0; ; {
		select {
		case <-done:
			return true
		case <-e.nextFailure():
			if failures++; failures >= openGiveUp {
				return false
			}
		case <-dead:
			return false
		case <-cancel:
			return false
		}
	}
}

// lastErr is the latest background error.
func (e *storeEvents) lastErr() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last
}

// blockCacheSize is the block cache a store keeps beside its memtables
// (Pebble's default cache size).
const blockCacheSize = 8 << 20

// pebbleOptions are the Pebble options of a store opened with o; ev, if not
// nil, receives its events.
func pebbleOptions(o *Options, ev *storeEvents) *pebble.Options {
	po := &pebble.Options{
		FS:                 o.FS,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             FatalLogger{Logger: o.Logger},
	}
	if ev != nil {
		po.Logger = storeLogger{FatalLogger: FatalLogger{Logger: o.Logger}, ev: ev}
	}
	// HWM reads on a cache miss are point lookups of keys that often do not
	// exist (a new session); bloom filters keep them from visiting every
	// table. Later levels inherit the policy.
	po.Levels[0].FilterPolicy = bloom.FilterPolicy(10)
	po.MemTableSize = uint64(o.MemTableSize)
	if o.PebbleOptions != nil {
		o.PebbleOptions(po)
	}
	if po.Cache == nil && po.CacheSize == 0 {
		// Pebble charges its memtables to the block cache (each new memtable
		// reserves its size there), so its default 8 MiB cache beside two
		// memtables of MemTableSize would hold no blocks at all: HWM misses,
		// the Applier's and the ledger's reads would all go to the files.
		po.CacheSize = blockCacheSize + 2*int64(po.MemTableSize)
	}
	if ev != nil {
		l := ev.listener()
		if po.EventListener != nil {
			l = pebble.TeeEventListener(l, *po.EventListener)
		}
		po.EventListener = &l
	}
	NonFatalCorruption(po, o.Logger)
	return po
}

// openKey names a pebble.Open in flight: the same directory on the same FS.
type openKey struct {
	fs  vfs.FS
	dir string
}

// pendingOpen is one pebble.Open running on its own goroutine.
type pendingOpen struct {
	done chan struct{} // closed when pebble.Open returned
	gone chan struct{} // closed when an orphan's store is closed and the entry removed
	db   *pebble.DB
	err  error
	ev   *storeEvents
	// Guarded by opens.mu.
	waiters int  // Opens waiting for it
	taken   bool // db went to a caller, or is being closed (orphan)
}

var opens = struct {
	mu sync.Mutex
	m  map[openKey]*pendingOpen
}{m: make(map[openKey]*pendingOpen)}

// pendingOpenOf reports whether an open of dir on fs given up earlier is
// still running.
func pendingOpenOf(fs vfs.FS, dir string) bool {
	if !reflect.TypeOf(fs).Comparable() {
		return false
	}
	opens.mu.Lock()
	defer opens.mu.Unlock()
	return opens.m[openKey{fs: fs, dir: filepath.Clean(dir)}] != nil
}

// openPebble opens dir with po on its own goroutine (see the package documentation)
// and waits until it returns, fails in the background, or ctx ends. An open
// of the same directory given up earlier is joined instead of started again:
// the caller gets its store if it completes, or its error after its next
// failed retry. It returns the store's events (those of the open it joined).
func openPebble(ctx context.Context, dir string, po *pebble.Options, ev *storeEvents) (*pebble.DB, *storeEvents, error) {
	key, keyed := openKey{fs: po.FS, dir: filepath.Clean(dir)}, reflect.TypeOf(po.FS).Comparable()
	var p *pendingOpen
	for p == nil {
		opens.mu.Lock()
		p = opens.m[key]
		switch {
		case !keyed || p == nil:
			p = &pendingOpen{done: make(chan struct{}), gone: make(chan struct{}), ev: ev}
			if keyed {
				opens.m[key] = p
			}
			go p.run(dir, po, key, keyed)
		case p.taken:
			// An orphan closing its store: wait until the lock is free.
			gone := p.gone
			p = nil
			opens.mu.Unlock()
			select {
			case <-gone:
			case <-ctx.Done():
				return nil, nil, fmt.Errorf("store: opening store %s: %w", dir, ctx.Err())
			}
			continue
		default:
			p.ev.log.Info("oncewal store: joining an earlier open of the store, still retrying in the background", "dir", dir)
		}
		p.waiters++
		opens.mu.Unlock()
	}

	// Whatever ended the wait, the open may have completed meanwhile: that
	// is read under opens.mu below.
	p.ev.waitOut(p.done, p.ev.dead, ctx.Done())
	opens.mu.Lock()
	p.waiters--
	select {
	case <-p.done:
		if p.taken {
			opens.mu.Unlock()
			return nil, nil, fmt.Errorf("store: opening store %s: already open in this process", dir)
		}
		p.taken = true
		if keyed && opens.m[key] == p {
			delete(opens.m, key)
		}
		opens.mu.Unlock()
		if p.err != nil {
			return nil, nil, fmt.Errorf("store: opening store %s: %w", dir, p.err)
		}
		return p.db, p.ev, nil
	default:
	}
	opens.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("store: opening store %s: %w", dir, err)
	}
	how := "it retries slowly, and an Open of this directory takes the store over once a retry succeeds"
	select {
	case <-p.ev.dead:
		how = "Pebble declared it fatal: the store can be opened again only by a new process"
	default:
	}
	return nil, nil, fmt.Errorf("%w: %s: Pebble's recovery failed in the background (%d errors so far; %s): %w",
		ErrUnavailable, dir, p.ev.count.Load(), how, p.ev.lastErr())
}

func (p *pendingOpen) run(dir string, po *pebble.Options, key openKey, keyed bool) {
	db, err := func() (db *pebble.DB, err error) {
		defer func() {
			if r := recover(); r != nil {
				fe, ok := r.(*FatalError)
				if !ok {
					panic(r)
				}
				db, err = nil, fmt.Errorf("%w: %w", ErrFailed, fe)
			}
		}()
		return pebble.Open(dir, po)
	}()
	p.ev.opening.Store(false)
	opens.mu.Lock()
	p.db, p.err = db, err
	close(p.done)
	orphan := p.waiters == 0
	if orphan {
		p.taken = true
	}
	opens.mu.Unlock()
	if !orphan {
		return
	}
	// Given up by every caller: close the store again, then free the
	// entry, so that the next Open finds the lock free.
	if db != nil {
		_ = guard(db.Close)
		p.ev.log.Info("oncewal store: an open given up earlier completed; the store was closed again", "dir", dir)
	}
	opens.mu.Lock()
	if keyed && opens.m[key] == p {
		delete(opens.m, key)
	}
	opens.mu.Unlock()
	close(p.gone)
}

// peekIdentity reads the identity of the existing store in dir without
// changing a byte of it: Pebble opens it read-only on a filesystem that
// refuses every write. A Pebble store that records no identity is accepted
// (recorded false) if it is an oncewal store (m/format) or holds nothing
// outside oncewal's key spaces; any other Pebble store is ErrNotStore.
func peekIdentity(fs vfs.FS, dir string) (id Identity, recorded bool, err error) {
	db, err := openPeek(fs, dir)
	if err != nil {
		return Identity{}, false, fmt.Errorf("store: reading the identity of store %s: %w", dir, err)
	}
	defer func() { _ = guard(db.Close) }()
	if id, recorded, err = ReadIdentity(db); err != nil || recorded {
		return id, recorded, err
	}
	if _, _, ok, err := ReadMeta(db); err != nil || ok {
		return Identity{}, false, err
	}
	it, err := db.NewIter(nil)
	if err != nil {
		return Identity{}, false, err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		if !keyspace.IsOncewal(it.Key()) {
			return Identity{}, false, fmt.Errorf("%w: %s is a Pebble store with key %q, outside oncewal's key spaces", ErrNotStore, dir, it.Key())
		}
	}
	return Identity{}, false, it.Error()
}

// openPeek opens the existing store in dir read-only on a filesystem that
// refuses every write (peekFS); Pebble's fatal errors come back as errors.
func openPeek(fs vfs.FS, dir string) (*pebble.DB, error) {
	po := &pebble.Options{
		FS:                 peekFS{fs},
		ReadOnly:           true,
		ErrorIfNotExists:   true,
		FormatMajorVersion: pebble.FormatNewest, // never ratcheted in ReadOnly mode
		Logger:             FatalLogger{},
	}
	NonFatalCorruption(po, nil)
	db, err := func() (db *pebble.DB, err error) {
		defer func() {
			if r := recover(); r != nil {
				fe, ok := r.(*FatalError)
				if !ok {
					panic(r)
				}
				err = fe
			}
		}()
		return pebble.Open(dir, po)
	}()
	switch {
	case errors.Is(err, pebble.ErrDBDoesNotExist):
		// DirLayout saw data files (a WAL, a table) beside no manifest
		// marker: not a creation a crash cut short, but a store that lost
		// the file saying what it holds.
		err = &corruptStoreError{dir: dir, err: fmt.Errorf("it holds Pebble data files but no manifest marker: %w", err)}
	case errors.Is(err, os.ErrNotExist):
		// A file its manifest marker or manifest names is gone.
		err = &corruptStoreError{dir: dir, err: err}
	}
	return db, err
}

// peekFS is the filesystem peekIdentity gives Pebble: every call that would
// change a file fails, and the store's LOCK is taken only if it exists (a
// copied store may lack it; creating it would be a change). Taking it
// through the wrapped FS's Lock keeps a follower running in another process
// out of the check; on the OS filesystem that Lock truncates the (empty)
// LOCK file, so its mtime moves — the one trace a refused open leaves.
type peekFS struct{ vfs.FS }

var errPeekWrite = errors.New("store: read-only identity check")

func peekRefuse(op, name string) error { return fmt.Errorf("%s %s: %w", op, name, errPeekWrite) }

func (peekFS) Create(name string, _ vfs.DiskWriteCategory) (vfs.File, error) {
	return nil, peekRefuse("create", name)
}
func (peekFS) Link(oldname, _ string) error { return peekRefuse("link", oldname) }
func (peekFS) OpenReadWrite(name string, _ vfs.DiskWriteCategory, _ ...vfs.OpenOption) (vfs.File, error) {
	return nil, peekRefuse("open for writing", name)
}
func (peekFS) Remove(name string) error                 { return peekRefuse("remove", name) }
func (peekFS) RemoveAll(name string) error              { return peekRefuse("remove", name) }
func (peekFS) Rename(oldname, _ string) error           { return peekRefuse("rename", oldname) }
func (peekFS) MkdirAll(dir string, _ os.FileMode) error { return peekRefuse("mkdir", dir) }
func (peekFS) ReuseForWrite(oldname, _ string, _ vfs.DiskWriteCategory) (vfs.File, error) {
	return nil, peekRefuse("reuse", oldname)
}

func (fs peekFS) Lock(name string) (io.Closer, error) {
	if _, err := fs.FS.Stat(name); errors.Is(err, os.ErrNotExist) {
		return nopCloser{}, nil
	}
	c, err := fs.FS.Lock(name)
	return c, LockError(name, err)
}

// ErrLocked: another process (or another open in this process) holds
// the store's Pebble LOCK file: a follower or leader is running on it. Stop
// that process first, or read a copy of the directory. Nothing is changed.
// (wal.ErrLocked is the same refusal for a WAL directory.)
var ErrLocked = errors.New("store: store locked by another process")

// LockError returns the error of taking the Pebble lock file name typed
// ErrLocked, naming the file and the remedy, when the lock is held
// elsewhere (fcntl's EAGAIN or EACCES; Pebble's "lock held by current
// process"); any other err comes back as it is (nil included).
func LockError(name string, err error) error {
	var pe *os.PathError
	held := errors.Is(err, syscall.EAGAIN) || (errors.Is(err, syscall.EACCES) && !errors.As(err, &pe)) ||
		(err != nil && strings.Contains(err.Error(), "lock held by current process"))
	if !held {
		return err
	}
	return fmt.Errorf("%w: %s is held (%w): stop the follower or leader running on %s first, or use a copy of the directory",
		ErrLocked, name, err, filepath.Dir(name))
}

func (fs peekFS) Unwrap() vfs.FS { return fs.FS }

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// clearInterruptedCreation removes what a Pebble creation a crash cut
// short left in dir (DirLayout's LayoutEmpty with Pebble files: nothing
// was ever stored). Pebble retries a creation that left no manifest marker
// by itself, but not one whose marker survived the crash without the
// MANIFEST it names. The files go under the store's Pebble lock, so a
// creation running in another process right now is left alone (ErrLocked).
func clearInterruptedCreation(fs vfs.FS, dir string, log *slog.Logger) error {
	names, err := fs.List(dir)
	if err != nil || !slices.ContainsFunc(names, func(n string) bool { return n != "LOCK" }) {
		return nil // absent, empty, or a lone LOCK
	}
	lockName := fs.PathJoin(dir, "LOCK")
	lock, err := fs.Lock(lockName)
	if err != nil {
		return LockError(lockName, err)
	}
	defer func() { _ = lock.Close() }()
	// Read again under the lock: a creation may have finished meanwhile.
	if layout, _, err := DirLayout(fs, dir); err != nil || layout != LayoutEmpty {
		return err
	}
	if names, err = fs.List(dir); err != nil {
		return err
	}
	var removed []string
	for _, name := range names {
		if name == "LOCK" {
			continue
		}
		if err := fs.RemoveAll(fs.PathJoin(dir, name)); err != nil {
			return err
		}
		removed = append(removed, name)
	}
	if err := wal.SyncDir(fs, dir); err != nil {
		return err
	}
	log.Warn("oncewal store: removed what a store creation cut short by a crash left; the store is created again", "dir", dir, "files", removed)
	return nil
}

// removeNewStore undoes what a failed open of a new store left in dir: the
// directory itself if it did not exist before, else every entry (the
// directory was empty, or held a lone Pebble LOCK).
func removeNewStore(fs vfs.FS, dir string, existed bool) {
	if !existed {
		_ = fs.RemoveAll(dir)
		return
	}
	names, err := fs.List(dir)
	if err != nil {
		return
	}
	for _, name := range names {
		_ = fs.RemoveAll(fs.PathJoin(dir, name))
	}
}

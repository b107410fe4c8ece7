package wal

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// SyncPolicy says when the Writer makes appended batches durable.
type SyncPolicy uint8

const (
	// SyncEveryBatch syncs each batch before Append returns (the default):
	// an acknowledged batch survives a crash. Concurrent Appends share
	// syncs (group commit, see SyncTo).
	SyncEveryBatch SyncPolicy = iota
	// SyncManual syncs only on Sync, Close and segment rolls; the caller
	// trades durability of recent batches for throughput.
	SyncManual
)

// DefaultSegmentSize is the default WriterOptions.SegmentSize.
const DefaultSegmentSize = 64 << 20

// DefaultZeroAhead is the default WriterOptions.ZeroAhead.
const DefaultZeroAhead = 1 << 20

// WriterOptions configures a Writer.
type WriterOptions struct {
	// Shard is the shard whose log this is; it is written into every batch
	// header and segment name. Default 0.
	Shard uint32
	// SegmentSize is the size past which the Writer rolls to a new segment.
	// A batch never spans segments, so a segment exceeds SegmentSize only
	// when it holds a single batch larger than it. Default 64 MiB.
	SegmentSize int64
	// Sync is the sync policy. Default SyncEveryBatch.
	Sync SyncPolicy
	// FirstLSN is the LSN of the first event of a log that has no segments
	// yet. A follower promoted to leader continues its applied position: its
	// new log starts at applied LSN + 1. Ignored when segments exist.
	// Default 1.
	FirstLSN uint64
	// ZeroAhead is how far ahead of its appends the Writer fills the
	// active segment with zeros, so that an append overwrites bytes the
	// file already has: its fdatasync then writes data pages only, with no
	// file size or block allocation to commit (about half the CPU and wall
	// time of a sync on ext4: BenchmarkSyncData in package bench). The
	// zeros are written in one go when an append would pass the filled
	// part, up to ZeroAhead bytes past it and never past SegmentSize (a
	// batch larger than that gets exactly its size), and made durable by
	// the next sync; a rolled segment keeps its unused zeros. Recovery
	// tells zeros written ahead from a torn tail (package doc). Default
	// DefaultZeroAhead (1 MiB); negative: none, the file grows with each
	// append.
	ZeroAhead int64
	// FS is the filesystem every file operation goes through (tests inject
	// crashes and I/O errors with vfs.NewCrashableMem and vfs/errorfs).
	// Default vfs.Default.
	FS vfs.FS
}

// EnsureDefaults fills zero fields with their defaults and returns o.
func (o *WriterOptions) EnsureDefaults() *WriterOptions {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.SegmentSize == 0 {
		o.SegmentSize = DefaultSegmentSize
	}
	if o.FirstLSN == 0 {
		o.FirstLSN = 1
	}
	if o.ZeroAhead == 0 {
		o.ZeroAhead = DefaultZeroAhead
	}
	return o
}

// Validate reports every invalid field in one error wrapping ErrBadOptions.
func (o *WriterOptions) Validate() error {
	var errs []error
	if o.SegmentSize < 0 {
		errs = append(errs, fmt.Errorf("SegmentSize %d is negative", o.SegmentSize))
	}
	if o.Sync != SyncEveryBatch && o.Sync != SyncManual {
		errs = append(errs, fmt.Errorf("Sync %d is not a SyncPolicy", o.Sync))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadOptions, errors.Join(errs...))
}

// Writer appends batches to the log of one shard in a directory. It is safe
// for concurrent use; writes are serialized, syncs shared (SyncTo). After an
// I/O error the Writer
// is failed: every later call returns that error, which wraps
// ErrWriterFailed and the cause (a failed write or fsync leaves the file in
// an unknown state; reopening recovers it).
type Writer struct {
	mu     sync.Mutex
	synced *sync.Cond // on mu: a sync ended (see SyncTo)
	dir    string
	opts   WriterOptions
	fs     vfs.FS
	f      vfs.File       // active (last) segment
	seg    segment        // the active segment
	size   int64          // bytes in the active segment; next batch goes here
	filled int64          // the active segment's file size: zeros from size on
	old    []sizedSegment // retained segments before the active one, oldest first
	buf    []byte
	err    error // sticky
	closed bool
	lock   *dirLock

	// Group commit (SyncTo): one fdatasync at a time, outside mu, covering
	// every batch written before it started; the active segment is not
	// rolled or closed under it.
	syncing    bool
	syncedSize int64 // bytes of the active segment known synced

	batches  atomic.Uint64 // batches written since open
	syncs    atomic.Uint64 // fdatasyncs of the active segment since open
	epoch    uint64        // epoch of the last batch in the log (under mu; 0: none)
	next     atomic.Uint64 // LSN of the next appended event
	durable  atomic.Uint64 // highest LSN known synced
	first    atomic.Uint64 // first retained LSN
	retained atomic.Int64  // bytes in all retained segments
}

// sizedSegment is a finished segment and its size.
type sizedSegment struct {
	segment
	size int64
}

// OpenWriter opens (creating if needed) the log of opts.Shard in dir and
// recovers it: it verifies the segments as described in the package doc,
// truncates a torn tail of the last segment, and positions after the last
// valid batch. A log with no segments starts at opts.FirstLSN (default 1).
//
// The Writer holds the shard's lock file in dir (LockName) until Close; a
// second OpenWriter of the same shard and directory, in this process or
// another, fails at once with ErrLocked.
//
// A path that is not a WAL directory (ErrNotWAL), a malformed segment name,
// and corruption that is not a torn tail fail with a typed error and change
// nothing on disk: the log is validated before the lock file is created.
func OpenWriter(dir string, opts *WriterOptions) (*Writer, error) {
	w := &Writer{dir: dir}
	w.synced = sync.NewCond(&w.mu)
	if opts != nil {
		w.opts = *opts
	}
	if err := w.opts.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	w.fs = w.opts.FS
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

// open validates, locks and recovers the log (see OpenWriter); on failure
// it holds nothing.
func (w *Writer) open() (err error) {
	dir := w.dir
	if err := checkDir(w.fs, dir); errors.Is(err, os.ErrNotExist) {
		if err := MkdirAllSynced(w.fs, dir); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	// Where a lock file exists, taking the lock changes nothing on disk:
	// lock first, so that a held lock is ErrLocked at once, then validate.
	// Where none exists yet, validate before creating it, so that a refused
	// directory is left as it was; then scan again under the lock only if
	// the log may have changed in between.
	var scratch []byte
	var scan logScan
	_, err = w.fs.Stat(w.fs.PathJoin(dir, LockName(w.opts.Shard)))
	validated := errors.Is(err, os.ErrNotExist)
	if validated {
		if scan, err = scanLog(w.fs, dir, w.opts.Shard, &scratch); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if w.lock, err = lockShard(w.fs, dir, w.opts.Shard); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if w.f != nil {
				_ = w.f.Close()
			}
			_ = w.lock.release()
		}
	}()
	fresh := false
	if validated {
		if fresh, err = scan.current(w.fs, dir, w.opts.Shard); err != nil {
			return err
		}
	}
	if !fresh {
		if scan, err = scanLog(w.fs, dir, w.opts.Shard, &scratch); err != nil {
			return err
		}
	}
	if err := removeTemps(w.fs, dir, w.opts.Shard); err != nil {
		return err
	}
	return w.recover(scan, scratch)
}

// Check validates the log of shard in dir as OpenWriter does, read-only and
// without taking the lock: it returns the error OpenWriter would (ErrCorrupt,
// ErrNotWAL, ErrShardMismatch, …) for a log it would refuse, and nil for a
// log it would open, a torn tail included (OpenWriter cuts it). A caller that
// opens other state beside the log (a leader's stores) checks first, so that
// a refused log leaves everything untouched.
func Check(dir string, shard uint32) error { return CheckFS(vfs.Default, dir, shard) }

// CheckFS is Check on fs.
func CheckFS(fs vfs.FS, dir string, shard uint32) error {
	var scratch []byte
	_, err := scanLog(fs, dir, shard, &scratch)
	return err
}

// logScan is the result of validating a shard's log read-only.
type logScan struct {
	segs     []sizedSegment // size: end of the last valid batch
	lastSize int64          // file size of the last segment when scanned
	next     uint64         // LSN after the last valid batch
	torn     bool           // the last segment has a torn tail after segs[last].size
	zeros    bool           // the last segment has zeros written ahead after segs[last].size
	epoch    uint64         // epoch of the last valid batch (0: no batch)
}

// scanLog validates the log of shard in dir without changing anything: the
// directory listing, the headers of every segment, the bodies of the last,
// and the classification of what follows its last valid batch.
func scanLog(fs vfs.FS, dir string, shard uint32, scratch *[]byte) (logScan, error) {
	segs, err := listSegments(fs, dir, shard)
	if err != nil || len(segs) == 0 {
		return logScan{}, err
	}
	var scan logScan
	next := segs[0].first
	for i, seg := range segs {
		if seg.first != next {
			return logScan{}, fmt.Errorf("wal: segment %s: %w: starts at LSN %d, previous segment ends before LSN %d",
				seg.name, ErrCorrupt, seg.first, next)
		}
		last := i == len(segs)-1
		f, err := fs.Open(fs.PathJoin(dir, seg.name))
		if err != nil {
			return logScan{}, err
		}
		res, err := scanSegment(f, seg, shard, last, scan.epoch, scratch)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return logScan{}, err
		}
		scan.segs = append(scan.segs, sizedSegment{seg, res.end})
		scan.lastSize, scan.next, scan.torn, scan.zeros, scan.epoch = res.size, res.next, res.torn, res.zeros, res.epoch
		next = res.next
	}
	return scan, nil
}

// current reports whether the log still is as scanned. A Writer only
// appends to the last segment, creates segments after it, deletes old ones
// and cuts torn tails, so the same segment names and the same last-segment
// size mean the same valid log — unless there was a torn tail, whose bytes
// another Writer may have replaced with a batch of the same length, or
// zeros written ahead, which it may have written over without changing the
// size: then the header after the scanned data must still be zeros.
func (s *logScan) current(fs vfs.FS, dir string, shard uint32) (bool, error) {
	segs, err := listSegments(fs, dir, shard)
	if err != nil {
		return false, err
	}
	if s.torn || len(segs) != len(s.segs) {
		return false, nil
	}
	for i := range segs {
		if segs[i] != s.segs[i].segment {
			return false, nil
		}
	}
	if len(segs) == 0 {
		return true, nil
	}
	path := fs.PathJoin(dir, segs[len(segs)-1].name)
	st, err := fs.Stat(path)
	if err != nil || st.Size() != s.lastSize {
		return false, err
	}
	if !s.zeros {
		return true, nil
	}
	f, err := fs.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	end := s.segs[len(s.segs)-1].size
	return allZero(f, end, min(end+HeaderSize, s.lastSize))
}

// recover opens the scanned log for appending, under the lock: it cuts a
// torn tail, syncs the last segment and positions the Writer after the last
// valid batch; an empty log gets its first segment.
func (w *Writer) recover(scan logScan, scratch []byte) error {
	if len(scan.segs) == 0 {
		if err := w.createSegment(w.opts.FirstLSN); err != nil {
			return err
		}
		w.next.Store(w.opts.FirstLSN)
		w.durable.Store(w.opts.FirstLSN - 1)
		w.noteRetention()
		return nil
	}
	last := scan.segs[len(scan.segs)-1]
	if scan.torn {
		// Only a never-acknowledged append is cut: see the torn-tail rule.
		if err := cutTail(w.fs, w.dir, last, scratch); err != nil {
			return err
		}
	}
	f, err := w.fs.OpenReadWrite(w.fs.PathJoin(w.dir, last.name), vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	// What a crashed process wrote may sit only in the page cache; sync so
	// that DurableLSN below is true.
	if err := f.SyncData(); err != nil {
		_ = f.Close()
		return err
	}
	w.f, w.seg, w.size, w.syncedSize = f, last.segment, last.size, last.size
	w.filled = last.size
	if scan.zeros {
		w.filled = scan.lastSize
	}
	w.old = scan.segs[:len(scan.segs)-1]
	w.epoch = scan.epoch
	w.next.Store(scan.next)
	w.durable.Store(scan.next - 1)
	w.noteRetention()
	return nil
}

// noteRetention publishes FirstLSN and RetainedBytes after the set of
// segments changed.
func (w *Writer) noteRetention() {
	first, bytes := w.seg.first, w.size
	if len(w.old) > 0 {
		first = w.old[0].first
	}
	for _, s := range w.old {
		bytes += s.size
	}
	w.first.Store(first)
	w.retained.Store(bytes)
}

// createSegment creates and switches to a new empty segment starting at first.
func (w *Writer) createSegment(first uint64) error {
	name := SegmentName(w.opts.Shard, first)
	f, err := w.fs.Create(w.fs.PathJoin(w.dir, name), vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if err := syncDir(w.fs, w.dir); err != nil {
		_ = f.Close()
		return err
	}
	w.f, w.seg, w.size, w.syncedSize, w.filled = f, segment{name: name, first: first}, 0, 0, 0
	return nil
}

// zeroPage is what fillAhead writes, in as many pieces as it needs.
var zeroPage [64 << 10]byte

// fillAhead makes the active segment at least w.size+n bytes long, writing
// zeros up to ZeroAhead bytes past that (never past SegmentSize), so that
// the next appends overwrite bytes the file already has (see
// WriterOptions.ZeroAhead). The zeros become durable with the next sync:
// until then a crash leaves them, or a shorter file, and either reads as
// the end of the log.
func (w *Writer) fillAhead(n int64) error {
	need := w.size + n
	if w.opts.ZeroAhead <= 0 || need <= w.filled {
		return nil
	}
	target := min(need+w.opts.ZeroAhead, max(w.opts.SegmentSize, need))
	for w.filled < target {
		m := min(int64(len(zeroPage)), target-w.filled)
		if _, err := w.f.WriteAt(zeroPage[:m], w.filled); err != nil {
			return err
		}
		w.filled += m
	}
	return nil
}

// fail records the sticky I/O error that every later call returns.
func (w *Writer) fail(err error) error {
	w.err = fmt.Errorf("%w: %w", ErrWriterFailed, err)
	return w.err
}

// MaxUnsyncedBytes bounds, under SyncEveryBatch, the bytes written but not
// yet synced when a batch is written after others that are still unsynced:
// the Writer syncs first rather than go past it (a lone batch may be
// larger). A crash can damage only unsynced bytes, so recovery cuts damage
// followed by later batches only within this bound of the segment's end
// (see the package doc).
const MaxUnsyncedBytes = 1 << 20

// Append encodes events as one batch of epoch, assigns them the next LSNs
// (setting events[i].LSN) and appends it, rolling the segment first if the
// batch would push a non-empty segment past SegmentSize. With SyncEveryBatch
// the batch is durable when Append returns; concurrent Appends share
// fdatasyncs (SyncTo). Invalid events (ErrInvalidEvent, ErrTooLarge) change
// nothing.
func (w *Writer) Append(epoch uint64, events []Event) (Header, error) {
	w.mu.Lock()
	h, buf, err := w.write(w.buf[:0], epoch, events)
	if err == nil && cap(buf) <= 4<<20 { // keep a reusable buffer, but do not pin a rare huge one
		w.buf = buf
	}
	w.mu.Unlock()
	if err != nil {
		return Header{}, err
	}
	if w.opts.Sync == SyncEveryBatch {
		if err := w.SyncTo(h.LastLSN()); err != nil {
			return Header{}, err
		}
	}
	return h, nil
}

// Write is Append without the sync, whatever the SyncPolicy: it encodes
// the batch into dst[:0] (growing it as needed), writes it and returns its
// header and the encoded bytes, which are exactly the bytes in the log (a
// caller that applies or ships the batch uses them instead of encoding it
// again). The batch is not durable, and must not be acknowledged, applied
// as durable or shipped, before SyncTo(h.LastLSN()) returns nil. Writes are
// in LSN order: a caller that needs its own order (stamping) holds its own
// lock across Write and releases it before SyncTo, so that concurrent
// writers share one sync.
func (w *Writer) Write(dst []byte, epoch uint64, events []Event) (Header, []byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.write(dst[:0], epoch, events)
}

// write encodes and writes one batch; w.mu is held.
func (w *Writer) write(dst []byte, epoch uint64, events []Event) (Header, []byte, error) {
	for {
		if w.closed {
			return Header{}, nil, ErrClosed
		}
		if w.err != nil {
			return Header{}, nil, w.err
		}
		if epoch < w.epoch {
			// Invariant 5 (DESIGN): a log never holds a batch of an older
			// epoch after a newer one; every reader of the log would refuse
			// it and everything after it.
			return Header{}, nil, fmt.Errorf("%w: shard %d: a batch of epoch %d after the log's last batch of epoch %d (LSN %d)",
				ErrEpochRegression, w.opts.Shard, epoch, w.epoch, w.next.Load()-1)
		}
		buf, h, err := appendBatch(dst, w.opts.Shard, epoch, w.next.Load(), events)
		if err != nil {
			return Header{}, nil, err
		}
		n := int64(len(buf))
		roll := w.size > 0 && w.size+n > w.opts.SegmentSize
		flush := !roll && w.opts.Sync == SyncEveryBatch && w.size > w.syncedSize && w.size-w.syncedSize+n > MaxUnsyncedBytes
		if (roll || flush) && w.syncing {
			// Neither roll nor sync the segment under a sync in flight;
			// the LSN may have moved when we get mu back: encode again.
			w.synced.Wait()
			continue
		}
		if roll {
			if err := w.roll(h.FirstLSN); err != nil {
				return Header{}, nil, err
			}
		} else if flush {
			if err := w.syncLocked(); err != nil {
				return Header{}, nil, err
			}
		}
		if err := w.fillAhead(n); err != nil {
			return Header{}, nil, w.fail(err)
		}
		if _, err := w.f.WriteAt(buf, w.size); err != nil {
			// What part of the batch reached the file is a torn tail: a Reader
			// stops there (io.EOF) and the reopen that recovers cuts it.
			return Header{}, nil, w.fail(err)
		}
		w.size += n
		w.retained.Add(n)
		w.batches.Add(1)
		w.next.Store(h.LastLSN() + 1)
		w.epoch = epoch
		for i := range events {
			events[i].LSN = h.FirstLSN + uint64(i)
		}
		return h, buf, nil
	}
}

// roll syncs and closes the active segment and starts one at first. The old
// segment is synced first so that only the last segment can ever be torn.
// No sync is in flight (w.syncing is false); first is NextLSN.
func (w *Writer) roll(first uint64) error {
	if err := w.syncLocked(); err != nil {
		return err
	}
	if err := w.f.Close(); err != nil {
		return w.fail(err)
	}
	w.f = nil
	w.old = append(w.old, sizedSegment{w.seg, w.size})
	if err := w.createSegment(first); err != nil {
		return w.fail(err)
	}
	w.noteRetention()
	return nil
}

// syncLocked syncs the active segment under w.mu; no sync is in flight.
func (w *Writer) syncLocked() error {
	if err := w.f.SyncData(); err != nil {
		return w.fail(err)
	}
	w.syncs.Add(1)
	w.durable.Store(w.next.Load() - 1)
	w.syncedSize = w.size
	return nil
}

// SyncTo returns once every batch up to lsn is durable — group commit, as
// Pebble's LogWriter and PostgreSQL's WAL flush do it: a caller whose batch
// an earlier sync covered returns at once; one that finds a sync in flight
// waits for it and, if that sync started before its batch was written,
// starts the next; a sync covers every batch written before it started. The
// fdatasync runs without w.mu, so others write meanwhile. A failed sync
// fails the Writer (ErrWriterFailed): SyncTo of every batch it did not
// cover — and every later call — returns that error. lsn must have been
// written (below NextLSN).
func (w *Writer) SyncTo(lsn uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if w.durable.Load() >= lsn {
			return nil
		}
		if w.err != nil {
			return w.err
		}
		if w.closed {
			return ErrClosed
		}
		if lsn >= w.next.Load() {
			return fmt.Errorf("wal: SyncTo(%d): the log ends at LSN %d", lsn, w.next.Load()-1)
		}
		if !w.syncing {
			break
		}
		w.synced.Wait()
	}
	w.syncing = true
	f, target, size := w.f, w.next.Load()-1, w.size
	w.mu.Unlock()
	err := f.SyncData()
	w.mu.Lock()
	w.syncing = false
	w.synced.Broadcast()
	if err != nil {
		if w.err == nil {
			w.fail(err)
		}
		return w.err
	}
	w.syncs.Add(1)
	// Durable even if a later write failed meanwhile: its torn bytes lie
	// after target.
	if target > w.durable.Load() {
		w.durable.Store(target)
		w.syncedSize = max(w.syncedSize, size)
	}
	return nil
}

// Sync makes every appended batch durable.
func (w *Writer) Sync() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	if w.err != nil {
		w.mu.Unlock()
		return w.err
	}
	end := w.next.Load() - 1
	w.mu.Unlock()
	return w.SyncTo(end)
}

// OpenReader opens a Reader of the Writer's log bounded by its NextLSN
// (Reader.Bound): it reads every batch written so far and never one still
// being written, whatever the files hold past it.
func (w *Writer) OpenReader() (*Reader, error) {
	r, err := OpenReaderFS(w.fs, w.dir, w.opts.Shard)
	if err != nil {
		return nil, err
	}
	r.Bound(w.NextLSN)
	return r, nil
}

// Batches is the number of batches written since the Writer opened.
func (w *Writer) Batches() uint64 { return w.batches.Load() }

// Syncs is the number of fdatasyncs that made written batches durable since
// the Writer opened (group commit, segment rolls, Sync; not Close's). Under
// SyncEveryBatch, Syncs below Batches is group commit at work: concurrent
// appenders shared a sync.
func (w *Writer) Syncs() uint64 { return w.syncs.Load() }

// NextLSN is the LSN the next appended event will get.
func (w *Writer) NextLSN() uint64 { return w.next.Load() }

// DurableLSN is the highest LSN known to be synced (0 if none). A Reader can
// see batches beyond it; a shipper that must not ship what a crash could
// lose should stop here.
func (w *Writer) DurableLSN() uint64 { return w.durable.Load() }

// FirstLSN is the first LSN the log still retains: the first LSN of its
// oldest segment. It is NextLSN when the log holds no batch yet.
func (w *Writer) FirstLSN() uint64 { return w.first.Load() }

// RetainedBytes is the size of all retained segments, the active one
// included.
func (w *Writer) RetainedBytes() int64 { return w.retained.Load() }

// SegmentInfo describes one retained segment: it holds LSNs FirstLSN up to
// the next segment's FirstLSN - 1 (the last segment: up to NextLSN - 1).
type SegmentInfo struct {
	FirstLSN uint64
	Size     int64
}

// Segments lists the retained segments, oldest first; the last is the active
// one. A retention policy reads it to know what DeleteBelow would free.
func (w *Writer) Segments() []SegmentInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]SegmentInfo, 0, len(w.old)+1)
	for _, s := range w.old {
		out = append(out, SegmentInfo{FirstLSN: s.first, Size: s.size})
	}
	return append(out, SegmentInfo{FirstLSN: w.seg.first, Size: w.size})
}

// DeleteBelow deletes, oldest first, every segment all of whose LSNs are
// below lsn, except the active (last) segment, which is never deleted; it
// returns how many it deleted. The directory is synced after each removal,
// so a crash or an error part-way leaves a contiguous suffix of the log,
// which reopens and reads normally. Readers asking for a deleted LSN get
// ErrCompacted. An error here does not fail the Writer: appends go on and a
// later DeleteBelow retries.
func (w *Writer) DeleteBelow(lsn uint64) (removed int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, ErrClosed
	}
	if w.err != nil {
		return 0, w.err
	}
	defer w.noteRetention()
	for len(w.old) > 0 {
		// The next segment's first LSN bounds this one's last.
		nextFirst := w.seg.first
		if len(w.old) > 1 {
			nextFirst = w.old[1].first
		}
		if nextFirst > lsn {
			break
		}
		if err := w.fs.Remove(w.fs.PathJoin(w.dir, w.old[0].name)); err != nil {
			return removed, fmt.Errorf("wal: deleting segment %s: %w", w.old[0].name, err)
		}
		w.old = w.old[1:]
		removed++
		// Made durable before the next removal: a crash must not keep an
		// older segment while losing a newer one's removal, which would
		// leave a gap.
		if err := syncDir(w.fs, w.dir); err != nil {
			return removed, fmt.Errorf("wal: syncing %s after deleting segments: %w", w.dir, err)
		}
	}
	return removed, nil
}

// Close syncs and closes the Writer and releases the shard's lock. A second
// Close returns ErrClosed.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	for w.syncing {
		w.synced.Wait() // do not close the segment under a sync in flight
	}
	if w.closed {
		return ErrClosed
	}
	w.closed = true
	var err error
	if w.f != nil {
		if w.err == nil {
			err = w.f.SyncData()
			if err == nil {
				w.durable.Store(w.next.Load() - 1)
			}
		}
		err = errors.Join(err, w.f.Close())
		w.f = nil
	}
	err = errors.Join(err, w.lock.release())
	if w.err != nil {
		return w.err
	}
	return err
}

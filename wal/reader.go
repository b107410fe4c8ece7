package wal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Reader iterates the raw batches of one shard's log in a directory, across
// segments, in LSN order. It can tail a live Writer: at an incomplete batch
// or the end of the log Next returns io.EOF and a later Next resumes at the
// same place. Not safe for concurrent use.
type Reader struct {
	fs     vfs.FS
	dir    string
	shard  uint32
	f      vfs.File
	seg    segment
	off    int64  // offset of the next batch in f
	size   int64  // size of f last observed
	expect uint64 // FirstLSN the batch at off must have
	target uint64 // Next skips batches that end before this LSN; 0: from the oldest retained
	bound  func() uint64
	buf    []byte
	closed bool
}

// Bound makes the Reader treat the log as ending before LSN next() (io.EOF
// there), whatever the files hold beyond it. A Reader tailing a Writer of
// the same process passes Writer.NextLSN: every batch below it is wholly
// written, and the Reader never reads one being written. Without a bound a
// Reader tailing a live log can meet a batch being written over zeros
// written ahead (WriterOptions.ZeroAhead) — a header that does not decode
// yet, or a body whose CRC fails — and reports it as such.
func (r *Reader) Bound(next func() uint64) { r.bound = next }

// OpenReader opens a Reader positioned at the start of the log of shard in
// dir (an existing directory; it may hold no segment yet): the first Next
// returns the oldest retained batch.
//
// It validates what it can cheaply, without a lock: that dir is a WAL
// directory (ErrNotWAL, ErrBadSegmentName) and that the first batch header
// of every segment of the shard decodes, carries the shard
// (ErrShardMismatch) and starts at the LSN in the segment's name. Defects
// further into a segment surface from Next. Only the last segment may be
// shorter than a header or start with zeros (a Writer may be creating it). A segment that
// retention deletes during the validation is skipped, not an error: a
// reader of later LSNs (a leader checking a follower's hello, a stream)
// must not fail because the log's start moved meanwhile.
func OpenReader(dir string, shard uint32) (*Reader, error) {
	return OpenReaderFS(vfs.Default, dir, shard)
}

// OpenReaderFS is OpenReader on the filesystem fs.
func OpenReaderFS(fs vfs.FS, dir string, shard uint32) (*Reader, error) {
	if err := checkDir(fs, dir); err != nil {
		return nil, err
	}
	segs, err := listSegments(fs, dir, shard)
	if err != nil {
		return nil, err
	}
	for i, seg := range segs {
		err := checkSegmentStart(fs, dir, seg, shard, i == len(segs)-1)
		if errors.Is(err, os.ErrNotExist) {
			// Retention (Writer.DeleteBelow) deleted it since the listing:
			// it is compacted, as Seek and Next report if asked for it.
			continue
		}
		if err != nil {
			return nil, err
		}
	}
	return &Reader{fs: fs, dir: dir, shard: shard}, nil
}

// checkSegmentStart checks the first batch header of seg.
func checkSegmentStart(fs vfs.FS, dir string, seg segment, shard uint32, last bool) error {
	f, err := fs.Open(fs.PathJoin(dir, seg.name))
	if err != nil {
		return err
	}
	defer f.Close()
	var hdr [HeaderSize]byte
	n, err := f.ReadAt(hdr[:], 0)
	errAt := func(err error) error { return fmt.Errorf("wal: segment %s offset 0: %w", seg.name, err) }
	if n < HeaderSize {
		if last && errors.Is(err, io.EOF) {
			return nil
		}
		if err == nil || errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: %d bytes, less than a batch header, in a non-last segment", ErrTruncated, n)
		}
		return errAt(err)
	}
	if last && allZeroBytes(hdr[:]) {
		return nil // zeros written ahead of the segment's first batch
	}
	h, err := DecodeHeader(hdr[:])
	switch {
	case err != nil:
		return errAt(err)
	case h.Shard != shard:
		return errAt(shardMismatch(h.Shard, shard))
	case h.FirstLSN != seg.first:
		return errAt(fmt.Errorf("%w: batch starts at LSN %d, the segment's name says %d", ErrCorrupt, h.FirstLSN, seg.first))
	}
	return nil
}

// Seek positions the Reader so that the next batch returned contains lsn, or
// is the first batch starting after it. It picks the segment from the names
// and then skips whole batches by their headers, without reading or decoding
// bodies. An lsn below the first retained one (DeleteBelow, or a log that
// starts above it) is ErrCompacted, here or, if the log has no segment yet,
// from Next. Seek(0) positions at the oldest retained batch.
func (r *Reader) Seek(lsn uint64) error {
	if r.closed {
		return ErrClosed
	}
	r.target = lsn
	r.closeFile()
	err := r.position()
	if errors.Is(err, io.EOF) {
		return nil // no segment yet; Next positions once one exists
	}
	return err
}

func (r *Reader) closeFile() {
	if r.f != nil {
		_ = r.f.Close()
		r.f = nil
	}
}

// position opens the segment that holds r.target (io.EOF: no segments yet).
func (r *Reader) position() error {
	segs, err := listSegments(r.fs, r.dir, r.shard)
	if err != nil {
		return err
	}
	if len(segs) == 0 {
		return io.EOF
	}
	if r.target == 0 {
		return r.open(segs[0])
	}
	if r.target < segs[0].first {
		return fmt.Errorf("%w: LSN %d of shard %d in %s: the log starts at LSN %d",
			ErrCompacted, r.target, r.shard, r.dir, segs[0].first)
	}
	i, found := slices.BinarySearchFunc(segs, r.target, func(s segment, lsn uint64) int {
		switch {
		case s.first < lsn:
			return -1
		case s.first > lsn:
			return 1
		}
		return 0
	})
	if !found {
		i-- // the last segment starting before target; i > 0 since segs[0].first < target
	}
	return r.open(segs[i])
}

// open switches to seg. A listed segment that no longer exists was deleted
// by retention in the meantime: what it held is compacted.
func (r *Reader) open(seg segment) error {
	f, err := r.fs.Open(r.fs.PathJoin(r.dir, seg.name))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: segment %s of %s was deleted: %w", ErrCompacted, seg.name, r.dir, err)
	}
	if err != nil {
		return err
	}
	r.closeFile()
	r.f, r.seg, r.off, r.size, r.expect = f, seg, 0, 0, seg.first
	return nil
}

func (r *Reader) errAt(err error) error {
	return fmt.Errorf("wal: segment %s offset %d: %w", r.seg.name, r.off, err)
}

// have reports whether n bytes are available at r.off, refreshing the file
// size when the last observed one is too small.
func (r *Reader) have(n int64) (bool, error) {
	if r.size-r.off >= n {
		return true, nil
	}
	st, err := r.f.Stat()
	if err != nil {
		return false, err
	}
	r.size = st.Size()
	return r.size-r.off >= n, nil
}

// peek returns the header of the complete batch at r.off, or ok=false when
// the bytes there are not (yet) a complete batch: too few, or a header of
// zeros (written ahead: the end of what was appended).
func (r *Reader) peek() (h Header, ok bool, err error) {
	if ok, err := r.have(HeaderSize); !ok || err != nil {
		return Header{}, false, err
	}
	r.buf = slices.Grow(r.buf[:0], HeaderSize)[:HeaderSize]
	if _, err := r.f.ReadAt(r.buf, r.off); err != nil {
		return Header{}, false, r.errAt(err)
	}
	if allZeroBytes(r.buf) {
		return Header{}, false, nil
	}
	h, err = DecodeHeader(r.buf)
	if err != nil {
		return Header{}, false, r.errAt(err)
	}
	if h.Shard != r.shard {
		return Header{}, false, r.errAt(shardMismatch(h.Shard, r.shard))
	}
	if h.FirstLSN != r.expect {
		return Header{}, false, r.errAt(fmt.Errorf("%w: batch starts at LSN %d, want %d", ErrCorrupt, h.FirstLSN, r.expect))
	}
	if ok, err := r.have(int64(h.Size())); !ok || err != nil {
		return Header{}, false, err
	}
	return h, true, nil
}

// nextSegment returns the segment following the current one, or ok=false
// if there is none yet, and the first LSN of the oldest segment.
func (r *Reader) nextSegment() (next segment, ok bool, oldest uint64, err error) {
	segs, err := listSegments(r.fs, r.dir, r.shard)
	if err != nil || len(segs) == 0 {
		return segment{}, false, 0, err
	}
	for _, s := range segs {
		if s.first > r.seg.first {
			return s, true, segs[0].first, nil
		}
	}
	return segment{}, false, segs[0].first, nil
}

// advance moves to the first complete batch that ends at or after r.target
// and returns its header, or io.EOF when there is none yet. It reads headers
// only.
func (r *Reader) advance() (Header, error) {
	if r.f == nil {
		if err := r.position(); err != nil {
			return Header{}, err
		}
	}
	for {
		if r.bound != nil && r.expect >= r.bound() {
			return Header{}, io.EOF
		}
		h, ok, err := r.peek()
		if err != nil {
			return Header{}, err
		}
		if !ok {
			// The Writer creates the next segment only after finishing this
			// one, so once a next segment exists, what is here now is all
			// there will be. Look again: the batch may have completed since
			// peek.
			seg, more, oldest, err := r.nextSegment()
			if err != nil {
				return Header{}, err
			}
			if !more {
				return Header{}, io.EOF
			}
			if h, ok, err = r.peek(); err != nil {
				return Header{}, err
			}
			if !ok {
				if err := r.checkEnded(); err != nil {
					return Header{}, err
				}
				if seg.first != r.expect {
					if oldest > r.expect {
						// The segment we read was deleted under us, and
						// the one after it too.
						return Header{}, fmt.Errorf("%w: LSN %d of shard %d in %s: the log now starts at LSN %d",
							ErrCompacted, r.expect, r.shard, r.dir, oldest)
					}
					return Header{}, r.errAt(fmt.Errorf("%w: next segment %s starts at LSN %d, want %d",
						ErrCorrupt, seg.name, seg.first, r.expect))
				}
				if err := r.open(seg); err != nil {
					return Header{}, err
				}
				continue
			}
		}
		if h.LastLSN() >= r.target {
			return h, nil
		}
		r.skip(h)
	}
}

// checkEnded checks that the segment before the next one ends at r.off:
// nothing follows but zeros written ahead.
func (r *Reader) checkEnded() error {
	st, err := r.f.Stat()
	if err != nil {
		return err
	}
	r.size = st.Size()
	zero, err := allZero(r.f, r.off, r.size)
	if err != nil {
		return r.errAt(err)
	}
	if !zero {
		return r.errAt(fmt.Errorf("%w: incomplete batch at end of non-last segment", ErrTruncated))
	}
	return nil
}

// skip moves past the batch with header h at r.off.
func (r *Reader) skip(h Header) {
	r.off += int64(h.Size())
	r.expect = h.LastLSN() + 1
}

// Next returns the next batch: its header and its raw bytes (header and
// body, body CRC verified, events not decoded). The bytes are valid until the
// next call. At the end of the log, or at a batch not yet completely written,
// it returns io.EOF; call again later to continue. A position below the
// first retained LSN is ErrCompacted. Other errors are typed (ErrCorrupt,
// ErrChecksum, ErrTruncated, ...) and wrap segment and offset.
func (r *Reader) Next() (Header, []byte, error) {
	if r.closed {
		return Header{}, nil, ErrClosed
	}
	h, err := r.advance()
	if err != nil {
		return Header{}, nil, err
	}
	// advance checked that the file holds h.Size() bytes, and BodyLen ≤
	// MaxBodySize: this allocation is bounded by real data.
	n := h.Size()
	r.buf = slices.Grow(r.buf[:0], n)[:n]
	if _, err := r.f.ReadAt(r.buf, r.off); err != nil {
		return Header{}, nil, r.errAt(err)
	}
	b, err := checkBody(h, r.buf)
	if err != nil {
		return Header{}, nil, r.errAt(err)
	}
	r.skip(h)
	return h, b, nil
}

// BatchEndingAt returns the header of the batch whose last LSN is lsn — the
// identity (Header, HeaderCRC included) a leader compares with a follower's
// last applied batch — reading headers only. On success the Reader is
// positioned after that batch: Next returns the batch starting at lsn+1.
//
// Errors: ErrCompacted when lsn is below the first retained LSN (the batch
// ending at the LSN just before it is gone too); ErrNoBatchBoundary when a
// retained batch contains lsn but does not end there, or lsn is 0; io.EOF
// when the log does not reach lsn yet. After an error, Seek before reading
// on.
func (r *Reader) BatchEndingAt(lsn uint64) (Header, error) {
	if r.closed {
		return Header{}, ErrClosed
	}
	if lsn == 0 {
		return Header{}, fmt.Errorf("%w: LSN 0 is never used", ErrNoBatchBoundary)
	}
	if err := r.Seek(lsn); err != nil {
		return Header{}, err
	}
	h, err := r.advance()
	if err != nil {
		return Header{}, err
	}
	if h.LastLSN() != lsn {
		return Header{}, fmt.Errorf("%w: LSN %d of shard %d is inside batch %d..%d",
			ErrNoBatchBoundary, lsn, r.shard, h.FirstLSN, h.LastLSN())
	}
	r.skip(h)
	return h, nil
}

// Close releases the Reader's file.
func (r *Reader) Close() error {
	if r.closed {
		return ErrClosed
	}
	r.closed = true
	r.closeFile()
	return nil
}

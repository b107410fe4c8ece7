package wal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// Reader iterates the raw batches of one shard's log in a directory, across
// segments, in LSN order. It can tail a live Writer: at an incomplete batch
// or the end of the log Next returns io.EOF and a later Next resumes at the
// same place. Not safe for concurrent use.
type Reader struct {
	dir    string
	shard  uint32
	f      *os.File
	seg    segment
	off    int64  // offset of the next batch in f
	size   int64  // size of f last observed
	expect uint64 // FirstLSN the batch at off must have
	target uint64 // Next skips batches that end before this LSN
	buf    []byte
	closed bool
}

// OpenReader opens a Reader positioned at the start of the log of shard in
// dir (an existing directory; it may hold no segment yet).
func OpenReader(dir string, shard uint32) (*Reader, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("wal: %s is not a directory", dir)
	}
	if _, err := listSegments(dir, shard); err != nil {
		return nil, err
	}
	return &Reader{dir: dir, shard: shard, target: 1}, nil
}

// Seek positions the Reader so that the next batch returned contains lsn, or
// is the first batch starting after it (when lsn precedes the oldest segment).
// It picks the segment from the names and then skips whole batches by their
// headers, without reading or decoding bodies.
func (r *Reader) Seek(lsn uint64) error {
	if r.closed {
		return ErrClosed
	}
	r.target = max(lsn, 1)
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
	segs, err := listSegments(r.dir, r.shard)
	if err != nil {
		return err
	}
	if len(segs) == 0 {
		return io.EOF
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
		i = max(i-1, 0) // last segment starting before target, or the oldest
	}
	return r.open(segs[i])
}

func (r *Reader) open(seg segment) error {
	f, err := os.Open(segPath(r.dir, seg.name))
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
// the bytes there are not (yet) a complete batch.
func (r *Reader) peek() (h Header, ok bool, err error) {
	if ok, err := r.have(HeaderSize); !ok || err != nil {
		return Header{}, false, err
	}
	r.buf = slices.Grow(r.buf[:0], HeaderSize)[:HeaderSize]
	if _, err := r.f.ReadAt(r.buf, r.off); err != nil {
		return Header{}, false, r.errAt(err)
	}
	h, err = DecodeHeader(r.buf)
	if err != nil {
		return Header{}, false, r.errAt(err)
	}
	if h.Shard != r.shard {
		return Header{}, false, r.errAt(fmt.Errorf("%w: batch of shard %d, want %d", ErrCorrupt, h.Shard, r.shard))
	}
	if h.FirstLSN != r.expect {
		return Header{}, false, r.errAt(fmt.Errorf("%w: batch starts at LSN %d, want %d", ErrCorrupt, h.FirstLSN, r.expect))
	}
	if ok, err := r.have(int64(h.Size())); !ok || err != nil {
		return Header{}, false, err
	}
	return h, true, nil
}

// nextSegment returns the segment following the current one, or ok=false if
// there is none yet.
func (r *Reader) nextSegment() (segment, bool, error) {
	segs, err := listSegments(r.dir, r.shard)
	if err != nil {
		return segment{}, false, err
	}
	for _, s := range segs {
		if s.first > r.seg.first {
			return s, true, nil
		}
	}
	return segment{}, false, nil
}

// Next returns the next batch: its header and its raw bytes (header and
// body, body CRC verified, events not decoded). The bytes are valid until the
// next call. At the end of the log, or at a batch not yet completely written,
// it returns io.EOF; call again later to continue. Other errors are typed
// (ErrCorrupt, ErrChecksum, ErrTruncated, ...) and wrap segment and offset.
func (r *Reader) Next() (Header, []byte, error) {
	if r.closed {
		return Header{}, nil, ErrClosed
	}
	if r.f == nil {
		if err := r.position(); err != nil {
			return Header{}, nil, err
		}
	}
	for {
		h, ok, err := r.peek()
		if err != nil {
			return Header{}, nil, err
		}
		if !ok {
			seg, more, err := r.nextSegment()
			if err != nil || !more {
				if err == nil {
					err = io.EOF
				}
				return Header{}, nil, err
			}
			// The Writer creates the next segment only after finishing this
			// one, so what is here now is all there will be. Look again: the
			// batch may have completed since peek.
			if h, ok, err = r.peek(); err != nil {
				return Header{}, nil, err
			}
			if !ok {
				if r.size != r.off {
					return Header{}, nil, r.errAt(fmt.Errorf("%w: incomplete batch at end of non-last segment", ErrTruncated))
				}
				if seg.first != r.expect {
					return Header{}, nil, r.errAt(fmt.Errorf("%w: next segment %s starts at LSN %d, want %d",
						ErrCorrupt, seg.name, seg.first, r.expect))
				}
				if err := r.open(seg); err != nil {
					return Header{}, nil, err
				}
				continue
			}
		}
		if h.LastLSN() < r.target {
			r.off += int64(h.Size())
			r.expect = h.LastLSN() + 1
			continue
		}
		// peek checked that the file holds h.Size() bytes, and BodyLen ≤
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
		r.off += int64(n)
		r.expect = h.LastLSN() + 1
		return h, b, nil
	}
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

package wal

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

const (
	segSuffix     = ".wal"
	segShardDigit = 10 // math.MaxUint32 has 10 decimal digits
	segLSNDigits  = 20 // math.MaxUint64 has 20 decimal digits
	segNameLen    = segShardDigit + 1 + segLSNDigits + len(segSuffix)
	sectorSize    = 512
)

// SegmentName returns the file name of the segment of shard whose first batch
// starts at firstLSN: shard in 10 and LSN in 20 zero-padded decimal digits, so
// lexical order is numeric order (e.g. shard 3, LSN 4096 →
// "0000000003-00000000000000004096.wal").
func SegmentName(shard uint32, firstLSN uint64) string {
	return fmt.Sprintf("%0*d-%0*d%s", segShardDigit, shard, segLSNDigits, firstLSN, segSuffix)
}

// ParseSegmentName is the strict inverse of SegmentName: anything but exactly
// that form (length, digits only, dash, suffix, values in range, LSN ≥ 1) is
// ErrBadSegmentName.
func ParseSegmentName(name string) (shard uint32, firstLSN uint64, err error) {
	bad := func(why string) (uint32, uint64, error) {
		return 0, 0, fmt.Errorf("%w: %q: %s", ErrBadSegmentName, name, why)
	}
	if len(name) != segNameLen || !strings.HasSuffix(name, segSuffix) || name[segShardDigit] != '-' {
		return bad("want SSSSSSSSSS-LLLLLLLLLLLLLLLLLLLL.wal")
	}
	s, l := name[:segShardDigit], name[segShardDigit+1:segShardDigit+1+segLSNDigits]
	for _, part := range []string{s, l} {
		for i := 0; i < len(part); i++ {
			if part[i] < '0' || part[i] > '9' {
				return bad("non-digit")
			}
		}
	}
	sh, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return bad("shard out of range")
	}
	lsn, err := strconv.ParseUint(l, 10, 64)
	if err != nil {
		return bad("LSN out of range")
	}
	if lsn == 0 {
		return bad("LSN 0")
	}
	return uint32(sh), lsn, nil
}

type segment struct {
	name  string
	first uint64
}

// dirListing is what a WAL directory holds: the segments of each shard,
// ordered by first LSN.
type dirListing map[uint32][]segment

// listDir lists a WAL directory. Segments (of any shard) and lock files are
// WAL files; a ".wal" file whose name does not parse is ErrBadSegmentName,
// since guessing could skip or misorder data; anything else means this is
// not a WAL directory (ErrNotWAL), so the caller does not write into, or
// serve, someone else's files.
func listDir(fs vfs.FS, dir string) (dirListing, error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, err
	}
	l := dirListing{}
	for _, name := range names {
		switch {
		case strings.HasSuffix(name, segSuffix):
			sh, first, err := ParseSegmentName(name)
			if err != nil {
				return nil, fmt.Errorf("wal: directory %s: %w", dir, err)
			}
			l[sh] = append(l[sh], segment{name: name, first: first})
		case isLockName(name), isTempName(name):
		default:
			return nil, fmt.Errorf("%w: directory %s holds %q, which is neither a segment nor a lock file", ErrNotWAL, dir, name)
		}
	}
	for _, segs := range l {
		slices.SortFunc(segs, func(a, b segment) int { return cmp.Compare(a.first, b.first) })
	}
	return l, nil
}

// listSegments returns shard's segments in dir ordered by first LSN (see
// listDir for what else the directory may hold).
func listSegments(fs vfs.FS, dir string, shard uint32) ([]segment, error) {
	l, err := listDir(fs, dir)
	if err != nil {
		return nil, err
	}
	return l[shard], nil
}

// ListShards returns, in increasing order, the shards whose segments dir
// holds. Like OpenWriter and OpenReader it refuses a directory holding
// anything but segments and lock files (ErrNotWAL) and malformed segment
// names (ErrBadSegmentName). A leader uses it to refuse a directory with
// segments of shards it does not own.
func ListShards(dir string) ([]uint32, error) { return ListShardsFS(vfs.Default, dir) }

// ListShardsFS is ListShards on the filesystem fs.
func ListShardsFS(fs vfs.FS, dir string) ([]uint32, error) {
	if err := checkDir(fs, dir); err != nil {
		return nil, err
	}
	l, err := listDir(fs, dir)
	if err != nil {
		return nil, err
	}
	return slices.Sorted(maps.Keys(l)), nil
}

// checkDir checks that dir is an existing directory (a regular file there
// is ErrNotWAL).
func checkDir(fs vfs.FS, dir string) error {
	st, err := fs.Stat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", ErrNotWAL, dir)
	}
	return nil
}

// scanResult describes the valid prefix of a segment.
type scanResult struct {
	size int64  // file size when scanned
	end  int64  // offset just past the last valid batch
	next uint64 // LSN after the last valid batch (seg.first if none)
	torn bool   // bytes after end are a torn tail (only for the last segment)
	// zeros: the bytes from end to size are zeros written ahead (see
	// WriterOptions.ZeroAhead), which the Writer keeps and writes over.
	zeros bool
	// epoch is the epoch of the last valid batch (the epoch passed in when
	// the segment holds none).
	epoch uint64
}

// scanSegment validates the batches of one segment. For a non-last segment it
// walks headers only (framing, shard, LSN continuity) and the segment must end
// after a batch, with nothing but zeros after it. For the last segment it also
// verifies body CRCs and classifies what follows the last valid batch: zeros
// written ahead, a torn tail (see the package doc for the exact rule) or
// corruption. A batch of an epoch below the one before it (epoch: the last
// batch's of the previous segments) is refused with an
// *EpochRegressionError. buf is scratch space.
//
// The torn-tail rules judge the bytes up to the data end — past the last
// non-zero byte of the file — because zeros written ahead fill the file
// beyond what was appended: a torn append there leaves data followed by
// zeros, not a file that ends early. Reads still go up to the file size, as
// a valid batch may end in zero bytes of its own.
func scanSegment(f vfs.File, seg segment, shard uint32, last bool, epoch uint64, buf *[]byte) (scanResult, error) {
	st, err := f.Stat()
	if err != nil {
		return scanResult{}, err
	}
	size := st.Size()
	res := scanResult{size: size, next: seg.first, epoch: epoch}
	data := size // the data end: past the last non-zero byte (last segment)
	if last {
		if data, err = DataEnd(f, size); err != nil {
			return res, err
		}
	}
	var hdr [HeaderSize]byte
	errAt := func(off int64, err error) error {
		return fmt.Errorf("wal: segment %s offset %d: %w", seg.name, off, err)
	}
	for off := int64(0); off < size; {
		if last && off >= data {
			res.zeros = true // nothing but zeros from here: the log ends
			return res, nil
		}
		rem := size - off
		if rem < HeaderSize {
			if last {
				res.torn = true
				return res, nil
			}
			if zero, err := allZero(f, off, size); err != nil || zero {
				res.zeros = zero
				return res, err
			}
			return res, errAt(off, fmt.Errorf("%w: %d bytes after last batch of non-last segment", ErrTruncated, rem))
		}
		if _, err := f.ReadAt(hdr[:], off); err != nil {
			return res, errAt(off, err)
		}
		h, err := DecodeHeader(hdr[:])
		if err != nil {
			if !last {
				// Zeros written ahead and not used before the Writer rolled.
				if zero, zerr := allZero(f, off, size); zerr != nil || zero {
					res.zeros = zero
					return res, zerr
				}
				return res, errAt(off, err)
			}
			torn := data-off < HeaderSize // a header cut short, then zeros
			if !torn {
				var terr error
				if torn, terr = tornAppend(f, off, data, shard, res.next, buf); terr != nil {
					return res, errAt(off, terr)
				}
			}
			if torn {
				res.torn = true
				return res, nil
			}
			return res, errAt(off, err)
		}
		if h.Shard != shard {
			return res, errAt(off, shardMismatch(h.Shard, shard))
		}
		if h.FirstLSN != res.next {
			return res, errAt(off, fmt.Errorf("%w: batch starts at LSN %d, want %d", ErrCorrupt, h.FirstLSN, res.next))
		}
		if h.Epoch < res.epoch {
			return res, &EpochRegressionError{Segment: seg.name, Offset: off, LSN: h.FirstLSN, Epoch: h.Epoch, Prev: res.epoch}
		}
		n := int64(h.Size())
		if n > rem {
			if last {
				res.torn = true
				return res, nil
			}
			return res, errAt(off, fmt.Errorf("%w: batch of %d bytes, %d left in non-last segment", ErrTruncated, n, rem))
		}
		if last {
			b := slices.Grow((*buf)[:0], int(n))[:n]
			*buf = b
			if _, err := f.ReadAt(b, off); err != nil {
				return res, errAt(off, err)
			}
			if _, err := checkBody(h, b); err != nil {
				torn, terr := tornBatch(f, b, off, data, size, shard, h.LastLSN())
				if terr != nil {
					return res, errAt(off, terr)
				}
				if torn {
					res.torn = true
					return res, nil
				}
				return res, errAt(off, err)
			}
		}
		off += n
		res.end, res.next, res.epoch = off, h.LastLSN()+1, h.Epoch
	}
	return res, nil
}

// DataEnd returns the offset just past the last non-zero byte of the first
// size bytes of a segment file (0 if all are zero): where the zeros the
// Writer wrote ahead of its appends begin (WriterOptions.ZeroAhead), in a
// segment whose last batch does not end in zero bytes of its own. It reads
// backwards from size, so it reads little more than those zeros.
func DataEnd(r io.ReaderAt, size int64) (int64, error) {
	var chunk [32 << 10]byte
	for end := size; end > 0; {
		n := min(int64(len(chunk)), end)
		if _, err := r.ReadAt(chunk[:n], end-n); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := n - 1; i >= 0; i-- {
			if chunk[i] != 0 {
				return end - n + i + 1, nil
			}
		}
		end -= n
	}
	return 0, nil
}

// contentEnd is where a segment's content ends and the zeros written ahead
// of its appends begin: after its last batch that decodes, which may end in
// zero bytes of its own, or its last non-zero byte (damage), whichever is
// later.
func contentEnd(f vfs.File, size int64) (int64, error) {
	end, err := DataEnd(f, size)
	if err != nil {
		return 0, err
	}
	var hdr [HeaderSize]byte
	for off := int64(0); off+HeaderSize <= size; {
		if _, err := f.ReadAt(hdr[:], off); err != nil {
			return 0, err
		}
		h, err := DecodeHeader(hdr[:])
		if err != nil || off+int64(h.Size()) > size {
			break
		}
		off += int64(h.Size())
		end = max(end, off)
	}
	return end, nil
}

// shardMismatch is the error for a batch of shard got in shard want's log.
func shardMismatch(got, want uint32) error {
	return fmt.Errorf("%w: %w: batch of shard %d in the log of shard %d", ErrCorrupt, ErrShardMismatch, got, want)
}

// checkBody verifies the body CRC of a whole batch b with header h.
func checkBody(h Header, b []byte) ([]byte, error) {
	if got := crc32Castagnoli(b[HeaderSize:h.Size()]); got != h.BodyCRC {
		return nil, fmt.Errorf("%w: body crc %#08x, header says %#08x", ErrChecksum, got, h.BodyCRC)
	}
	return b[:h.Size()], nil
}

// allZero reports whether f[off:size] is all zero bytes.
func allZero(f vfs.File, off, size int64) (bool, error) {
	var chunk [32 << 10]byte
	for off < size {
		n := min(int64(len(chunk)), size-off)
		if _, err := f.ReadAt(chunk[:n], off); err != nil && !errors.Is(err, io.EOF) {
			return false, err
		}
		if !allZeroBytes(chunk[:n]) {
			return false, nil
		}
		off += n
	}
	return true, nil
}

// tornBatch reports whether b, a whole batch at off in the last segment
// whose body CRC fails, is torn. data is the segment's data end (see
// scanSegment), size its file size. It is torn if it reaches the data end
// (nothing but zeros after it) and a zero sector overlaps it; or, within
// MaxUnsyncedBytes of the end of what follows it (a group commit's
// unsynced batches, which may reach the disk with holes), a zero sector
// overlaps it. The sector holding its end may run into what follows it:
// the next batch, or zeros written ahead — a lost last page of the batch
// leaves only its end zero, short of a sector of its own.
func tornBatch(f vfs.File, b []byte, off, data, size int64, shard uint32, next uint64) (bool, error) {
	n := int64(len(b))
	last := off+n >= data
	if !last {
		if data-off > MaxUnsyncedBytes {
			return false, nil
		}
		// A later batch may end in zeros of its own, past data.
		after := make([]byte, data-off-n)
		if _, err := f.ReadAt(after, off+n); err != nil {
			return false, err
		}
		if end, ok := laterEnd(after, 0, shard, next); ok && n+end > MaxUnsyncedBytes {
			return false, nil
		}
	}
	if hasZeroSector(b, off) {
		return true, nil
	}
	end := min(size, (off+n+sectorSize-1)/sectorSize*sectorSize)
	if end <= off+n {
		return false, nil
	}
	ext := make([]byte, end-off)
	if _, err := f.ReadAt(ext, off); err != nil {
		return false, err
	}
	return hasZeroSector(ext, off), nil
}

// tornAppend reports whether f[off:data], which follows the last valid batch
// of the last segment and does not start with a valid header, is what an
// interrupted append leaves (data: the segment's data end, see
// scanSegment, so the bytes are not all zero — zeros to the end are the
// log's end, which scanSegment tells before): at most one batch long, it
// starts with zeros up to a sector boundary or holds a zero sector (pages
// that never reached the disk) and either holds no header of a later batch
// of the log (shard, first LSN after next) or ends, with the later batches
// it holds, within MaxUnsyncedBytes (the unsynced batches of one group
// commit) — beyond that bound a later batch would mean the damaged one was
// acknowledged.
func tornAppend(f vfs.File, off, data int64, shard uint32, next uint64, buf *[]byte) (bool, error) {
	n := data - off
	if n > HeaderSize+MaxBodySize {
		return false, nil
	}
	b := slices.Grow((*buf)[:0], int(n))[:n]
	*buf = b
	if _, err := f.ReadAt(b, off); err != nil {
		return false, err
	}
	lead := min(sectorSize-off%sectorSize, n) // up to the next sector boundary
	if !allZeroBytes(b[:lead]) && !hasZeroSector(b, off) {
		return false, nil
	}
	end, later := laterEnd(b, 1, shard, next)
	return !later || max(n, end) <= MaxUnsyncedBytes, nil
}

// laterEnd looks for valid headers of shard's batches starting after LSN
// next at offsets ≥ from in b, and returns the furthest end (offset in b)
// of the batches they announce — beyond len(b) for a batch that ends in
// zero bytes of its own — and whether it found any.
func laterEnd(b []byte, from int, shard uint32, next uint64) (end int64, found bool) {
	var m [4]byte
	binary.LittleEndian.PutUint32(m[:], magic)
	for i := from; i < len(b); i++ {
		j := bytes.Index(b[i:], m[:])
		if j < 0 {
			break
		}
		i += j
		if h, err := DecodeHeader(b[i:]); err == nil && h.Shard == shard && h.FirstLSN > next {
			end, found = max(end, int64(i+h.Size())), true
		}
	}
	return end, found
}

func allZeroBytes(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// hasZeroSector reports whether b, which lies at file offset off, contains an
// all-zero sector-aligned 512-byte block: the trace of a write whose size
// update reached the disk but some of whose pages did not.
func hasZeroSector(b []byte, off int64) bool {
	start := (sectorSize - off%sectorSize) % sectorSize
	for s := start; s+sectorSize <= int64(len(b)); s += sectorSize {
		if allZeroBytes(b[s : s+sectorSize]) {
			return true
		}
	}
	return false
}

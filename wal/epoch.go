package wal

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// ErrEpochRegression: a batch of an older epoch than the log's last batch —
// refused by Writer.Append and Write before anything is written, and, found
// in a log, corruption (OpenWriter, Check and InspectFS return it as an
// *EpochRegressionError, which also matches ErrCorrupt). Invariant 5 of the
// design: a WAL never holds a batch of an older epoch after a newer one.
var ErrEpochRegression = errors.New("wal: leader epoch goes backwards")

// EpochRegressionError locates the first batch of a log whose epoch is
// below its predecessor's. It matches ErrEpochRegression and ErrCorrupt.
type EpochRegressionError struct {
	Segment string // segment file name
	Offset  int64  // of the batch in Segment
	LSN     uint64 // the batch's first LSN
	Epoch   uint64 // the batch's epoch
	Prev    uint64 // the epoch of the batch before it
}

func (e *EpochRegressionError) Error() string {
	return fmt.Sprintf("wal: segment %s offset %d: %v: %v: the batch at LSN %d has epoch %d, after a batch of epoch %d",
		e.Segment, e.Offset, ErrCorrupt, ErrEpochRegression, e.LSN, e.Epoch, e.Prev)
}

// Unwrap makes errors.Is match both ErrEpochRegression and ErrCorrupt.
func (e *EpochRegressionError) Unwrap() []error { return []error{ErrEpochRegression, ErrCorrupt} }

// LogInfo is what a shard's log holds, as InspectFS finds it.
type LogInfo struct {
	// FirstLSN is the first LSN the log retains; 0 when it has no segment.
	FirstLSN uint64
	// NextLSN is the LSN after the last valid batch (FirstLSN when it has
	// none; 0 when it has no segment).
	NextLSN uint64
	// LastEpoch is the epoch of the last valid batch; 0 when it has none.
	LastEpoch uint64
}

// InspectFS validates the log of shard in dir as Check does (read-only,
// without the lock) and says what it holds. An absent directory is an empty
// log.
func InspectFS(fs vfs.FS, dir string, shard uint32) (LogInfo, error) {
	if _, err := fs.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return LogInfo{}, nil
	}
	if err := checkDir(fs, dir); err != nil {
		return LogInfo{}, err
	}
	var scratch []byte
	scan, err := scanLog(fs, dir, shard, &scratch)
	if err != nil || len(scan.segs) == 0 {
		return LogInfo{}, err
	}
	return LogInfo{FirstLSN: scan.segs[0].first, NextLSN: scan.next, LastEpoch: scan.epoch}, nil
}

// LastEpoch is the epoch of the log's last batch (0 for a log without
// batches); Append refuses a lower one (ErrEpochRegression).
func (w *Writer) LastEpoch() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.epoch
}

// EpochCut is what CutEpochRegression did.
type EpochCut struct {
	// LSN is the first LSN cut: the first batch whose epoch went back and
	// everything after it. 0: the log had no regression; nothing was done.
	LSN uint64
	// Epoch and Prev are that batch's epoch and its predecessor's.
	Epoch, Prev uint64
	// Bytes is how many bytes were cut.
	Bytes int64
	// SideFile holds the cut bytes, verbatim: the batches from LSN on in
	// log order (oncewal waldump reads it as a segment file).
	SideFile string
}

// CutEpochRegression repairs the log of shard in dir that holds a batch of
// an older epoch after a newer one: it moves that batch and everything after
// it into a new file in sideDir (never overwriting one) and cuts the log
// there, so that the log ends with its last batch before the regression.
// It holds the shard's lock while it works (ErrLocked if a Writer has it).
// A log without a regression is left alone (EpochCut.LSN 0); a log with
// other damage is refused with that error, unchanged.
//
// Crash safety: the side file is written and synced before the log
// changes; then the segments after the one holding the regression are
// removed, last first, and that segment is cut (cutTail: a copy renamed
// over it). A crash in between leaves the regression in place and a side
// file with every byte, so running it again finishes the cut (its new side
// file then holds what was left).
//
// Why nothing acknowledged is lost (see the package doc).
func CutEpochRegression(fs vfs.FS, dir string, shard uint32, sideDir string) (cut EpochCut, err error) {
	if err := checkDir(fs, dir); err != nil {
		return EpochCut{}, err
	}
	lock, err := lockShard(fs, dir, shard)
	if err != nil {
		return EpochCut{}, err
	}
	defer func() {
		if rerr := lock.release(); err == nil {
			err = rerr
		}
	}()
	var scratch []byte
	_, err = scanLog(fs, dir, shard, &scratch)
	var reg *EpochRegressionError
	if err == nil {
		return EpochCut{}, nil
	}
	if !errors.As(err, &reg) {
		return EpochCut{}, err
	}
	segs, err := listSegments(fs, dir, shard)
	if err != nil {
		return EpochCut{}, err
	}
	i := slices.IndexFunc(segs, func(s segment) bool { return s.name == reg.Segment })
	if i < 0 {
		return EpochCut{}, fmt.Errorf("wal: segment %s vanished while cutting", reg.Segment)
	}
	cut = EpochCut{LSN: reg.LSN, Epoch: reg.Epoch, Prev: reg.Prev}
	if cut.SideFile, cut.Bytes, err = writeSideFile(fs, dir, segs[i:], reg.Offset, sideDir,
		fmt.Sprintf("stale-epoch-shard-%04d-from-lsn-%d", shard, reg.LSN)); err != nil {
		return EpochCut{}, fmt.Errorf("wal: saving the batches from LSN %d: %w", reg.LSN, err)
	}
	for j := len(segs) - 1; j > i; j-- {
		if err := fs.Remove(fs.PathJoin(dir, segs[j].name)); err != nil {
			return EpochCut{}, err
		}
	}
	if err := syncDir(fs, dir); err != nil {
		return EpochCut{}, err
	}
	if err := cutTail(fs, dir, sizedSegment{segs[i], reg.Offset}, scratch); err != nil {
		return EpochCut{}, err
	}
	return cut, nil
}

// writeSideFile copies segs[0] from off and every later segment whole (up
// to the zeros written ahead of its appends) into a new file named after
// base in sideDir, syncs it and sideDir, and returns its path and size.
func writeSideFile(fs vfs.FS, dir string, segs []segment, off int64, sideDir, base string) (path string, n int64, err error) {
	if err := MkdirAllSynced(fs, sideDir); err != nil {
		return "", 0, err
	}
	path = fs.PathJoin(sideDir, base+".walcut")
	for k := 2; ; k++ {
		if _, err := fs.Stat(path); errors.Is(err, os.ErrNotExist) {
			break
		} else if err != nil {
			return "", 0, err
		}
		path = fs.PathJoin(sideDir, fmt.Sprintf("%s.%d.walcut", base, k))
	}
	dst, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return "", 0, err
	}
	defer func() {
		if dst != nil {
			_ = dst.Close()
		}
		if err != nil {
			_ = fs.Remove(path)
		}
	}()
	buf := make([]byte, 1<<20)
	for j, s := range segs {
		src, err := fs.Open(fs.PathJoin(dir, s.name))
		if err != nil {
			return "", 0, err
		}
		st, err := src.Stat()
		if err != nil {
			_ = src.Close()
			return "", 0, err
		}
		from := int64(0)
		if j == 0 {
			from = off
		}
		// Not the zeros written ahead, which would sit between the
		// segments' batches in the side file.
		end, err := contentEnd(src, st.Size())
		if err != nil {
			_ = src.Close()
			return "", 0, err
		}
		for pos := from; pos < end; {
			m := min(int64(len(buf)), end-pos)
			if _, err := src.ReadAt(buf[:m], pos); err != nil {
				_ = src.Close()
				return "", 0, err
			}
			if _, err := dst.Write(buf[:m]); err != nil {
				_ = src.Close()
				return "", 0, err
			}
			pos += m
			n += m
		}
		if err := src.Close(); err != nil {
			return "", 0, err
		}
	}
	if err := dst.Sync(); err != nil {
		return "", 0, err
	}
	err, dst = dst.Close(), nil
	if err != nil {
		return "", 0, err
	}
	return path, n, syncDir(fs, sideDir)
}

package leader

import (
	"errors"
	"fmt"
	"io"

	"github.com/oncewal/oncewal/replication"

	"github.com/oncewal/oncewal/wal"
)

// EpochBoundary is where a leader's current epoch starts in its history.
type EpochBoundary struct {
	// Epoch is the leader's current epoch.
	Epoch uint64
	// StartLSN is the first LSN written under Epoch (0: unknown).
	StartLSN uint64
	// Prev identifies the batch ending at StartLSN-1 in the history the
	// epoch continues (zero: unknown). A promoted leader whose log starts at
	// StartLSN reads it from its store at promotion (ReadLastBatch).
	Prev wal.BatchRef
}

// HelloLog is what CheckHello needs to know about the leader's log.
type HelloLog interface {
	// Retained returns the first LSN the log holds and its last LSN (first-1
	// when it holds none). An untrimmed log starts at 1; a promoted
	// leader's at its epoch's start; retention moves first up.
	Retained() (first, last uint64)
	// BatchEndingAt returns the identity of the log's batch whose last LSN
	// is lsn, for first ≤ lsn ≤ last; ok is false when no batch ends there.
	BatchEndingAt(lsn uint64) (ref wal.BatchRef, ok bool, err error)
	// Boundary returns where the leader's current epoch starts.
	Boundary() EpochBoundary
}

// CheckHello verifies that a follower's history, as its hello states it, is
// a prefix of the leader's log, so that shipping from hello.AppliedLSN+1
// continues it. Give it to ShipperOptions.VerifyHello. With first and last
// the log's retained range and a the follower's applied LSN:
//
//   - a > last: ErrDiverged (the follower holds entries this log does not);
//   - a == 0 and the log starts at 1: fine;
//   - hello.LastBatch unknown (a store older than the field): only the epoch
//     rule can be checked — a follower of an older epoch that applied the
//     epoch's first LSN or beyond is ErrDiverged; then a < first-1 is
//     replication.ErrBehindRetention, anything else is fine;
//   - a < first-1: replication.ErrBehindRetention;
//   - a == first-1: LastBatch must equal the epoch boundary's Prev when the
//     log starts at the epoch's first LSN and Prev is known (else
//     ErrDiverged); otherwise replication.ErrBehindRetention (the batch is gone and
//     nothing recorded its identity);
//   - first ≤ a ≤ last: a batch of the log must end at a, with LastBatch's
//     epoch and CRC; else ErrDiverged.
//
// An error reading the log is returned wrapped (the connection is refused
// and the follower retries), except when retention deleted the LSN during
// the check: then replication.ErrBehindRetention.
func CheckHello(hello replication.Ack, log HelloLog) error {
	err := checkHello(hello, log)
	switch {
	case errors.Is(err, replication.ErrDiverged):
		return fmt.Errorf("%w; %s", err, remedyDiverged)
	case errors.Is(err, replication.ErrBehindRetention):
		return fmt.Errorf("%w; %s", err, remedyBehind)
	}
	return err
}

// What an operator does about a follower refused as diverged or behind
// retention: only a rebuild helps (or, for the latter, keeping more log
// from then on).
const (
	remedyDiverged = "rebuild the follower's store from a snapshot (oncewal follower --rebuild auto, the default)"
	remedyBehind   = "rebuild the follower's store from a snapshot (oncewal follower --rebuild auto, the default), and keep more log on the leader if it falls behind again (oncewal leader --max-retained-bytes)"
)

func checkHello(hello replication.Ack, log HelloLog) error {
	first, last := log.Retained()
	b := log.Boundary()
	a := hello.AppliedLSN
	if a > last {
		return fmt.Errorf("%w: follower applied up to LSN %d, this leader's log ends at %d", replication.ErrDiverged, a, last)
	}
	if a == 0 && first <= 1 {
		return nil
	}
	if hello.LastBatch.IsZero() {
		if b.StartLSN > 0 && hello.Epoch < b.Epoch && a >= b.StartLSN {
			return fmt.Errorf("%w: follower applied LSN %d under epoch %d, but epoch %d starts at LSN %d",
				replication.ErrDiverged, a, hello.Epoch, b.Epoch, b.StartLSN)
		}
		if a+1 < first {
			return fmt.Errorf("%w: follower needs LSN %d, the log starts at %d", replication.ErrBehindRetention, a+1, first)
		}
		return nil
	}
	switch {
	case a+1 < first:
		return fmt.Errorf("%w: follower needs LSN %d, the log starts at %d", replication.ErrBehindRetention, a+1, first)
	case a+1 == first:
		if b.StartLSN != first || b.Prev.IsZero() {
			return fmt.Errorf("%w: follower stopped at LSN %d, just before the log's first, and no record says which batch ends there",
				replication.ErrBehindRetention, a)
		}
		if hello.LastBatch != b.Prev {
			return fmt.Errorf("%w: follower's batch ending at LSN %d is %v, the history epoch %d continues has %v",
				replication.ErrDiverged, a, hello.LastBatch, b.Epoch, b.Prev)
		}
		return nil
	}
	ref, ok, err := log.BatchEndingAt(a)
	if err != nil {
		// Retention may have deleted the segment between Retained and the
		// read (a follower behind its own slot: it lost what it acked, or
		// its slot was dropped); that is a refusal, not a read error.
		if first, _ := log.Retained(); a+1 < first {
			return fmt.Errorf("%w: follower needs LSN %d, the log starts at %d (retention deleted it during the check: %v)",
				replication.ErrBehindRetention, a+1, first, err)
		}
		return fmt.Errorf("leader: checking the hello against the log at LSN %d: %w", a, err)
	}
	if !ok {
		return fmt.Errorf("%w: follower's batch ends at LSN %d, no batch of this log does", replication.ErrDiverged, a)
	}
	if ref != hello.LastBatch {
		return fmt.Errorf("%w: follower's batch ending at LSN %d is %v, this log's is %v", replication.ErrDiverged, a, hello.LastBatch, ref)
	}
	return nil
}

// FindBatchEndingAt positions r at lsn and reports the identity of the batch
// ending exactly there (a helper for HelloLog.BatchEndingAt over a WAL);
// ok is false when the batch holding lsn ends elsewhere or the log does not
// hold lsn.
func FindBatchEndingAt(r LogReader, lsn uint64) (ref wal.BatchRef, ok bool, err error) {
	if err := r.Seek(lsn); err != nil {
		return wal.BatchRef{}, false, err
	}
	for {
		h, _, err := r.Next()
		if errors.Is(err, io.EOF) {
			return wal.BatchRef{}, false, nil
		}
		if err != nil {
			return wal.BatchRef{}, false, err
		}
		switch {
		case h.LastLSN() < lsn:
			continue // Seek may land before the batch holding lsn
		case h.LastLSN() == lsn:
			return h.Ref(), true, nil
		default:
			return wal.BatchRef{}, false, nil
		}
	}
}

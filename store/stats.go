package store

import (
	"sync"
	"sync/atomic"
)

// ReceiverStats is a snapshot of a Receiver's counters since it was created.
//
// Every event of every batch that decoded is counted exactly once:
//
//	Events == Applied + DiscardedPosition + DiscardedHWM + DiscardedWindow +
//	          DiscardedInBatch + SkippedClosed + SkippedTooOld + RefusedEvents
//
// so an outsider can check that nothing vanished. The identity holds in every
// snapshot, also while batches are in the pipeline: a batch's events are
// counted together with their outcomes (for a batch that reaches the store,
// when its WAL sync completes, in Pending.Wait).
type ReceiverStats struct {
	Batches          uint64 // batches offered to Apply (including undecodable ones)
	BatchesCommitted uint64 // batches committed to Pebble
	DuplicateBatches uint64 // batches wholly at or below the applied position
	Bytes            uint64 // bytes offered to Apply

	Events            uint64 // events in decodable batches
	Applied           uint64 // events handed to the Applier and committed
	DiscardedPosition uint64 // redelivered: LSN at or below the applied position
	DiscardedHWM      uint64 // SeqNo at or below the session's HWM
	DiscardedWindow   uint64 // idempotency key in the window
	DiscardedInBatch  uint64 // idempotency key seen earlier in the same batch
	SkippedClosed     uint64 // event for a closed session
	SkippedTooOld     uint64 // unknown session, timestamp older than the retention horizon
	RefusedEvents     uint64 // events in batches refused as a whole

	SeqGaps     uint64 // batches refused: SeqNo gap
	OutOfOrder  uint64 // batches refused: ahead of the applied position
	StaleEpochs uint64 // batches refused: stale leader epoch, or history diverged (ErrDiverged)
	WrongShard  uint64 // batches refused: wrong shard
	Corrupt     uint64 // batches refused: failed to decode (checksum, truncation, …)
	ApplyErrors uint64 // batches refused: applier or store failure

	// CommitLatency is the time each committed batch took to commit to
	// Pebble: from handing it over until its WAL sync completed (unless
	// NoSync or the batch changed only the position), which in the pipeline
	// includes the syncs of the batches queued before it on the WAL.
	CommitLatency LatencySnapshot
}

// Discarded is the number of events recognised as already applied.
func (s ReceiverStats) Discarded() uint64 {
	return s.DiscardedPosition + s.DiscardedHWM + s.DiscardedWindow + s.DiscardedInBatch
}

// Accounted is the right-hand side of the accounting identity on ReceiverStats; it
// equals s.Events when every event is accounted for.
func (s ReceiverStats) Accounted() uint64 {
	return s.Applied + s.Discarded() + s.SkippedClosed + s.SkippedTooOld + s.RefusedEvents
}

// Add returns the field-wise sum of s and o (for totals across shards or
// receiver incarnations).
func (s ReceiverStats) Add(o ReceiverStats) ReceiverStats {
	s.Batches += o.Batches
	s.BatchesCommitted += o.BatchesCommitted
	s.DuplicateBatches += o.DuplicateBatches
	s.Bytes += o.Bytes
	s.Events += o.Events
	s.Applied += o.Applied
	s.DiscardedPosition += o.DiscardedPosition
	s.DiscardedHWM += o.DiscardedHWM
	s.DiscardedWindow += o.DiscardedWindow
	s.DiscardedInBatch += o.DiscardedInBatch
	s.SkippedClosed += o.SkippedClosed
	s.SkippedTooOld += o.SkippedTooOld
	s.RefusedEvents += o.RefusedEvents
	s.SeqGaps += o.SeqGaps
	s.OutOfOrder += o.OutOfOrder
	s.StaleEpochs += o.StaleEpochs
	s.WrongShard += o.WrongShard
	s.Corrupt += o.Corrupt
	s.ApplyErrors += o.ApplyErrors
	s.CommitLatency = s.CommitLatency.Add(o.CommitLatency)
	return s
}

type counter = atomic.Uint64

type statsCounters struct {
	// acct makes a batch's event count and its outcomes one step for Stats:
	// whoever adds to events adds the outcomes under it, and Stats reads
	// under it, so every snapshot has Events == Accounted().
	acct                                                            sync.Mutex
	batches, committed, duplicateBatches, bytes                     counter
	events, applied, discardedPosition, discardedHWM                counter
	discardedWindow, discardedInBatch, skippedClosed, skippedTooOld counter
	refusedEvents, seqGaps, outOfOrder, staleEpochs                 counter
	wrongShard, corrupt, applyErrors                                counter
	commitLatency                                                   Latency
}

// batchCounts are one batch's outcomes, published only if it commits.
type batchCounts struct {
	position, hwm, window, inBatch, closed, tooOld int
}

func (s *statsCounters) add(c *batchCounts, applied int) {
	s.applied.Add(uint64(applied))
	s.discardedPosition.Add(uint64(c.position))
	s.discardedHWM.Add(uint64(c.hwm))
	s.discardedWindow.Add(uint64(c.window))
	s.discardedInBatch.Add(uint64(c.inBatch))
	s.skippedClosed.Add(uint64(c.closed))
	s.skippedTooOld.Add(uint64(c.tooOld))
}

// Stats returns a snapshot of the receiver's counters.
func (r *Receiver) Stats() ReceiverStats {
	s := &r.stats
	s.acct.Lock()
	defer s.acct.Unlock()
	return ReceiverStats{
		Batches:           s.batches.Load(),
		BatchesCommitted:  s.committed.Load(),
		DuplicateBatches:  s.duplicateBatches.Load(),
		Bytes:             s.bytes.Load(),
		Events:            s.events.Load(),
		Applied:           s.applied.Load(),
		DiscardedPosition: s.discardedPosition.Load(),
		DiscardedHWM:      s.discardedHWM.Load(),
		DiscardedWindow:   s.discardedWindow.Load(),
		DiscardedInBatch:  s.discardedInBatch.Load(),
		SkippedClosed:     s.skippedClosed.Load(),
		SkippedTooOld:     s.skippedTooOld.Load(),
		RefusedEvents:     s.refusedEvents.Load(),
		SeqGaps:           s.seqGaps.Load(),
		OutOfOrder:        s.outOfOrder.Load(),
		StaleEpochs:       s.staleEpochs.Load(),
		WrongShard:        s.wrongShard.Load(),
		Corrupt:           s.corrupt.Load(),
		ApplyErrors:       s.applyErrors.Load(),
		CommitLatency:     s.commitLatency.Snapshot(),
	}
}

package store

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/wal"
)

// A promise is how a new leader fences the followers of the leader it
// replaces during an automatic failover: the winner of an election at
// epoch E asks each follower to promise E, and each store persists the
// promise and refuses, from then on, every batch of an epoch below it
// (invariant 5). It is kept apart from the committed epoch (keyEpoch):
// raising that would record a new epoch's start at the follower's own
// applied+1 (stageEpoch), while the new leader's history starts where the
// most advanced follower stands — which is what the promises tell it.

// keyPromise holds the highest epoch the store promised (u64, as every
// metadata value); absent: none.
var keyPromise = []byte(keyspace.MetaPromise)

// ErrBadPromise: Promise was given an epoch no leader can have: 0, or one
// above replication.MaxEpoch (then replication.ErrEpochExhausted is
// wrapped too). Nothing was written.
var ErrBadPromise = errors.New("store: bad promise epoch")

// CheckPromiseEpoch refuses an epoch no leader can have, as Promise does
// (ErrBadPromise), for a caller that checks before it touches a store.
func CheckPromiseEpoch(epoch uint64) error {
	if epoch == 0 {
		return fmt.Errorf("%w: epoch 0 is no leader's (epochs start at 1): promise the epoch the fencing leader won its election at", ErrBadPromise)
	}
	if err := replication.CheckEpoch("promised epoch", epoch); err != nil {
		return fmt.Errorf("%w: %w", ErrBadPromise, err)
	}
	return nil
}

// staleBatch is the refusal of a batch of epoch batch by a store whose
// committed epoch is committed and whose promise is promise: nil when the
// batch's epoch is at least both. One text per rule, shared by the
// receiver's decision (gate) and a follower's check before it starts a
// batch (CheckBatchEpoch).
func staleBatch(batch, committed, promise uint64) error {
	switch {
	case batch < committed:
		return fmt.Errorf("%w: batch epoch %d < %d: it comes from a deposed leader; point this follower at the current leader",
			replication.ErrStaleEpoch, batch, committed)
	case batch < promise:
		return fmt.Errorf("%w: batch epoch %d is below epoch %d this store promised: a new leader fenced this store during a failover: "+
			"point this follower at the current leader", replication.ErrStaleEpoch, batch, promise)
	}
	return nil
}

// ReadPromise reads the highest epoch the store in db promised to a
// fencing leader (0: none), e.g. from a stopped store opened read-only.
func ReadPromise(db pebble.Reader) (uint64, error) { return readMetaU64(db, keyPromise) }

// Promise persists, synced, that the receiver's store refuses every batch
// of an epoch below epoch from now on, and returns the store's position
// then: its applied LSN, committed epoch and last batch (as Hello), final
// for every epoch below the promise. A promise at or below the one the
// store holds changes nothing and is no error; its answer is the position
// all the same.
//
// Batches are serialised, not waited for: Promise holds the receiver's
// lock, so no batch is decided or staged meanwhile and every later one is
// decided against the promise. A batch already started (Start, its WAL sync
// in flight, its Pending not yet waited for) is in the store's memtable,
// decided, and cannot be refused any more; it is part of the position
// Promise returns, and the promise's own synced write — behind it in
// Pebble's single WAL — makes it durable before Promise returns (a store
// whose promise is not raised syncs an empty WAL record instead). Waiting
// for the Pendings instead would hang on a caller that waits for them
// after Promise, and refusing them would report a position the store is
// already past. Their acks still go to their leader: they report at most
// what Promise reported.
//
// A failed write fails the store (ErrFailed), as a failed WAL sync of a
// batch does.
func (r *Receiver) Promise(epoch uint64) (replication.Ack, error) {
	if err := CheckPromiseEpoch(epoch); err != nil {
		return replication.Ack{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed != nil {
		return replication.Ack{}, r.failed
	}
	var err error
	if epoch > r.promise.Load() {
		b := r.db.NewBatch()
		if err = b.Set(keyPromise, appendMetaU64(nil, epoch), nil); err != nil {
			_ = b.Close()
			return replication.Ack{}, fmt.Errorf("store: staging the promise of epoch %d: %w", epoch, err)
		}
		if err = commit(b, true); err == nil {
			// A batch whose commit failed may still be in Pebble's commit
			// pipeline: left to it, as stage leaves one.
			_ = b.Close()
		}
	} else {
		err = recoverFatal(func() error { return r.db.LogData(nil, pebble.Sync) })
	}
	if err != nil {
		// The WAL write or sync failed, as a Pending's can: the batches
		// before it in the memtable may not be durable, so the store is
		// failed (invariant 4) and the embedder reopens it.
		r.failed = fmt.Errorf("%w: persisting the promise of epoch %d: %w", ErrFailed, epoch, err)
		return replication.Ack{}, r.failed
	}
	r.promise.Store(max(r.promise.Load(), epoch))
	return replication.Ack{Shard: r.opts.Shard, Epoch: r.epoch, AppliedLSN: r.applied, FollowerID: r.opts.FollowerID, LastBatch: r.last}, nil
}

// Promised returns the highest epoch the store promised (0: none).
func (r *Receiver) Promised() uint64 { return r.promise.Load() }

// CheckBatchEpoch refuses a shipped batch the receiver would refuse for its
// epoch (invariant 5: below the committed epoch or the promise) with the
// same error, from its header alone and without the receiver's lock: a
// follower asks before it takes a batch as its link working, so that a
// deposed leader's link counts as refused. nil for a batch whose header
// does not decode (Start reports that).
func (r *Receiver) CheckBatchEpoch(raw []byte) error {
	h, err := wal.DecodeHeader(raw)
	if err != nil {
		return nil
	}
	return staleBatch(h.Epoch, r.pos.Load().epoch, r.promise.Load())
}

// Promise persists a promise to a fencing leader (Receiver.Promise) and
// returns the store's position then. A closed store answers ErrClosed.
// While Pebble holds the store's writes back (a failing flush: a full
// disk) it does not wait for ever: after a few background errors it
// returns ErrStalled wrapping the disk's error, and the promise completes
// in the background if the disk recovers (Close waits for it).
func (s *Store) Promise(epoch uint64) (replication.Ack, error) {
	if err := CheckPromiseEpoch(epoch); err != nil {
		return replication.Ack{}, err
	}
	release, ok := s.life.Hold()
	if !ok {
		return replication.Ack{}, ErrClosed
	}
	done := make(chan struct{})
	var ack replication.Ack
	var err error // set before done is closed
	go func() {
		defer release()
		ack, err = s.recv.Promise(epoch)
		close(done)
	}()
	if s.events.waitOut(done, nil, nil) {
		return ack, err
	}
	return replication.Ack{}, fmt.Errorf("%w: %s: promising epoch %d: Pebble cannot flush (%d background errors; the promise completes in the background if a retry succeeds): %w",
		ErrStalled, s.dir, epoch, s.events.count.Load(), s.events.lastErr())
}

// Promised returns the highest epoch the store promised to a fencing
// leader (0: none).
func (s *Store) Promised() uint64 { return s.recv.Promised() }

// CheckBatchEpoch is Receiver.CheckBatchEpoch.
func (s *Store) CheckBatchEpoch(raw []byte) error { return s.recv.CheckBatchEpoch(raw) }

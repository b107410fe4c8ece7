package leader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/internal/rawdb"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/wal"
)

// ErrNotShipping: Run or WaitAcked on a leader opened without a Listener.
var ErrNotShipping = errors.New("leader: no Listener: this leader does not ship")

// RetentionStats are one shard's WAL retention figures.
type RetentionStats struct {
	FirstLSN        uint64 // first LSN the WAL still holds
	RetainedBytes   int64  // bytes of the retained segments
	Passes          uint64 // retention passes run
	SegmentsDeleted uint64 // segments deleted by retention
	Errors          uint64 // passes that failed (retried at the next)
	Slots           []SlotStats
	// SnapshotPins is the number of snapshots of the shard's store being
	// served (Leader.Donor); each keeps the log from SnapshotPinLSN (the
	// lowest; 0 with none) until it is ended, superseded by its fetcher's
	// next Begin, or idle for the donor's IdleTimeout.
	SnapshotPins   int
	SnapshotPinLSN uint64
}

// SlotStats is one registered follower's replication slot.
type SlotStats struct {
	ID      string
	Acked   uint64 // the slot's persisted position: retention keeps the WAL from here
	Dropped bool   // released by the retention bound (MaxRetainedBytes)
}

// ShardStats are one shard's figures: the log's extent, shipping per
// follower, retention.
type ShardStats struct {
	Shard   uint32
	Epoch   uint64
	NextLSN uint64
	// WALBatches and WALSyncs count, since the shard opened, the batches
	// written to its WAL and the fdatasyncs that made them durable: fewer
	// syncs than batches is group commit sharing syncs among concurrent
	// appenders.
	WALBatches, WALSyncs uint64
	Shipping             FanoutStats
	Retention            RetentionStats
}

// shipping is one shard's half that ships its log: the Fanout, the slots
// and the retention pass.
type shipping struct {
	fan *Fanout

	mu    sync.Mutex // guards slots, pins and the retention counters; one pass at a time
	slots []slot
	stats RetentionStats
	// pins are the LSNs snapshot donors hold the log from (Leader.Donor),
	// by pin number: retention keeps every LSN from the lowest on.
	pins    map[int]uint64
	nextPin int
}

// helloLog is the shard's log as replication.CheckHello sees it.
type helloLog struct{ s *Shard }

func (h helloLog) Retained() (first, last uint64) {
	w := h.s.log.Writer()
	return w.FirstLSN(), w.NextLSN() - 1
}

func (h helloLog) BatchEndingAt(lsn uint64) (wal.BatchRef, bool, error) {
	r, err := h.s.log.Writer().OpenReader()
	if err != nil {
		return wal.BatchRef{}, false, err
	}
	defer r.Close()
	return FindBatchEndingAt(r, lsn)
}

func (h helloLog) Boundary() EpochBoundary { return h.s.log.Boundary() }

// openShipping creates the shard's Fanout over its listener and loads its
// slots: registered followers without a slot get one at the log's first
// retained LSN - 1 (pinning everything the log holds now), slots of
// followers no longer registered are deleted.
func (l *Leader) openShipping(s *Shard) error {
	so := l.opts.Shipping
	so.WALDir, so.Shard, so.Listener = s.walDir, s.id, l.opts.Listener(s.id)
	so.OpenReader = func() (LogReader, error) { return s.log.Writer().OpenReader() }
	so.Epoch = s.log.Epoch
	so.Notify = s.log.Notify()
	so.DurableLSN = s.log.Writer().DurableLSN
	so.WALTime = s.log.LastEventTime
	so.VerifyHello = func(h replication.Ack) error { return CheckHello(h, helloLog{s}) }
	if so.Logger == nil {
		so.Logger = l.opts.Logger.With("shard", s.id)
	}
	fan, err := NewFanout(&FanoutOptions{ShipperOptions: so, Followers: l.opts.Followers})
	if err != nil {
		return err
	}
	db := rawdb.Of(s.store)
	stored, err := loadSlots(db)
	if err != nil {
		return err
	}
	var keep []slot
	var removed []string
	for _, sl := range stored {
		if slices.Contains(l.opts.Followers, sl.ID) {
			keep = append(keep, sl)
		} else {
			removed = append(removed, sl.ID)
		}
	}
	for _, id := range l.opts.Followers {
		if !slices.ContainsFunc(keep, func(sl slot) bool { return sl.ID == id }) {
			keep = append(keep, slot{ID: id, Acked: s.log.Writer().FirstLSN() - 1})
		}
	}
	if err := saveSlots(db, keep, removed); err != nil {
		return err
	}
	for _, id := range removed {
		l.opts.Logger.Warn("oncewal leader: replication slot removed: follower no longer registered", "shard", s.id, "follower", id)
	}
	s.ship = &shipping{fan: fan, slots: keep}
	return nil
}

// Run ships every shard's log to its registered followers and runs the
// retention passes until ctx ends; it returns after everything it started
// has stopped. A shard whose Fanout stops early (fenced by a newer epoch:
// replication.ErrFenced; its Listener closed) stops only that shard; its
// error, marked with the shard, is part of the joined error Run returns.
func (l *Leader) Run(ctx context.Context) error {
	if l.opts.Listener == nil {
		return ErrNotShipping
	}
	ctx, done, ok := l.life.Enter(ctx)
	if !ok {
		return ErrClosed
	}
	defer done()
	errs := make([]error, len(l.shards))
	var wg sync.WaitGroup
	for i, s := range l.shards {
		wg.Go(func() {
			if err := s.ship.fan.Run(ctx); err != nil {
				errs[i] = fmt.Errorf("shard %d: %w", i, err)
			}
		})
		wg.Go(func() { l.retainLoop(ctx, s) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (l *Leader) retainLoop(ctx context.Context, s *Shard) {
	t := time.NewTicker(l.opts.RetentionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			release, err := l.hold()
			if err != nil {
				return // closed
			}
			err = l.retain(s)
			release()
			if err != nil {
				l.opts.Logger.Error("oncewal leader: retention pass failed (retried)", "shard", s.id, "err", err)
			}
		}
	}
}

// Retain runs one retention pass on every shard now (Run runs them every
// RetentionInterval).
func (l *Leader) Retain() error {
	release, err := l.hold()
	if err != nil {
		return err
	}
	defer release()
	var errs []error
	for _, s := range l.shards {
		if s.ship == nil {
			return ErrNotShipping
		}
		if err := l.retain(s); err != nil {
			errs = append(errs, fmt.Errorf("shard %d: %w", s.id, err))
		}
	}
	return errors.Join(errs...)
}

// retain is one retention pass of shard s: it advances the slots to what
// the followers have acknowledged, makes the local store durable, decides
// (planRetention), persists the slots — the dropped ones included — and only
// then deletes segments.
func (l *Leader) retain(s *Shard) error {
	sh := s.ship
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.stats.Passes++
	err := func() error {
		for i := range sh.slots {
			sl := &sh.slots[i]
			acked, err := sh.fan.AckedLSN(sl.ID)
			if err != nil {
				continue // unregistered meanwhile
			}
			if acked > sl.Acked {
				sl.Acked = acked
				if sl.Dropped && acked >= s.log.Writer().FirstLSN() {
					sl.Dropped = false // caught up before what it needed was deleted
				}
			}
		}
		// The local store commits without fsync (the WAL is synced first);
		// after a crash it re-applies the WAL beyond its durable position,
		// so that position must be durable before the WAL below it goes.
		local, _ := s.log.Position()
		for _, lsn := range sh.pins {
			local = min(local, lsn)
		}
		if err := rawdb.Of(s.store).LogData(nil, pebble.Sync); err != nil {
			return fmt.Errorf("syncing the local store: %w", err)
		}
		w := s.log.Writer()
		p := planRetention(sh.slots, local, w.Segments(), l.opts.MaxRetainedBytes)
		for i := range sh.slots {
			if slices.Contains(p.Drop, sh.slots[i].ID) {
				sh.slots[i].Dropped = true
				l.opts.Logger.Warn("oncewal leader: follower dropped from WAL retention: the log it needs exceeds MaxRetainedBytes; it will be refused (behind retention) once that is deleted, until it is rebuilt",
					"shard", s.id, "follower", sh.slots[i].ID, "acked_lsn", sh.slots[i].Acked, "max_retained_bytes", l.opts.MaxRetainedBytes)
			}
		}
		if err := saveSlots(rawdb.Of(s.store), sh.slots, nil); err != nil {
			return fmt.Errorf("persisting replication slots: %w", err)
		}
		n, err := w.DeleteBelow(p.DeleteBelow)
		sh.stats.SegmentsDeleted += uint64(n)
		return err
	}()
	if err != nil {
		sh.stats.Errors++
	}
	return err
}

// Register adds a follower to every shard: it is served from its next
// connection, counts towards WaitAcked, and gets a replication slot pinning
// everything each shard's log holds now. Registering a registered ID does
// nothing. Registration lasts for this Leader's lifetime; Options.Followers
// is what a restart registers.
func (l *Leader) Register(id string) error {
	release, err := l.hold()
	if err != nil {
		return err
	}
	defer release()
	for _, s := range l.shards {
		if s.ship == nil {
			return ErrNotShipping
		}
		if err := s.ship.fan.Register(id); err != nil {
			return err
		}
		sh := s.ship
		sh.mu.Lock()
		if !slices.ContainsFunc(sh.slots, func(sl slot) bool { return sl.ID == id }) {
			sh.slots = append(sh.slots, slot{ID: id, Acked: s.log.Writer().FirstLSN() - 1})
		}
		err := saveSlots(rawdb.Of(s.store), sh.slots, nil)
		sh.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// Unregister removes a follower from every shard: its stream stops, it no
// longer counts towards WaitAcked, its slot is deleted (it no longer pins the
// WAL) and its next hello is refused (replication.ErrUnknownFollower).
func (l *Leader) Unregister(id string) error {
	release, err := l.hold()
	if err != nil {
		return err
	}
	defer release()
	for _, s := range l.shards {
		if s.ship == nil {
			return ErrNotShipping
		}
		if err := s.ship.fan.Unregister(id); err != nil {
			return err
		}
		sh := s.ship
		sh.mu.Lock()
		sh.slots = slices.DeleteFunc(sh.slots, func(sl slot) bool { return sl.ID == id })
		err := saveSlots(rawdb.Of(s.store), nil, []string{id})
		sh.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// WaitAcked waits until the shard's followers that policy asks for have
// acknowledged every LSN up to and including lsn (AckMajority: a majority
// of the shard's replicas, the leader counted, so (n+1)/2 of n registered
// followers), or ctx ends (ctx's error), or Options.AckTimeout passes
// (ErrAckTimeout, saying how many acknowledged and are connected). Close
// ends the wait with ErrClosed.
func (s *Shard) WaitAcked(ctx context.Context, lsn uint64, policy AckPolicy) error {
	if s.ship == nil {
		return ErrNotShipping
	}
	closing := s.l.life.Context()
	if closing.Err() != nil {
		return ErrClosed
	}
	wait, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(closing, stop)()
	d := s.l.opts.AckTimeout
	if d > 0 {
		wait, stop = context.WithTimeout(wait, d)
		defer stop()
	}
	err := s.ship.fan.waitAcked(wait, lsn, policy)
	switch {
	case err == nil:
		return nil
	case closing.Err() != nil:
		return ErrClosed
	case ctx.Err() != nil:
		return ctx.Err() // the caller's own end, not the bound
	case d > 0 && errors.Is(err, context.DeadlineExceeded):
		return s.ackTimeout(lsn, policy, d)
	}
	return err
}

// WaitAcked waits until, on every shard, the followers policy asks for have
// acknowledged everything appended before the call, or ctx ends.
func (l *Leader) WaitAcked(ctx context.Context, policy AckPolicy) error {
	for _, s := range l.shards {
		if err := s.WaitAcked(ctx, s.NextLSN()-1, policy); err != nil {
			return fmt.Errorf("shard %d: %w", s.id, err)
		}
	}
	return nil
}

// Stats returns the shard's figures.
func (s *Shard) Stats() ShardStats {
	w := s.log.Writer()
	st := ShardStats{Shard: s.id, Epoch: s.log.Epoch(), NextLSN: w.NextLSN()}
	if s.ship != nil {
		st.Shipping = s.ship.fan.Stats()
		s.ship.mu.Lock()
		st.Retention = s.ship.stats
		for _, sl := range s.ship.slots {
			st.Retention.Slots = append(st.Retention.Slots, SlotStats(sl))
		}
		st.Retention.SnapshotPins = len(s.ship.pins)
		for _, lsn := range s.ship.pins {
			if st.Retention.SnapshotPinLSN == 0 || lsn < st.Retention.SnapshotPinLSN {
				st.Retention.SnapshotPinLSN = lsn
			}
		}
		s.ship.mu.Unlock()
	}
	st.Retention.FirstLSN, st.Retention.RetainedBytes = w.FirstLSN(), w.RetainedBytes()
	st.WALBatches, st.WALSyncs = w.Batches(), w.Syncs()
	return st
}

// Stats returns every shard's figures, indexed by shard.
func (l *Leader) Stats() []ShardStats {
	out := make([]ShardStats, len(l.shards))
	for i, s := range l.shards {
		out[i] = s.Stats()
	}
	return out
}

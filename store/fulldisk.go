package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/oncewal/oncewal/internal/ctxtime"
	"github.com/oncewal/oncewal/internal/diskguard"
)

// ErrStalled: Pebble holds the store's writes and the follower stopped
// waiting for them. While its flushes fail (a full disk, I/O errors) Pebble
// retries them for ever, and a commit that needs room in the memtables, a
// Flush and Close all wait for the failing flush, with no deadline. Close
// returns this error (wrapping the disk's) instead of waiting: the store
// closes itself in the background if the disk recovers, else it stays open
// until the process exits. Nothing acknowledged is lost either way — every
// acked batch is in Pebble's WAL, and an abandoned store is recovered at the
// next Open like a crashed one.
var ErrStalled = errors.New("store: store writes stalled")

// stallGuard keeps a follower responsive while Pebble stalls its writes.
// serveConn starts each batch on its own goroutine (start) and stops
// waiting for it when its ctx ends; the abandoned Start goes on in the
// background, is waited for in order once Pebble lets it through, and holds
// back every later Start (and the close) until then.
type stallGuard struct {
	mu        sync.Mutex
	abandoned chan struct{} // closed when the abandoned Start has returned and been waited for; nil: none
}

// stallPoll is how often start, once its ctx ended, looks again whether the
// store is stalled.
const stallPoll = 50 * time.Millisecond

// StartContext runs Start(batch) on its own goroutine and returns its
// Pending; or, when ctx ends first while Pebble stalls the store's writes
// and its background work fails, nil and the channel the abandoned
// Start's Pending will come on. The caller must then call finishAbandoned
// with it once every earlier Pending of the pipeline has been waited for
// (Pending.Wait's order), which it cannot do at once: an earlier Pending's
// Wait needs the receiver, which the stuck Start holds.
func (s *Store) StartContext(ctx context.Context, batch []byte) (*Pending, <-chan *Pending) {
	done := make(chan *Pending, 1)
	go func() { done <- s.recv.Start(batch) }()
	select {
	case p := <-done:
		return p, nil
	case <-ctx.Done():
	}
	// Only a stalled store is given up on: Serve's callers rely on nothing
	// being applied after it returned (a promotion reads final positions).
	for !s.events.stalled.Load() || !s.events.failing() {
		select {
		case p := <-done:
			return p, nil
		case <-time.After(stallPoll):
		}
	}
	select {
	case p := <-done: // it returned meanwhile
		return p, nil
	default:
	}
	s.opts.Logger.Error("oncewal store: stopped waiting for a commit Pebble holds back (its flushes fail: disk full?); it completes in the background if the disk recovers",
		"err", s.events.lastErr())
	s.stall.mu.Lock()
	s.stall.abandoned = make(chan struct{})
	s.stall.mu.Unlock()
	return nil, done
}

// FinishAbandoned waits for the abandoned Start and its Pending, so the
// receiver's memory follows its store, and releases the Starts and the close
// held back meanwhile.
func (s *Store) FinishAbandoned(done <-chan *Pending) {
	_, _ = (<-done).Wait()
	s.stall.mu.Lock()
	close(s.stall.abandoned)
	s.stall.abandoned = nil
	s.stall.mu.Unlock()
}

// WaitStalled waits until no abandoned Start is in flight, or ctx ends
// (false).
func (s *Store) WaitStalled(ctx context.Context) bool {
	s.stall.mu.Lock()
	ch := s.stall.abandoned
	s.stall.mu.Unlock()
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// closeStore flushes (with flush) and closes the Pebble store on its own
// goroutine, after any abandoned Start, and waits for it as an open is
// waited for (storeEvents.waitOut): after openGiveUp background errors it
// returns ErrStalled and the close goes on in the background.
func (s *Store) closeStore(flush bool) error {
	done := make(chan struct{})
	var err error // set before done is closed
	s.stall.mu.Lock()
	abandoned := s.stall.abandoned
	s.stall.mu.Unlock()
	go func() {
		if abandoned != nil {
			<-abandoned
		}
		var errs []error
		if flush && s.flushOnClose() {
			if err := guard(s.db.Flush); err != nil {
				errs = append(errs, err)
			}
		}
		if err := guard(s.db.Close); err != nil {
			errs = append(errs, err)
		}
		err = errors.Join(errs...)
		close(done)
	}()
	if s.events.waitOut(done, nil, nil) {
		return err
	}
	return fmt.Errorf("%w: %s: Pebble cannot flush (%d background errors; the store closes itself if a retry succeeds, else at process exit; acknowledged batches are durable): %w",
		ErrStalled, s.dir, s.events.count.Load(), s.events.lastErr())
}

// flushOnClose reports whether Close should flush the memtable, so that the
// next Open replays no WAL. The flush is only that optimisation, and on a
// full disk it can crash the process: it rotates Pebble's WAL, and when
// closing the old WAL fails Pebble panics with its mutex released, which the
// runtime turns into a fatal error nothing can recover ("sync: unlock of
// unlocked mutex"; found by TestRealProcessesFullDisk). So Close skips it
// after any background error, and with less free space than twice the
// memtable plus 1 MiB (a filesystem that cannot tell: it flushes).
func (s *Store) flushOnClose() bool {
	if s.events.count.Load() > 0 {
		return false
	}
	u, err := s.opts.FS.GetDiskUsage(s.dir)
	if err != nil {
		return true
	}
	return u.AvailBytes >= 2*s.db.Metrics().MemTable.Size+1<<20
}

// checkDisk is the MinFreeBytes guard: nil, or replication.ErrDiskFull
// (wrapped). The first refusal of a full-disk episode is logged at Error,
// the return of room at Info.
func (s *Store) checkDisk() error {
	err := s.disk.Check()
	if was := s.full.Swap(err != nil); was != (err != nil) {
		if err != nil {
			s.opts.Logger.Error("oncewal store: not applying: the disk is nearly full; waiting for room", "err", err)
		} else {
			s.opts.Logger.Info("oncewal store: the disk has room again; applying")
		}
	}
	return err
}

// WaitForRoom waits until the disk guard lets a batch through, or ctx ends
// (false).
func (s *Store) WaitForRoom(ctx context.Context) bool {
	for s.checkDisk() != nil {
		if ctxtime.Sleep(ctx, diskguard.Interval) != nil {
			return false
		}
	}
	return true
}

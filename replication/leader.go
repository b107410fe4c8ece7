package replication

// Leader (notes for doc.go)
//
// A sharded leader is n independent single-shard pipelines that share a
// directory and a ShardRouter: shard s has its own wal.Writer (segments
// wal.SegmentName(s, …), so every shard's log lives in the same directory
// without clashing), its own LSN sequence starting at 1, and its own Shipper
// on its own Listener. Nothing is shared between shards at run time — no
// lock, no goroutine, no connection — so a shard whose follower is slow,
// down or fenced does not hold up the others.
//
// The embedder routes each session's events to Router().Shard(id) and
// appends them with Append(shard, …); Split does that for a mixed batch.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/oncewal/oncewal/wal"
)

// ErrBadLeaderOptions: OpenLeader was given unusable options.
var ErrBadLeaderOptions = errors.New("replication: bad leader options")

// ErrNoSuchShard: a shard number outside the deployment's 0..Shards-1.
var ErrNoSuchShard = errors.New("replication: no such shard")

// LeaderOptions configures a Leader.
type LeaderOptions struct {
	// Dir holds every shard's WAL segments. Required.
	Dir string
	// Shards is the deployment's fixed shard count (see ShardRouter).
	// Required, 1..MaxShards.
	Shards int
	// Epoch is this leader's epoch, stamped on every batch and used for
	// fencing. Default 1.
	Epoch uint64
	// Listener returns the listener the follower of shard connects to.
	// Required. It is called once per shard by OpenLeader.
	Listener func(shard uint32) Listener
	// Writer is the template for every shard's wal.WriterOptions (Shard is
	// set per shard). Default: the wal defaults (sync every batch).
	Writer wal.WriterOptions
	// Shipper is the template for every shard's ShipperOptions; WALDir,
	// Shard, Listener, Epoch, Notify and DurableLSN (the shard writer's, so
	// only synced batches are shipped) are set per shard, the rest
	// (MaxInFlight, timeouts, Logger, …) is copied. Default: the Shipper
	// defaults.
	Shipper ShipperOptions
}

// Leader owns one WAL writer and one Shipper per shard of a deployment.
// Append is safe for concurrent use (per shard it serialises, across shards
// it runs in parallel).
type Leader struct {
	router ShardRouter
	epoch  uint64
	shards []*leaderShard

	closeOnce sync.Once
	closeErr  error
}

type leaderShard struct {
	w      *wal.Writer
	ship   *Shipper
	notify chan struct{}
}

// OpenLeader opens (recovering) every shard's WAL in opts.Dir and creates
// its Shipper. Call Run to ship and Close when done.
func OpenLeader(opts LeaderOptions) (*Leader, error) {
	var errs []error
	if opts.Dir == "" {
		errs = append(errs, errors.New("Dir is required"))
	}
	if opts.Listener == nil {
		errs = append(errs, errors.New("Listener is required"))
	}
	router, err := NewShardRouter(opts.Shards)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrBadLeaderOptions, errors.Join(errs...))
	}
	if opts.Epoch == 0 {
		opts.Epoch = 1
	}
	l := &Leader{router: router, epoch: opts.Epoch}
	for s := range uint32(opts.Shards) {
		wo := opts.Writer
		wo.Shard = s
		w, err := wal.OpenWriter(opts.Dir, &wo)
		if err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("replication: leader shard %d: %w", s, err)
		}
		sh := &leaderShard{w: w, notify: make(chan struct{}, 1)}
		l.shards = append(l.shards, sh)
		so := opts.Shipper
		so.WALDir, so.Shard, so.Notify, so.OpenReader = opts.Dir, s, sh.notify, nil
		so.Listener = opts.Listener(s)
		so.Epoch = func() uint64 { return opts.Epoch }
		so.DurableLSN = w.DurableLSN
		if sh.ship, err = NewShipper(so); err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("replication: leader shard %d: %w", s, err)
		}
	}
	return l, nil
}

// Router is the deployment's router.
func (l *Leader) Router() ShardRouter { return l.router }

// Epoch is the leader's epoch.
func (l *Leader) Epoch() uint64 { return l.epoch }

func (l *Leader) shard(s uint32) (*leaderShard, error) {
	if int(s) >= len(l.shards) {
		return nil, fmt.Errorf("%w: %d (deployment has %d)", ErrNoSuchShard, s, len(l.shards))
	}
	return l.shards[s], nil
}

// Append logs events as one batch of shard and wakes its Shipper. Every
// event must belong to a session routed to shard (the caller's contract;
// Split groups a mixed batch).
func (l *Leader) Append(shard uint32, events []wal.Event) (wal.Header, error) {
	sh, err := l.shard(shard)
	if err != nil {
		return wal.Header{}, err
	}
	h, err := sh.w.Append(l.epoch, events)
	if err != nil {
		return h, err
	}
	select {
	case sh.notify <- struct{}{}:
	default:
	}
	return h, nil
}

// Split groups events by their session's shard, keeping their order within
// each shard: out[s] holds shard s's events. It reuses out's slices.
func (r ShardRouter) Split(events []wal.Event, out [][]wal.Event) [][]wal.Event {
	n := max(r.Shards(), 1)
	if cap(out) < n {
		out = make([][]wal.Event, n)
	}
	out = out[:n]
	for i := range out {
		out[i] = out[i][:0]
	}
	for _, ev := range events {
		s := r.Shard(ev.Session)
		out[s] = append(out[s], ev)
	}
	return out
}

// Writer returns shard's WAL writer (for Sync, NextLSN, DurableLSN).
func (l *Leader) Writer(shard uint32) (*wal.Writer, error) {
	sh, err := l.shard(shard)
	if err != nil {
		return nil, err
	}
	return sh.w, nil
}

// Shipper returns shard's Shipper (for Stats, AckedLSN, WaitAcked).
func (l *Leader) Shipper(shard uint32) (*Shipper, error) {
	sh, err := l.shard(shard)
	if err != nil {
		return nil, err
	}
	return sh.ship, nil
}

// WaitAcked waits until every shard's follower has acknowledged everything
// appended to that shard before the call, or ctx ends.
func (l *Leader) WaitAcked(ctx context.Context) error {
	for _, sh := range l.shards {
		if err := sh.ship.WaitAcked(ctx, sh.w.NextLSN()-1); err != nil {
			return err
		}
	}
	return nil
}

// Stats returns every shard's Shipper counters, indexed by shard.
func (l *Leader) Stats() []ShipperStats {
	out := make([]ShipperStats, len(l.shards))
	for i, sh := range l.shards {
		out[i] = sh.ship.Stats()
	}
	return out
}

// Run runs every shard's Shipper concurrently until ctx ends, and returns
// after all of them stopped. A Shipper that stops early (ErrFenced, its
// Listener closed) stops only its shard; its error, marked with the shard,
// is part of the joined error Run returns.
func (l *Leader) Run(ctx context.Context) error {
	errs := make([]error, len(l.shards))
	var wg sync.WaitGroup
	for i, sh := range l.shards {
		wg.Go(func() {
			if err := sh.ship.Run(ctx); err != nil {
				errs[i] = fmt.Errorf("shard %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close closes every shard's WAL writer (syncing it). Stop Run first.
// Close is idempotent.
func (l *Leader) Close() error {
	l.closeOnce.Do(func() {
		var errs []error
		for i, sh := range l.shards {
			if sh.w != nil {
				if err := sh.w.Close(); err != nil {
					errs = append(errs, fmt.Errorf("shard %d: %w", i, err))
				}
			}
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

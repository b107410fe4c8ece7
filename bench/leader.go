package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Leader benchmarks (issue 11): what the leader pays per event as its
// follower count grows, and what a client sees when every batch waits for a
// quorum. A leader on disk (one shard; WAL synced per batch, its own store
// applied) stamps 1000-event batches of puts (24-byte keys, 100-byte values,
// 10,000 sessions) through Shard.Append and ships them over the in-process
// transport.

const (
	leaderBatch    = 1000
	leaderSessions = 10_000
)

type leaderRig struct {
	dir  string
	l    *leader.Leader
	tr   *inprocess.Transport
	stop func()
	ids  []session.ID
	rng  *rand.Rand
	evs  []wal.Event
	val  []byte
}

func quietSlog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func openLeaderRig(followers int) (*leaderRig, error) {
	dir, err := os.MkdirTemp("", "oncewal-bench-leader-")
	if err != nil {
		return nil, err
	}
	r := &leaderRig{dir: dir, tr: inprocess.New(inprocess.FaultsNone, 1),
		rng: rand.New(rand.NewPCG(1, 2)), val: make([]byte, 100)}
	ids := make([]string, followers)
	for i := range ids {
		ids[i] = fmt.Sprintf("f%d", i+1)
	}
	r.l, err = leader.Open(dir, &leader.Options{Shards: 1, Followers: ids, Logger: quietSlog(),
		Store:    store.Options{Logger: quietSlog()},
		Listener: func(uint32) replication.Listener { return r.tr },
		Shipping: leader.ShipperOptions{MaxInFlight: 64},
		// The client appends without waiting and waits for the last batch
		// only, which may be seconds behind: the benchmarks bound their
		// own waits.
		AckTimeout: -1})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	for range leaderSessions {
		var id session.ID
		binary.LittleEndian.PutUint64(id[:8], r.rng.Uint64())
		binary.LittleEndian.PutUint64(id[8:], r.rng.Uint64())
		r.ids = append(r.ids, id)
	}
	r.evs = make([]wal.Event, leaderBatch)
	return r, nil
}

func (r *leaderRig) close() {
	if r.stop != nil {
		r.stop()
	}
	_ = r.l.Close()
	_ = r.tr.Close()
	_ = os.RemoveAll(r.dir)
}

// batch fills the next batch of puts.
func (r *leaderRig) batch() []wal.Event {
	for i := range r.evs {
		var key [24]byte
		binary.LittleEndian.PutUint64(key[:], r.rng.Uint64())
		r.evs[i] = wal.Event{Op: wal.OpPut, Session: r.ids[r.rng.IntN(len(r.ids))], Key: key[:], Value: r.val}
	}
	return r.evs
}

// nullFollower acknowledges every batch it receives without applying it:
// the leader's cost of one more follower, without a follower's.
func nullFollower(ctx context.Context, d replication.Dialer, id string) {
	ackLoop(ctx, d, func() replication.Ack { return replication.Ack{FollowerID: id} },
		func(raw []byte) (replication.Ack, error) {
			h, err := wal.DecodeHeader(raw)
			return replication.Ack{Epoch: h.Epoch, AppliedLSN: h.LastLSN()}, err
		})
}

// LeaderShip measures the leader with n followers that acknowledge without
// applying: events/s and the process CPU per event (nearly all of it the
// leader's: stamping, WAL append and sync, its own store, shipping n
// streams). Every batch is appended without waiting; the run ends when all
// followers acknowledged the last one.
func LeaderShip(n int) func(*testing.B) {
	return func(b *testing.B) {
		r, err := openLeaderRig(n)
		if err != nil {
			b.Fatal(err)
		}
		defer r.close()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { _ = r.l.Run(ctx) })
		for i := range n {
			wg.Go(func() { nullFollower(ctx, r.tr, fmt.Sprintf("f%d", i+1)) })
		}
		r.stop = func() { cancel(); _ = r.tr.Close(); wg.Wait() }
		sh, _ := r.l.Shard(0)
		cpu0 := cpuNanos()
		b.ResetTimer()
		var last uint64
		for range b.N {
			h, err := sh.Append(r.batch()...)
			if err != nil {
				b.Fatal(err)
			}
			last = h.LastLSN()
		}
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		defer wcancel()
		if err := sh.WaitAcked(wctx, last, leader.AckAll); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		events := float64(b.N * leaderBatch)
		b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(cpuNanos()-cpu0)/events, "cpu-ns/event")
	}
}

// LeaderQuorum measures a client that waits, after every batch, until a
// majority of n real followers (on disk, each batch synced) acknowledged it:
// synchronous replication's throughput, events/s.
func LeaderQuorum(n int) func(*testing.B) {
	return func(b *testing.B) {
		r, err := openLeaderRig(n)
		if err != nil {
			b.Fatal(err)
		}
		defer r.close()
		ctx := r.serve(b, n)
		sh, _ := r.l.Shard(0)
		cpu0 := cpuNanos()
		b.ResetTimer()
		for range b.N {
			h, err := sh.Append(r.batch()...)
			if err != nil {
				b.Fatal(err)
			}
			if err := sh.WaitAcked(ctx, h.LastLSN(), leader.AckMajority); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		events := float64(b.N * leaderBatch)
		b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(cpuNanos()-cpu0)/events, "cpu-ns/event")
	}
}

// serve runs the leader and n real followers (on disk, each batch synced)
// until r.close, and returns the context they run under.
func (r *leaderRig) serve(b *testing.B, n int) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.l.Run(ctx) })
	var fs []*follower.Follower
	r.stop = func() {
		cancel()
		_ = r.tr.Close()
		wg.Wait()
		for _, f := range fs {
			_ = f.Close()
		}
	}
	for i := range n {
		f, err := follower.Open(fmt.Sprintf("%s/follower-%d", r.dir, i+1),
			&follower.Options{Store: store.Options{ID: fmt.Sprintf("f%d", i+1), Logger: quietSlog()}})
		if err != nil {
			b.Fatal(err)
		}
		fs = append(fs, f)
		wg.Go(func() { _ = f.Serve(ctx, r.tr) })
	}
	return ctx
}

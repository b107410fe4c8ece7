package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/ctxtime"
	"github.com/oncewal/oncewal/internal/diskguard"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// genConfig is the generated client workload of oncewal leader --generate.
type genConfig struct {
	rate, sessions, batch int
	retryRate             float64
	ack                   replication.AckPolicy // 0: do not wait
}

// genShardStats count one shard's generated events.
type genShardStats struct {
	generated uint64 // events logged (retries included)
	retried   uint64 // of them, requests sent again with the same client key
	acked     uint64 // events whose batch the --ack policy acknowledged
	expired   uint64 // events refused because their session had expired or closed
}

// generator is a synthetic client population. Everything it logs goes
// through Leader.Append — the leader stamps SeqNo, time and (for session
// opens) the key — and every request carries a client key
// (idempotency.ClientKey of its request ID), so a request sent again after
// a "lost answer" is the same request to the followers' windows.
type generator struct {
	l      *leader.Leader
	c      genConfig
	logger *slog.Logger
	rng    *mrand.Rand
	runID  string // request IDs are unique to this run of the generator

	ids    []session.ID
	reqs   uint64                   // requests made
	opens  []wal.Event              // sessions to open before the next requests
	retry  map[idempotency.Key]bool // requests whose answer the client will "lose"
	again  []wal.Event
	groups [][]wal.Event

	mu  sync.Mutex
	per []genShardStats
}

func newGenerator(l *leader.Leader, c genConfig, log *slog.Logger) *generator {
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	return &generator{
		l: l, c: c, logger: log,
		rng:   mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 0)),
		runID: fmt.Sprintf("%x", seed),
		ids:   make([]session.ID, c.sessions),
		retry: map[idempotency.Key]bool{},
		per:   make([]genShardStats, l.Shards()),
	}
}

func (g *generator) stats(shard uint32) genShardStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.per[shard]
}

func (g *generator) count(shard int, fn func(*genShardStats)) {
	g.mu.Lock()
	fn(&g.per[shard])
	g.mu.Unlock()
}

// run opens the sessions and then sends requests at the configured rate
// until ctx ends (nil) or the leader fails (the error).
func (g *generator) run(ctx context.Context) error {
	for i := range g.ids {
		g.openSession(i)
	}
	const tick = 10 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start, done := time.Now(), uint64(0)
	var evs []wal.Event
	for {
		evs = append(evs[:0], g.opens...)
		g.opens = g.opens[:0]
		due := uint64(time.Since(start).Seconds() * float64(g.c.rate))
		for ; done < due; done++ {
			ev := g.request(done)
			evs = append(evs, ev)
			if g.rng.Float64() < g.c.retryRate {
				g.retry[ev.IdemKey] = true
			}
		}
		if err := g.send(ctx, evs); err != nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// openSession gives slot i a new session, opened before its next request.
func (g *generator) openSession(i int) {
	g.ids[i] = session.NewID()
	g.opens = append(g.opens, wal.Event{Op: wal.OpOpen, Session: g.ids[i]})
}

// request is the n-th request: an operation of a session, with the client
// key of a request ID unique to this run.
func (g *generator) request(n uint64) wal.Event {
	id := g.ids[n%uint64(len(g.ids))]
	g.reqs++
	ev := wal.Event{Session: id, HasIdemKey: true,
		IdemKey: idempotency.ClientKey(fmt.Appendf(nil, "oncewal-generate-%s-%d", g.runID, g.reqs))}
	key := fmt.Appendf(nil, "k%d", n%16)
	switch n % 10 {
	case 0:
		ev.Op, ev.Key = wal.OpDelete, key
	case 1, 2, 3:
		ev.Op, ev.Key, ev.Delta = wal.OpAdd, []byte("counter"), 1
	default:
		ev.Op, ev.Key, ev.Value = wal.OpPut, key, fmt.Appendf(nil, "v%d", n)
	}
	return ev
}

// send logs evs batched per shard through Leader.Append, and waits for the
// --ack policy after each batch. The requests of a batch whose answer the
// client "loses" are sent again, with the same client keys, as a batch of
// their own right after it. A batch refused because a session expired or
// closed logged nothing: its sessions are replaced (the client opens new
// ones) and its requests dropped, as a client told its session is gone
// would.
func (g *generator) send(ctx context.Context, evs []wal.Event) error {
	g.groups = g.l.Split(evs, g.groups)
	for s, shardEvs := range g.groups {
		for len(shardEvs) > 0 {
			chunk := shardEvs[:min(len(shardEvs), g.c.batch)]
			shardEvs = shardEvs[len(chunk):]
			g.again = g.again[:0]
			for _, ev := range chunk {
				if ev.HasIdemKey && g.retry[ev.IdemKey] {
					delete(g.retry, ev.IdemKey)
					g.again = append(g.again, ev)
				}
			}
			logged, err := g.log(ctx, s, chunk, false)
			if err == nil && logged && len(g.again) > 0 {
				_, err = g.log(ctx, s, g.again, true)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// log appends one batch of shard s (retried: every event is a request
// sent again) and waits for the --ack policy. logged is false when the
// batch was refused for an expired or closed session: the client's to
// handle (replace), the batch is dropped.
func (g *generator) log(ctx context.Context, s int, b []wal.Event, retried bool) (logged bool, err error) {
	h, err := g.l.Append(b...)
	if errors.Is(err, replication.ErrDiskFull) {
		// Nothing was logged: wait for room and send the batch again, as
		// a client told the leader is out of disk would.
		g.logger.Error("oncewal leader: generator: the disk is nearly full; retrying until there is room", "shard", s, "err", err)
		for errors.Is(err, replication.ErrDiskFull) {
			if ctxtime.Sleep(ctx, diskguard.Interval) != nil {
				return false, nil
			}
			h, err = g.l.Append(b...)
		}
		if err == nil {
			g.logger.Info("oncewal leader: generator: the disk has room again", "shard", s)
		}
	}
	if errors.Is(err, replication.ErrSessionExpired) || errors.Is(err, session.ErrSessionClosed) {
		g.replace(b)
		g.count(s, func(st *genShardStats) { st.expired += uint64(len(b)) })
		return false, nil
	}
	if err != nil {
		return false, err
	}
	g.count(s, func(st *genShardStats) {
		st.generated += uint64(len(b))
		if retried {
			st.retried += uint64(len(b))
		}
	})
	if g.c.ack == 0 {
		return true, nil
	}
	sh, err := g.l.Shard(uint32(s))
	if err != nil {
		return true, err
	}
	if err := sh.WaitAcked(ctx, h.LastLSN(), g.c.ack); err != nil {
		if ctx.Err() != nil {
			return true, nil
		}
		return true, err
	}
	g.count(s, func(st *genShardStats) { st.acked += uint64(len(b)) })
	return true, nil
}

// replace gives every slot whose session appears in evs a new session.
func (g *generator) replace(evs []wal.Event) {
	gone := map[session.ID]bool{}
	for _, ev := range evs {
		gone[ev.Session] = true
	}
	for i, id := range g.ids {
		if gone[id] {
			g.openSession(i)
		}
	}
}

package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/ctxtime"
	"github.com/oncewal/oncewal/internal/diskguard"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// genConfig is the generated client workload of oncewal leader --generate.
type genConfig struct {
	rate, sessions, batch int
	clients               int // concurrent clients (0 counts as 1)
	retryRate             float64
	ack                   leader.AckPolicy // 0: do not wait
	// ackLog, if not nil, receives the client key (16 bytes) of every
	// request whose batch was acknowledged (logged, and the ack policy
	// met), one write per batch: what a client was told is done, for a
	// test to check against the WAL after kill -9.
	ackLog io.Writer
}

// genShardStats count one shard's generated events.
type genShardStats struct {
	generated uint64 // events logged (retries included)
	retried   uint64 // of them, requests sent again with the same client key
	acked     uint64 // events whose batch the --ack policy acknowledged
	expired   uint64 // events refused because their session had expired or closed
}

// generator is a synthetic client population of c.clients clients, each
// appending from its own goroutine, so that appenders of one shard share
// the WAL's sync (group commit). Everything it logs goes through
// Leader.Append — the leader stamps SeqNo, time and (for session opens)
// the key — and every request carries a client key (idempotency.ClientKey
// of its request ID), so a request sent again after a "lost answer" is the
// same request to the followers' windows. The sessions are partitioned
// among the clients: a session's requests come from one client, in order.
type generator struct {
	l      *leader.Leader
	c      genConfig
	logger *slog.Logger
	runID  string // request IDs are unique to this run of the generator

	clients []*genClient

	mu  sync.Mutex
	per []genShardStats

	ackMu  sync.Mutex
	ackBuf []byte
}

// genClient is one client of the generator: its own sessions, requests
// and retries. Only its goroutine touches it.
type genClient struct {
	g      *generator
	n      int     // the client's index
	rate   float64 // its share of --generate, events/s
	rng    *mrand.Rand
	ids    []session.ID
	reqs   uint64                   // requests made
	opens  []wal.Event              // sessions to open before the next requests
	retry  map[idempotency.Key]bool // requests whose answer the client will "lose"
	again  []wal.Event
	groups [][]wal.Event
}

func newGenerator(l *leader.Leader, c genConfig, log *slog.Logger) *generator {
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	c.clients = max(c.clients, 1)
	g := &generator{
		l: l, c: c, logger: log,
		runID: fmt.Sprintf("%x", seed),
		per:   make([]genShardStats, l.Shards()),
	}
	now := uint64(time.Now().UnixNano())
	for i := range c.clients {
		n := sessionShare(c.sessions, c.clients, i)
		g.clients = append(g.clients, &genClient{
			g: g, n: i, rate: float64(c.rate) / float64(c.clients),
			rng:   mrand.New(mrand.NewPCG(now, uint64(i))),
			ids:   make([]session.ID, n),
			retry: map[idempotency.Key]bool{},
		})
	}
	return g
}

// sessionShare is how many of the sessions client i of clients has:
// sessions/clients, one more for the first sessions%clients, and at least
// one (the CLI refuses --clients above --sessions).
func sessionShare(sessions, clients, i int) int {
	n := sessions / clients
	if i < sessions%clients {
		n++
	}
	return max(n, 1)
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

// run runs every client until ctx ends (nil) or the leader fails (the
// first client's error; the others are then stopped).
func (g *generator) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for _, c := range g.clients {
		wg.Go(func() {
			if err := c.run(ctx); err != nil {
				once.Do(func() { first = err })
				cancel()
			}
		})
	}
	wg.Wait()
	return first
}

// run opens the client's sessions and then sends requests at its share of
// the configured rate until ctx ends (nil) or the leader fails (the error).
func (c *genClient) run(ctx context.Context) error {
	for i := range c.ids {
		c.openSession(i)
	}
	const tick = 10 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start, done := time.Now(), uint64(0)
	var evs []wal.Event
	for {
		evs = append(evs[:0], c.opens...)
		c.opens = c.opens[:0]
		due := uint64(time.Since(start).Seconds() * c.rate)
		for ; done < due; done++ {
			ev := c.request(done)
			evs = append(evs, ev)
			if c.rng.Float64() < c.g.c.retryRate {
				c.retry[ev.IdemKey] = true
			}
		}
		if err := c.send(ctx, evs); err != nil || ctx.Err() != nil {
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
func (c *genClient) openSession(i int) {
	c.ids[i] = session.NewID()
	c.opens = append(c.opens, wal.Event{Op: wal.OpOpen, Session: c.ids[i]})
}

// request is the client's n-th request: an operation of one of its
// sessions, with the client key of a request ID unique to this run and
// client.
func (c *genClient) request(n uint64) wal.Event {
	id := c.ids[n%uint64(len(c.ids))]
	c.reqs++
	ev := wal.Event{Session: id, HasIdemKey: true,
		IdemKey: idempotency.ClientKey(fmt.Appendf(nil, "oncewal-generate-%s-%d-%d", c.g.runID, c.n, c.reqs))}
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
func (c *genClient) send(ctx context.Context, evs []wal.Event) error {
	c.groups = c.g.l.Split(evs, c.groups)
	for s, shardEvs := range c.groups {
		for len(shardEvs) > 0 {
			chunk := shardEvs[:min(len(shardEvs), c.g.c.batch)]
			shardEvs = shardEvs[len(chunk):]
			c.again = c.again[:0]
			for _, ev := range chunk {
				if ev.HasIdemKey && c.retry[ev.IdemKey] {
					delete(c.retry, ev.IdemKey)
					c.again = append(c.again, ev)
				}
			}
			logged, err := c.log(ctx, s, chunk, false)
			if err == nil && logged && len(c.again) > 0 {
				_, err = c.log(ctx, s, c.again, true)
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
func (c *genClient) log(ctx context.Context, s int, b []wal.Event, retried bool) (logged bool, err error) {
	h, err := c.g.l.Append(b...)
	if errors.Is(err, store.ErrDiskFull) {
		// Nothing was logged: wait for room and send the batch again, as
		// a client told the leader is out of disk would.
		c.g.logger.Error("oncewal leader: generator: the disk is nearly full; retrying until there is room", "shard", s, "err", err)
		for errors.Is(err, store.ErrDiskFull) {
			if ctxtime.Sleep(ctx, diskguard.Interval) != nil {
				return false, nil
			}
			h, err = c.g.l.Append(b...)
		}
		if err == nil {
			c.g.logger.Info("oncewal leader: generator: the disk has room again", "shard", s)
		}
	}
	if errors.Is(err, leader.ErrSessionExpired) || errors.Is(err, session.ErrSessionClosed) {
		c.replace(b)
		c.g.count(s, func(st *genShardStats) { st.expired += uint64(len(b)) })
		return false, nil
	}
	if err != nil {
		return false, err
	}
	c.g.count(s, func(st *genShardStats) {
		st.generated += uint64(len(b))
		if retried {
			st.retried += uint64(len(b))
		}
	})
	if c.g.c.ack == 0 {
		return true, c.g.acked(b)
	}
	sh, err := c.g.l.Shard(uint32(s))
	if err != nil {
		return true, err
	}
	err = sh.WaitAcked(ctx, h.LastLSN(), c.g.c.ack)
	for errors.Is(err, leader.ErrAckTimeout) {
		// A client retries; this one waits on, as it did before waits
		// were bounded (the stats lines show which follower lags).
		err = sh.WaitAcked(ctx, h.LastLSN(), c.g.c.ack)
	}
	if err != nil {
		if ctx.Err() != nil {
			return true, nil
		}
		return true, err
	}
	c.g.count(s, func(st *genShardStats) { st.acked += uint64(len(b)) })
	return true, c.g.acked(b)
}

// acked appends the client keys of b's requests to the ack log, if any.
func (g *generator) acked(b []wal.Event) error {
	if g.c.ackLog == nil {
		return nil
	}
	g.ackMu.Lock()
	defer g.ackMu.Unlock()
	g.ackBuf = g.ackBuf[:0]
	for i := range b {
		if b[i].HasIdemKey {
			g.ackBuf = append(g.ackBuf, b[i].IdemKey[:]...)
		}
	}
	if _, err := g.c.ackLog.Write(g.ackBuf); err != nil {
		return fmt.Errorf("ack log: %w", err)
	}
	return nil
}

// replace gives every slot whose session appears in evs a new session.
func (c *genClient) replace(evs []wal.Event) {
	gone := map[session.ID]bool{}
	for _, ev := range evs {
		gone[ev.Session] = true
	}
	for i, id := range c.ids {
		if gone[id] {
			c.openSession(i)
		}
	}
}

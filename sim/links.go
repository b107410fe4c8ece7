package sim

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/oncewal/oncewal/replication"
)

// ShardSeed derives an independent seed for stream n (a shard, a link) from
// a run's seed: splitmix64 of seed + (n+1)·golden ratio.
func ShardSeed(seed uint64, n uint32) uint64 {
	z := seed + (uint64(n)+1)*0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// mergedListener is one shard's leader-side Listener over several links
// (one transport per follower, each with its own faults): it accepts from
// all of them until ctx ends. A connection accepted as ctx ends is closed,
// and its follower dials again.
type mergedListener struct {
	conns chan accepted
	ctx   context.Context
}

type accepted struct {
	conn  replication.LeaderConn
	hello replication.Ack
}

func mergeListeners(ctx context.Context, ls []replication.Listener) *mergedListener {
	m := &mergedListener{conns: make(chan accepted), ctx: ctx}
	for _, l := range ls {
		go func() {
			for {
				c, h, err := l.Accept(ctx)
				if err != nil {
					return // ctx ended or the transport closed
				}
				select {
				case m.conns <- accepted{c, h}:
				case <-ctx.Done():
					_ = c.Close()
					return
				}
			}
		}()
	}
	return m
}

// Accept implements replication.Listener.
func (m *mergedListener) Accept(ctx context.Context) (replication.LeaderConn, replication.Ack, error) {
	select {
	case a := <-m.conns:
		return a.conn, a.hello, nil
	case <-ctx.Done():
		return nil, replication.Ack{}, ctx.Err()
	case <-m.ctx.Done():
		// The leader incarnation it belongs to is stopping: as its ctx.
		return nil, replication.Ack{}, m.ctx.Err()
	}
}

// errCut: the node's links were cut (it is about to lose power).
var errCut = errors.New("sim: link cut")

// cuttable is a follower's Dialer that the simulation can cut: from then on
// no ack leaves the node and no batch reaches it. A power failure is
// simulated by cutting, then cloning the node's filesystem (CrashClone),
// then killing the node: an ack must never report a write the clone may
// not hold.
type cuttable struct {
	d   replication.Dialer
	cut *atomic.Bool
}

func (c cuttable) Dial(ctx context.Context, hello replication.Ack) (replication.FollowerConn, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	conn, err := c.d.Dial(ctx, hello)
	if err != nil {
		return nil, err
	}
	return &cutConn{FollowerConn: conn, cut: c.cut}, nil
}

type cutConn struct {
	replication.FollowerConn
	cut  *atomic.Bool
	once sync.Once
}

func (c *cutConn) Recv(ctx context.Context) ([]byte, error) {
	b, err := c.FollowerConn.Recv(ctx)
	if err == nil && c.cut.Load() {
		return nil, errCut
	}
	return b, err
}

func (c *cutConn) Send(ctx context.Context, ack replication.Ack) error {
	if c.cut.Load() {
		c.once.Do(func() { _ = c.FollowerConn.Close() })
		return errCut
	}
	return c.FollowerConn.Send(ctx, ack)
}

package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/replication"
)

// linkTransport is a node's transport that counts its open links to each
// leader address per shard, for /readyz: node.Status says whom the node
// follows, not whether the link to it is up.
type linkTransport struct {
	node.Transport
	mu   sync.Mutex
	open map[linkKey]int
}

type linkKey struct {
	addr  string
	shard uint32
}

func newLinkTransport(t node.Transport) *linkTransport {
	return &linkTransport{Transport: t, open: map[linkKey]int{}}
}

func (t *linkTransport) add(k linkKey, d int) {
	t.mu.Lock()
	t.open[k] += d
	if t.open[k] == 0 {
		delete(t.open, k)
	}
	t.mu.Unlock()
}

// up reports whether every shard has a link to addr (nil), else which do
// not.
func (t *linkTransport) up(addr string, shards int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var down []uint32
	for s := range uint32(shards) {
		if t.open[linkKey{addr, s}] == 0 {
			down = append(down, s)
		}
	}
	if len(down) > 0 {
		return fmt.Errorf("no link to the leader for shard(s) %v of %d (the leader refuses this member, or cannot be reached)", down, shards)
	}
	return nil
}

// Dialer implements node.Transport.
func (t *linkTransport) Dialer(addr string) replication.Dialer {
	return linkDialer{t: t, addr: addr, d: t.Transport.Dialer(addr)}
}

type linkDialer struct {
	t    *linkTransport
	addr string
	d    replication.Dialer
}

func (d linkDialer) Dial(ctx context.Context, hello replication.Ack) (replication.FollowerConn, error) {
	c, err := d.d.Dial(ctx, hello)
	if err != nil {
		return nil, err
	}
	k := linkKey{d.addr, hello.Shard}
	d.t.add(k, 1)
	return &linkConn{FollowerConn: c, down: sync.OnceFunc(func() { d.t.add(k, -1) })}, nil
}

// linkConn is a link counted as up until it fails or closes.
type linkConn struct {
	replication.FollowerConn
	down func()
}

func (c *linkConn) Recv(ctx context.Context) ([]byte, error) {
	b, err := c.FollowerConn.Recv(ctx)
	if err != nil {
		c.down()
	}
	return b, err
}

func (c *linkConn) Close() error {
	c.down()
	return c.FollowerConn.Close()
}

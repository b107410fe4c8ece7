package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/replication"
)

// fakeLinks is the seam under linkTransport: its dialer connects at once,
// and each connection's Recv fails once broken is closed.
type fakeLinks struct {
	node.Transport
	refuse bool
}

func (f *fakeLinks) Dialer(string) replication.Dialer { return fakeDialer{f} }

type fakeDialer struct{ f *fakeLinks }

func (d fakeDialer) Dial(context.Context, replication.Ack) (replication.FollowerConn, error) {
	if d.f.refuse {
		return nil, errors.New("refused")
	}
	return &fakeConn{broken: make(chan struct{})}, nil
}

type fakeConn struct{ broken chan struct{} }

func (c *fakeConn) Recv(ctx context.Context) ([]byte, error) {
	<-c.broken
	return nil, replication.ErrDisconnected
}
func (c *fakeConn) Send(context.Context, replication.Ack) error { return nil }
func (c *fakeConn) Close() error                                { return nil }

// TestLinkTransportCountsLinks: /readyz's view of a follower's links —
// up once every shard has a connection to the leader's address, down
// again for a shard whose connection failed or closed (once, however
// often it is closed), and never up through a refused dial or a link to
// another address.
func TestLinkTransportCountsLinks(t *testing.T) {
	f := &fakeLinks{}
	lt := newLinkTransport(f)
	ctx := context.Background()
	const leader = "10.0.0.1:7400"
	if err := lt.up(leader, 2); err == nil || !strings.Contains(err.Error(), "shard(s) [0 1] of 2") {
		t.Fatalf("no links: %v", err)
	}
	c0, err := lt.Dialer(leader).Dial(ctx, replication.Ack{Shard: 0})
	must(t, err)
	if _, err := lt.Dialer("10.0.0.2:7400").Dial(ctx, replication.Ack{Shard: 1}); err != nil {
		t.Fatal(err)
	}
	if err := lt.up(leader, 2); err == nil || !strings.Contains(err.Error(), "shard(s) [1] of 2") {
		t.Fatalf("shard 1 linked to another address only: %v", err)
	}
	f.refuse = true
	if _, err := lt.Dialer(leader).Dial(ctx, replication.Ack{Shard: 1}); err == nil {
		t.Fatal("a refused dial connected")
	}
	f.refuse = false
	c1, err := lt.Dialer(leader).Dial(ctx, replication.Ack{Shard: 1})
	must(t, err)
	if err := lt.up(leader, 2); err != nil {
		t.Fatalf("both shards linked: %v", err)
	}
	close(c1.(*linkConn).FollowerConn.(*fakeConn).broken)
	if _, err := c1.Recv(ctx); err == nil {
		t.Fatal("a broken link received")
	}
	_ = c1.Close()
	if err := lt.up(leader, 2); err == nil || !strings.Contains(err.Error(), "shard(s) [1] of 2") {
		t.Fatalf("shard 1's link failed: %v", err)
	}
	c1b, err := lt.Dialer(leader).Dial(ctx, replication.Ack{Shard: 1})
	must(t, err)
	if err := lt.up(leader, 2); err != nil {
		t.Fatalf("shard 1 redialled: %v (a failed link closed twice must count down once)", err)
	}
	_ = c0.Close()
	_ = c1b.Close()
	if err := lt.up(leader, 2); err == nil {
		t.Fatal("every link closed, yet up")
	}
}

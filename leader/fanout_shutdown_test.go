package leader

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/oncewal/oncewal/replication"
)

// lateListener returns one connection from Accept only once ctx has ended:
// the accept that races with the end of Run.
type lateListener struct {
	conn *closeConn
	done atomic.Bool
}

func (l *lateListener) Accept(ctx context.Context) (replication.LeaderConn, replication.Ack, error) {
	<-ctx.Done()
	if l.done.Swap(true) {
		return nil, replication.Ack{}, ctx.Err()
	}
	return l.conn, replication.Ack{Shard: 2, FollowerID: "a"}, nil
}

// closeConn is a connection that carries nothing and records its Close.
type closeConn struct{ closed atomic.Bool }

func (c *closeConn) Send(ctx context.Context, _ []byte) error { return replication.ErrDisconnected }
func (c *closeConn) Recv(ctx context.Context) (replication.Ack, error) {
	<-ctx.Done()
	return replication.Ack{}, ctx.Err()
}
func (c *closeConn) Close() error { c.closed.Store(true); return nil }

// TestFanoutClosesConnectionAcceptedAtStop: a connection the accept loop
// dispatches as Run stops is closed before Run returns; left open, its
// follower would wait on it forever (a listener that outlives the Fanout,
// such as a server kept across a leader restart, hands out such
// connections).
func TestFanoutClosesConnectionAcceptedAtStop(t *testing.T) {
	l := &lateListener{conn: &closeConn{}}
	fo, err := NewFanout(&FanoutOptions{ShipperOptions: testShipperOptions(l, newMemLog(2)), Followers: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := fo.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if !l.done.Load() {
		t.Fatal("the listener was not asked to accept")
	}
	if !l.conn.closed.Load() {
		t.Fatal("the connection accepted as Run stopped was left open")
	}
}

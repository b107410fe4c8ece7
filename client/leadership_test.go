package client_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/clientapi"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// TestDeposedLeaderAnswerFailsOver: the leader's lease ends while it runs
// a request (its Leading starts to report an error once the handler has
// run): the request is logged and acknowledged by follower f1 under the
// service's MinAck (all; the client asks for leader), but the leader
// answers Unavailable, not OK. The client keeps its request ID, goes round
// its addresses (the deposed leader, then a node that does not know the
// leader) until f1, promoted at epoch 2, serves at the second address —
// and ends with the one run's outcome, replayed by the new leader: the
// request ran once and took effect once.
func TestDeposedLeaderAnswerFailsOver(t *testing.T) {
	errLease := errors.New("lease deadline passed")
	c := newClusterWith(t, 1, func(c *cluster) {
		c.sopts = clientapi.Options{MinAck: clientv1.Ack_ACK_ALL, Leading: func() error {
			if c.runs.Load() > 0 {
				return errLease
			}
			return nil
		}}
	}, "f1")
	deposed := c.svc
	second := c.listenServices("127.0.0.1:0", clientapi.NotLeader(func() (string, uint64) { return "", 0 }))
	secondAddr := second.Addr().String()
	cl := c.newClient("alice", client.AckLeader, 1000, c.addr, secondAddr)

	type answer struct {
		res client.Result
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := cl.Submit(context.Background(), "pay-1", client.Ops(client.Add([]byte("k"), 1)))
		got <- answer{res, err}
	}()
	waitFor(t, func() bool {
		st := deposed.Stats().Submit
		return st[clientv1.Code_UNAVAILABLE]+st[clientv1.Code_OK] > 0
	})
	require.Zero(t, deposed.Stats().Submit[clientv1.Code_OK], "the deposed leader answered OK")

	// f1 holds the request (MinAck all); it is promoted in the leader's
	// place and serves at the second address.
	c.stopLeader()
	f1 := c.nodes["f1"].dir
	c.closeNode("f1")
	require.NoError(t, second.Close())
	c.dir = f1
	c.lopts.Promote, c.lopts.Epoch, c.lopts.Followers = true, 2, nil
	c.sopts = clientapi.Options{}
	c.startLeader(secondAddr)

	a := <-got
	require.NoError(t, a.err)
	require.True(t, a.res.Replayed, "the promoted leader ran the request again")
	require.Equal(t, "run-1", string(a.res.Outcome))
	require.Equal(t, uint64(2), a.res.Epoch)
	require.Equal(t, uint64(1), c.runs.Load(), "the handler ran more than once")
	require.Equal(t, int64(1), c.leaderEffects()["k"])
	st, err := cl.Status(context.Background(), "pay-1")
	require.NoError(t, err)
	require.Equal(t, client.StateDone, st.State)
	require.Equal(t, "run-1", string(st.Outcome))
	addr, epoch := cl.Leader()
	require.Equal(t, secondAddr, addr)
	require.Equal(t, uint64(2), epoch)
}

// counting is svc with every call of its methods counted in n: svc's
// Register is handed a registrar that wraps each method's handler.
func counting(svc grpctransport.Service, n *atomic.Int64) grpctransport.Service {
	register := svc.Register
	svc.Register = func(r grpc.ServiceRegistrar) { register(countingRegistrar{r: r, n: n}) }
	return svc
}

// countingRegistrar registers services with every unary call counted in n.
type countingRegistrar struct {
	r grpc.ServiceRegistrar
	n *atomic.Int64
}

func (c countingRegistrar) RegisterService(desc *grpc.ServiceDesc, impl any) {
	d := *desc
	d.Methods = slices.Clone(desc.Methods)
	for i := range d.Methods {
		h := d.Methods[i].Handler
		d.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			c.n.Add(1)
			return h(srv, ctx, dec, icpt)
		}
	}
	c.r.RegisterService(&d, impl)
}

// TestStaleRedirectNotFollowed: a client that has seen the leader's epoch
// 2 is told by one node that the leader is at an old address at epoch 1
// (the node has not heard of the election): it does not go there, but to
// its next address, whose node names the leader's new address at epoch 2.
// A client following the stale redirect would go round the old address,
// the stale node and the address it named, and never reach the third.
func TestStaleRedirectNotFollowed(t *testing.T) {
	c := newClusterWith(t, 1, func(c *cluster) { c.lopts.Epoch = 2 })
	var wrongCalls atomic.Int64
	wrong := c.listenServices("127.0.0.1:0", counting(clientapi.NotLeader(func() (string, uint64) { return "", 1 }), &wrongCalls))
	defer wrong.Close()
	stale := c.listenServices("127.0.0.1:0", clientapi.NotLeader(func() (string, uint64) { return wrong.Addr().String(), 1 }))
	defer stale.Close()
	var current atomic.Value
	current.Store("")
	knows := c.listenServices("127.0.0.1:0", clientapi.NotLeader(func() (string, uint64) { return current.Load().(string), 2 }))
	defer knows.Close()
	cl := c.newClient("carol", client.AckLeader, 50, c.addr, stale.Addr().String(), knows.Addr().String())

	res, err := cl.Submit(context.Background(), "a", client.Ops(client.Add([]byte("k"), 1)))
	require.NoError(t, err)
	require.Equal(t, uint64(2), res.Epoch)

	// The leader moves to another address; its old one refuses.
	require.NoError(t, c.srv.Close())
	c.srv = c.listen("127.0.0.1:0", c.svc.GRPC())
	current.Store(c.srv.Addr().String())

	res, err = cl.Submit(context.Background(), "b", client.Ops(client.Add([]byte("k"), 1)))
	require.NoError(t, err)
	require.Equal(t, uint64(2), res.Epoch)
	require.Zero(t, wrongCalls.Load(), "the client followed a redirect of epoch 1 after seeing epoch 2")
	addr, epoch := cl.Leader()
	require.Equal(t, c.srv.Addr().String(), addr)
	require.Equal(t, uint64(2), epoch)
	require.Equal(t, int64(2), c.leaderEffects()["k"])
}

// TestFindsLeaderAmongUnknowingNodes: with no leader known, the client
// tries Options.Addrs in turn: two nodes that do not know the leader are
// asked once each, and the third, which leads, answers; later calls start
// there.
func TestFindsLeaderAmongUnknowingNodes(t *testing.T) {
	c := newCluster(t, 1)
	var calls [2]atomic.Int64
	var addrs []string
	for i := range calls {
		srv := c.listenServices("127.0.0.1:0", counting(clientapi.NotLeader(func() (string, uint64) { return "", 0 }), &calls[i]))
		defer srv.Close()
		addrs = append(addrs, srv.Addr().String())
	}
	cl := c.newClient("dan", client.AckLeader, 20, append(addrs, c.addr)...)
	for _, id := range []string{"a", "b"} {
		_, err := cl.Submit(context.Background(), id, client.Ops(client.Add([]byte("k"), 1)))
		require.NoError(t, err)
	}
	require.Equal(t, int64(1), calls[0].Load())
	require.Equal(t, int64(1), calls[1].Load())
	addr, epoch := cl.Leader()
	require.Equal(t, c.addr, addr)
	require.Equal(t, uint64(1), epoch)
	require.Equal(t, int64(2), c.leaderEffects()["k"])
}

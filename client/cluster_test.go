package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/backoff"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// cluster is a real deployment on one machine: a leader (leader.Open in a
// temporary directory) shipping each shard over its own in-process
// transport to follower nodes, and the client service on a real gRPC
// server with mutual TLS on loopback. The leader may be restarted on the
// same directory (restartLeader) or replaced by a promoted follower
// (promote).
type cluster struct {
	t      *testing.T
	shards int
	tls    testutil.TLSPair
	runs   atomic.Uint64 // handler runs: every run's outcome is unique

	dir     string
	lopts   leader.Options
	sopts   clientapi.Options // the client service's, but its Handler and Logger
	trs     []*inprocess.Transport
	l       *leader.Leader
	stopRun func()
	svc     *clientapi.Service
	srv     *grpctransport.Server
	addr    string

	nodes map[string]*nodeRun
}

// nodeRun is a follower node serving every shard of the cluster.
type nodeRun struct {
	dir  string
	n    *follower.Node
	stop func()
}

func newCluster(t *testing.T, shards int, followers ...string) *cluster {
	t.Helper()
	return newClusterWith(t, shards, nil, followers...)
}

// newClusterWith is newCluster with edit adjusting the cluster's options
// (lopts, sopts) before its leader starts.
func newClusterWith(t *testing.T, shards int, edit func(*cluster), followers ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, shards: shards, tls: testutil.NewTLSPair(t), nodes: map[string]*nodeRun{}, dir: t.TempDir()}
	// A short lease: a claim the old leader left in flight when it died
	// holds its request ID on the promoted one until its lease ends.
	c.lopts = leader.Options{Shards: shards, Followers: followers, Ledger: idempotency.LedgerOptions{Lease: 3 * time.Second},
		Shipping: leader.ShipperOptions{PollInterval: time.Millisecond, RetransmitTimeout: 20 * time.Millisecond}}
	if edit != nil {
		edit(c)
	}
	c.startLeader("127.0.0.1:0")
	for _, id := range followers {
		c.startNode(id, t.TempDir())
	}
	t.Cleanup(c.stop)
	return c
}

// handler is the default payload's handler with a unique outcome per run:
// two answers with the same outcome come from one run of the request.
func (c *cluster) handler(ctx context.Context, r clientapi.Request) ([]wal.Event, []byte, error) {
	events, _, err := clientapi.DefaultHandler(ctx, r)
	return events, fmt.Appendf(nil, "run-%d", c.runs.Add(1)), err
}

// startLeader opens the leader in c.dir with c.lopts, runs its shipping
// and serves the client service on addr.
func (c *cluster) startLeader(addr string) {
	t := c.t
	t.Helper()
	c.trs = nil
	for s := range c.shards {
		c.trs = append(c.trs, inprocess.New(inprocess.FaultsNone, uint64(s)+1))
	}
	o := c.lopts
	o.Listener = func(s uint32) replication.Listener { return c.trs[s] }
	o.Logger, o.Store.Logger = quietLog(), quietLog()
	l, err := leader.Open(c.dir, &o)
	require.NoError(t, err)
	c.l = l
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Run(ctx) })
	c.stopRun = func() { cancel(); wg.Wait() }
	so := c.sopts
	so.Handler, so.Logger = c.handler, quietLog()
	svc, err := clientapi.New(l, &so)
	require.NoError(t, err)
	c.svc = svc
	c.srv = c.listen(addr, svc.GRPC())
	c.addr = c.srv.Addr().String()
}

// listen serves svc with the cluster's mutual TLS on addr (an address a
// closed server had: the port is free again).
func (c *cluster) listen(addr string, svc grpctransport.Service) *grpctransport.Server {
	c.t.Helper()
	var srv *grpctransport.Server
	var err error
	// The port of a server just closed may take a moment to be free.
	waitFor(c.t, func() bool {
		srv, err = grpctransport.Listen(addr, &grpctransport.ServerOptions{
			TLS: grpctransport.ServerTLSConfig(c.tls.Pool, c.tls.Leader), Logger: quietLog(),
			Services: []grpctransport.Service{svc}})
		return err == nil
	})
	return srv
}

// stopLeader closes the client server, stops shipping and closes the
// leader: in-flight requests get no answer.
func (c *cluster) stopLeader() {
	if c.l == nil {
		return
	}
	require.NoError(c.t, c.srv.Close())
	c.stopRun()
	require.NoError(c.t, c.l.Close())
	for _, tr := range c.trs {
		tr.Close()
	}
	c.l = nil
}

// restartLeader closes the leader and reopens its directory, serving on
// the same address.
func (c *cluster) restartLeader() {
	addr := c.addr
	c.stopLeader()
	c.startLeader(addr)
	for _, n := range c.nodes {
		c.serveNode(n) // the transports are new
	}
}

// startNode opens follower node id in dir (every shard) and serves it.
func (c *cluster) startNode(id, dir string) {
	shards := make([]uint32, c.shards)
	for s := range shards {
		shards[s] = uint32(s)
	}
	n, err := follower.OpenNode(dir, shards, &follower.NodeOptions{ShardCount: c.shards,
		Follower: follower.Options{Store: store.Options{ID: id, Logger: quietLog()}, ReconnectBackoff: time.Millisecond}})
	require.NoError(c.t, err)
	nr := &nodeRun{dir: dir, n: n}
	c.nodes[id] = nr
	c.serveNode(nr)
}

// serveNode (re)starts n's Serve against the current transports.
func (c *cluster) serveNode(nr *nodeRun) {
	if nr.stop != nil {
		nr.stop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	trs := c.trs
	wg.Go(func() { _ = nr.n.Serve(ctx, func(s uint32) replication.Dialer { return trs[s] }) })
	nr.stop = func() { cancel(); wg.Wait() }
}

// closeNode stops and closes follower id.
func (c *cluster) closeNode(id string) {
	nr := c.nodes[id]
	nr.stop()
	require.NoError(c.t, nr.n.Close())
	delete(c.nodes, id)
}

func (c *cluster) stop() {
	c.stopLeader()
	for id := range c.nodes {
		c.closeNode(id)
	}
}

// caughtUp waits until every follower has applied everything the leader
// logged so far.
func (c *cluster) caughtUp() {
	c.t.Helper()
	for s := range uint32(c.shards) {
		sh, err := c.l.Shard(s)
		require.NoError(c.t, err)
		end := sh.NextLSN() - 1
		for _, nr := range c.nodes {
			waitFor(c.t, func() bool {
				applied, _, err := nr.n.Position(s)
				return err == nil && applied >= end
			})
		}
	}
}

// effects sums each key's counter over every session of every shard of a
// store set: what the requests did, wherever their sessions were.
func effects(t *testing.T, states []*session.State) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, st := range states {
		ids, err := st.Sessions()
		require.NoError(t, err)
		for _, id := range ids {
			keys, err := st.Keys(id)
			require.NoError(t, err)
			for k := range keys {
				n, err := st.Counter(id, []byte(k))
				require.NoError(t, err)
				out[k] += n
			}
		}
	}
	return out
}

// leaderEffects is effects over the leader's stores.
func (c *cluster) leaderEffects() map[string]int64 {
	var states []*session.State
	for s := range uint32(c.shards) {
		sh, err := c.l.Shard(s)
		require.NoError(c.t, err)
		states = append(states, sh.Store().State())
	}
	return effects(c.t, states)
}

// nodeEffects is effects over follower id's stores; call it once the node
// has caught up and nothing more is logged.
func (c *cluster) nodeEffects(id string) map[string]int64 {
	var states []*session.State
	for s := range uint32(c.shards) {
		require.NoError(c.t, c.nodes[id].n.Follower(s, func(f *follower.Follower) error {
			states = append(states, f.State())
			return nil
		}))
	}
	return effects(c.t, states)
}

// fastBackoff keeps retries quick; what the tests check is which requests
// took effect, never how long anything took.
var fastBackoff = backoff.Config{BaseDelay: time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 20 * time.Millisecond}

// newClient is a client of addrs whose certificate names
// oncewal://client/name, with a budget of attempts per call.
func (c *cluster) newClient(name string, ack client.Ack, attempts int, addrs ...string) *client.Client {
	c.t.Helper()
	cert := testutil.ClientCert(c.t, c.tls.Certs, "oncewal://client/"+name)
	cl, err := client.New(&client.Options{Addrs: addrs, TLS: grpctransport.ClientTLSConfig(c.tls.Pool, cert, ""),
		Ack: ack, Attempts: attempts, RetryTimeout: 20 * time.Second, AttemptTimeout: 3 * time.Second,
		Backoff: fastBackoff, Logger: quietLog()})
	require.NoError(c.t, err)
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// waitFor polls cond until it holds (a bounded wait for a state, never an
// assertion on time).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 60s")
		}
		time.Sleep(time.Millisecond)
	}
}

// listenServices serves svc alone on addr with the cluster's mutual TLS.
func (c *cluster) listenServices(addr string, svc grpctransport.Service) *grpctransport.ServiceServer {
	c.t.Helper()
	var srv *grpctransport.ServiceServer
	var err error
	waitFor(c.t, func() bool {
		srv, err = grpctransport.ListenServices(addr, &grpctransport.ServerOptions{
			TLS: grpctransport.ServerTLSConfig(c.tls.Pool, c.tls.Leader), Logger: quietLog(),
			Services: []grpctransport.Service{svc}})
		return err == nil
	})
	return srv
}

package clientapi_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/kvroute"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/replication/inprocess"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
)

// replicaRig is a rig whose leader ships to one follower per shard over
// in-process links; the followers do not replicate until serve is called,
// and their stores are served by clientapi.Replica at replicaAddr.
type replicaRig struct {
	*rig
	trs         []*inprocess.Transport
	fols        []*follower.Follower
	epoch       atomic.Uint64 // the leader epoch the replica's where reports
	replicaAddr string
	serveOnce   sync.Once
}

func newReplicaRig(t *testing.T, shards int, wait time.Duration) *replicaRig {
	t.Helper()
	rr := &replicaRig{}
	for s := range shards {
		rr.trs = append(rr.trs, inprocess.New(inprocess.FaultsNone, uint64(s)+1))
	}
	lo := leader.Options{Shards: shards, Followers: []string{"f1"},
		Listener: func(s uint32) replication.Listener { return rr.trs[s] }}
	lo.Shipping.RetransmitTimeout, lo.Shipping.PollInterval = 20*time.Millisecond, time.Millisecond
	rr.rig = newRig(t, lo, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rr.l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		for _, tr := range rr.trs {
			tr.Close()
		}
	})
	for s := range uint32(shards) {
		f, err := follower.Open(t.TempDir(), &follower.Options{Store: store.Options{ID: "f1", Shard: s, Logger: quiet()}, ReconnectBackoff: time.Millisecond})
		require.NoError(t, err)
		rr.fols = append(rr.fols, f)
	}
	sh, _ := rr.l.Shard(0)
	rr.epoch.Store(sh.Epoch())
	svc, err := clientapi.Replica(func() (string, uint64) { return rr.addr, rr.epoch.Load() },
		func(s uint32) (*store.Store, error) {
			if int(s) >= len(rr.fols) {
				return nil, fmt.Errorf("no shard %d", s)
			}
			return rr.fols[s].Store(), nil
		}, &clientapi.ReplicaOptions{Shards: shards, ReadWait: wait, Logger: quiet()})
	require.NoError(t, err)
	srv, err := grpctransport.ListenServices("127.0.0.1:0", &grpctransport.ServerOptions{
		TLS: grpctransport.ServerTLSConfig(rr.tls.Pool, rr.tls.Leader), Logger: quiet(),
		Services: []grpctransport.Service{svc}})
	require.NoError(t, err)
	rr.replicaAddr = srv.Addr().String()
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		for _, f := range rr.fols {
			require.NoError(t, f.Close())
		}
	})
	return rr
}

// serve starts the followers replicating (once); they stop at the test's
// end, before their stores close.
func (rr *replicaRig) serve(t *testing.T) {
	rr.serveOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for s, f := range rr.fols {
			wg.Go(func() { _ = f.Serve(ctx, rr.trs[s]) })
		}
		t.Cleanup(func() { cancel(); wg.Wait() })
	})
}

// maxTestShards bounds the shards of these tests' rigs.
const maxTestShards = 8

// replica dials the replica as client name ("": a certificate naming no one).
func (rr *replicaRig) replica(t *testing.T, uris ...string) *grpc.ClientConn {
	return dial(t, rr.replicaAddr, rr.tls, testutil.ClientCert(t, rr.tls.Certs, uris...))
}

// getAt reads key with minLSN for every shard (0: none; the replica
// applies its key's).
func getAt(t *testing.T, cc *grpc.ClientConn, key string, minLSN uint64) *clientv1.GetReply {
	t.Helper()
	req := &clientv1.GetRequest{Key: []byte(key)}
	if minLSN > 0 {
		for s := range uint32(maxTestShards) {
			req.MinLsn = append(req.MinLsn, &clientv1.ShardLSN{Shard: s, Lsn: minLSN})
		}
	}
	var rep clientv1.GetReply
	require.NoError(t, call(cc, clientv1.Client_Get_FullMethodName, req, &rep))
	return &rep
}

// TestReplicaReadsAtMinLSN: a replica that has not applied a write yet
// answers a Get at the write's LSN BEHIND after ReadWait, naming its
// applied LSN, the minimum and the gap, and the leader; once it
// replicates, the same Get is OK at or past the minimum and sees the
// write. A read without MinLSN, and a Txn, are NOT_LEADER with the
// leader's address; a Range reads at a MinLSN for every shard it reads,
// else NOT_LEADER; a replica whose state is of an epoch below the
// leader's answers BEHIND.
func TestReplicaReadsAtMinLSN(t *testing.T) {
	const wait = 100 * time.Millisecond
	rr := newReplicaRig(t, 2, wait)
	cc := rr.client("rita")
	key := "{acct}/name"
	shard := kvroute.Shard([]byte(key), 2)
	w := txn(t, cc, &clientv1.TxnRequest{Session: sessionIn(t, cc, shard), RequestId: "w1",
		Success: []*clientv1.TxnOp{{Kind: clientv1.TxnOp_PUT, Key: []byte(key), Value: []byte("v1")}}})
	require.Equal(t, clientv1.Code_OK, w.Code, w.Message)
	other := "{b}/x"
	oshard := kvroute.Shard([]byte(other), 2)
	require.NotEqual(t, shard, oshard, "the test wants keys of both shards")
	w2 := txn(t, cc, &clientv1.TxnRequest{Session: sessionIn(t, cc, oshard), RequestId: "w2",
		Success: []*clientv1.TxnOp{{Kind: clientv1.TxnOp_PUT, Key: []byte(other), Value: []byte("v2")}}})
	require.Equal(t, clientv1.Code_OK, w2.Code, w2.Message)

	rc := rr.replica(t, "oncewal://client/rita")
	began := time.Now()
	behind := getAt(t, rc, key, w.Lsn)
	took := time.Since(began)
	require.Equal(t, clientv1.Code_BEHIND, behind.Code, behind.Message)
	require.GreaterOrEqual(t, took, wait, "BEHIND only after ReadWait")
	require.Less(t, took, 10*time.Second, "BEHIND within a bound")
	require.Equal(t, uint64(0), behind.Lsn, "the replica's applied LSN")
	require.Contains(t, behind.Message, fmt.Sprintf("shard %d has applied LSN 0, %d behind the read's minimum %d", shard, w.Lsn, w.Lsn))
	require.Equal(t, rr.addr, behind.Leader, "BEHIND names the leader")
	require.False(t, behind.Found)

	lin := getAt(t, rc, key, 0)
	require.Equal(t, clientv1.Code_NOT_LEADER, lin.Code, "a read without MinLSN is the leader's")
	require.Equal(t, rr.addr, lin.Leader)
	tx := txn(t, rc, &clientv1.TxnRequest{Session: sessionIn(t, cc, shard), RequestId: "w3",
		Success: []*clientv1.TxnOp{{Kind: clientv1.TxnOp_PUT, Key: []byte(key), Value: []byte("v3")}}})
	require.Equal(t, clientv1.Code_NOT_LEADER, tx.Code)
	require.Equal(t, rr.addr, tx.Leader)

	rr.serve(t)
	var ok *clientv1.GetReply
	waitFor(t, func() bool { ok = getAt(t, rc, key, w.Lsn); return ok.Code == clientv1.Code_OK })
	require.True(t, ok.Found)
	require.Equal(t, "v1", string(ok.Kv.Value), "the replica reads the write")
	require.GreaterOrEqual(t, ok.Lsn, w.Lsn, "read at or past the minimum")
	require.Equal(t, shard, ok.Shard)
	require.Equal(t, rr.epoch.Load(), ok.Epoch, "the snapshot's epoch")
	require.Empty(t, getAt(t, rr.replica(t, "oncewal://client/other"), key, w.Lsn).Kv, "another principal's keys are its own")

	mins := []*clientv1.ShardLSN{{Shard: shard, Lsn: w.Lsn}, {Shard: oshard, Lsn: w2.Lsn}}
	var all clientv1.RangeReply
	require.NoError(t, call(rc, clientv1.Client_Range_FullMethodName, &clientv1.RangeRequest{MinLsn: mins}, &all))
	require.Equal(t, clientv1.Code_OK, all.Code, all.Message)
	require.Len(t, all.Kvs, 2)
	require.Equal(t, other, string(all.Kvs[1].Key))
	require.Len(t, all.Lsn, 2)
	var one clientv1.RangeReply
	require.NoError(t, call(rc, clientv1.Client_Range_FullMethodName, &clientv1.RangeRequest{Prefix: []byte("{acct}/"), MinLsn: mins[:1]}, &one))
	require.Equal(t, clientv1.Code_OK, one.Code, one.Message)
	require.Len(t, one.Kvs, 1)
	var part clientv1.RangeReply
	require.NoError(t, call(rc, clientv1.Client_Range_FullMethodName, &clientv1.RangeRequest{MinLsn: mins[:1]}, &part))
	require.Equal(t, clientv1.Code_NOT_LEADER, part.Code, "a shard read without MinLSN is the leader's")
	require.Equal(t, rr.addr, part.Leader)

	rr.epoch.Add(1)
	stale := getAt(t, rc, key, w.Lsn)
	require.Equal(t, clientv1.Code_BEHIND, stale.Code, "a state of an older epoch than the leader's")
	require.Contains(t, stale.Message, "nothing yet of the leader's epoch")
	require.False(t, stale.Found)
}

// TestReplicaIdentity: a replica names its callers as the leader does: a
// certificate naming no one is Unauthenticated, another role's
// PermissionDenied, whatever the read.
func TestReplicaIdentity(t *testing.T) {
	rr := newReplicaRig(t, 1, 10*time.Millisecond)
	for _, tc := range []struct {
		name string
		cc   *grpc.ClientConn
		want codes.Code
	}{
		{"no identity", rr.replica(t), codes.Unauthenticated},
		{"generated follower", dial(t, rr.replicaAddr, rr.tls, rr.tls.Follower), codes.PermissionDenied},
		{"node", rr.replica(t, "oncewal://node/n1"), codes.PermissionDenied},
	} {
		for _, min := range []uint64{0, 1} {
			var rep clientv1.GetReply
			err := call(tc.cc, clientv1.Client_Get_FullMethodName, &clientv1.GetRequest{Key: []byte("k"), MinLsn: []*clientv1.ShardLSN{{Lsn: min}}}, &rep)
			require.Equal(t, tc.want, grpcstatus.Code(err), "%s, min %d: %v", tc.name, min, err)
			var rg clientv1.RangeReply
			err = call(tc.cc, clientv1.Client_Range_FullMethodName, &clientv1.RangeRequest{MinLsn: []*clientv1.ShardLSN{{Lsn: min}}}, &rg)
			require.Equal(t, tc.want, grpcstatus.Code(err), "%s, range min %d: %v", tc.name, min, err)
		}
	}
	_, err := clientapi.Replica(func() (string, uint64) { return "", 0 }, func(uint32) (*store.Store, error) { return nil, nil }, &clientapi.ReplicaOptions{})
	require.ErrorIs(t, err, clientapi.ErrBadOptions, "no shard count")
}

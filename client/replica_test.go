package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/store"
)

// serveReplica serves follower node id's stores as clientapi.Replica (reads
// at a MinLSN) over the cluster's mutual TLS, and returns its address.
func (c *cluster) serveReplica(id string, wait time.Duration) string {
	c.t.Helper()
	n := c.nodes[id].n
	sh, err := c.l.Shard(0)
	require.NoError(c.t, err)
	addr, epoch := c.addr, sh.Epoch()
	svc, err := clientapi.Replica(func() (string, uint64) { return addr, epoch }, func(shard uint32) (*store.Store, error) {
		var st *store.Store
		err := n.Follower(shard, func(f *follower.Follower) error { st = f.Store(); return nil })
		return st, err
	}, &clientapi.ReplicaOptions{Shards: c.shards, ReadWait: wait, Logger: quietLog()})
	require.NoError(c.t, err)
	srv := c.listenServices("127.0.0.1:0", svc)
	c.t.Cleanup(func() { _ = srv.Close() })
	return srv.Addr().String()
}

// TestReadYourWritesOnAReplica: through the real gRPC stack, a write on
// the leader (Txn: its LSN and shard) is read from a follower's address
// with MinLSN and FromReplica — also with the leader gone, so the replica
// answered; a replica that has not applied the write answers BEHIND after
// its wait and the read ends at the leader, which sees it. A replica's
// answer does not make the client take it for the leader.
func TestReadYourWritesOnAReplica(t *testing.T) {
	c := newCluster(t, 2, "f1")
	replica := c.serveReplica("f1", 200*time.Millisecond)
	ctx := context.Background()
	cl := c.newClient("rita", client.AckLeader, 3, c.addr)
	key := []byte("{rita}/name")
	res, err := cl.Txn(ctx, "w1", client.Txn{Then: []client.TxnOp{client.OpPut(key, []byte("v1"))}})
	require.NoError(t, err)
	kv, found, err := cl.Get(ctx, key, client.MinLSN(res.Shard, res.LSN), client.FromReplica(replica))
	require.NoError(t, err)
	require.True(t, found, "the replica reads the write")
	require.Equal(t, "v1", string(kv.Value))
	leader, _ := cl.Leader()
	require.Equal(t, c.addr, leader, "a replica's answer is no proof of leadership")
	all, _, err := cl.Range(ctx, []byte("{rita}/"), 0, client.MinLSN(res.Shard, res.LSN), client.FromReplica(replica))
	require.NoError(t, err)
	require.Len(t, all, 1)

	// The follower stops replicating: the replica is behind the next
	// write, and the read ends at the leader.
	c.nodes["f1"].stop()
	c.nodes["f1"].stop = func() {}
	res2, err := cl.Txn(ctx, "w2", client.Txn{Then: []client.TxnOp{client.OpPut(key, []byte("v2"))}})
	require.NoError(t, err)
	began := time.Now()
	kv, _, err = cl.Get(ctx, key, client.MinLSN(res2.Shard, res2.LSN), client.FromReplica(replica))
	require.NoError(t, err)
	require.Equal(t, "v2", string(kv.Value), "BEHIND on the replica, answered by the leader")
	require.GreaterOrEqual(t, time.Since(began), 200*time.Millisecond, "the replica waited its ReadWait first")

	// With the leader gone, a read at the first write's LSN is the
	// replica's alone.
	c.stopLeader()
	kv, found, err = cl.Get(ctx, key, client.MinLSN(res.Shard, res.LSN), client.FromReplica(replica))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "v1", string(kv.Value), "the replica's state: the second write never reached it")
}

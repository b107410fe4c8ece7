package node

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/clientapi"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
)

// TestFollowerServesReadsAtMinLSN: a member that follows serves, at its
// own address, a Get at the LSN a write on the leader answered from its
// own stores (OK, seeing the write), and a Get without one NOT_LEADER
// naming the leader.
func TestFollowerServesReadsAtMinLSN(t *testing.T) {
	cl, addrs := netCluster(t, 2, "a", "b")
	cl.start("a")
	cl.start("b")
	lid, _ := cl.waitLeader("")
	leaderAddr, followerAddr := addrs[0], addrs[1]
	if lid == "b" {
		leaderAddr, followerAddr = followerAddr, leaderAddr
	}
	c, err := client.New(&client.Options{Addrs: []string{leaderAddr}, Insecure: true, Principal: "tester", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	key := []byte("{t}/name")
	res, err := c.Txn(ctx, "w1", client.Txn{Then: []client.TxnOp{client.OpPut(key, []byte("v1"))}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(followerAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	fc := clientv1.NewClientClient(cc)
	mctx := metadata.AppendToOutgoingContext(ctx, clientapi.PrincipalMetadata, "tester")
	var rep *clientv1.GetReply
	deadline := time.Now().Add(30 * time.Second)
	for {
		rep, err = fc.Get(mctx, &clientv1.GetRequest{Key: key, MinLsn: []*clientv1.ShardLSN{{Shard: res.Shard, Lsn: res.LSN}}})
		if err == nil && rep.GetCode() == clientv1.Code_OK || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil || rep.GetCode() != clientv1.Code_OK {
		t.Fatalf("a read at the write's LSN on the follower: %v, %v", rep, err)
	}
	if !rep.GetFound() || string(rep.GetKv().GetValue()) != "v1" || rep.GetLsn() < res.LSN {
		t.Fatalf("the follower's read: %v, want v1 at LSN >= %d", rep, res.LSN)
	}
	lin, err := fc.Get(mctx, &clientv1.GetRequest{Key: key})
	if err != nil || lin.GetCode() != clientv1.Code_NOT_LEADER || lin.GetLeader() != leaderAddr {
		t.Fatalf("a linearizable read on the follower: %v, %v; want NOT_LEADER naming %s", lin, err, leaderAddr)
	}
	kv, found, err := c.Get(ctx, key, client.MinLSN(res.Shard, res.LSN), client.FromReplica(followerAddr))
	if err != nil || !found || string(kv.Value) != "v1" {
		t.Fatalf("the Go client's read from the follower: %v %v %v", kv, found, err)
	}
}

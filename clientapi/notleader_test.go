package clientapi_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
)

// TestNotLeader: a node serving NotLeader answers every method NotLeader
// with the leader's address and epoch as it knows them now, and refuses
// a malformed request (a session ID that is not 16 bytes).
func TestNotLeader(t *testing.T) {
	p := testutil.NewTLSPair(t)
	var epoch uint64 = 3
	srv, err := grpctransport.ListenServices("127.0.0.1:0", &grpctransport.ServerOptions{
		TLS: grpctransport.ServerTLSConfig(p.Pool, p.Leader), Logger: quiet(),
		Services: []grpctransport.Service{clientapi.NotLeader(func() (string, uint64) { return "10.0.0.1:7070", epoch })}})
	require.NoError(t, err)
	defer srv.Close()
	cc := dial(t, srv.Addr().String(), p, testutil.ClientCert(t, p.Certs, "oncewal://client/alice"))

	sid := session.NewID()
	var sub clientv1.SubmitReply
	require.NoError(t, call(cc, clientv1.Client_Submit_FullMethodName, &clientv1.SubmitRequest{Session: sid[:], RequestId: "r"}, &sub))
	require.True(t, proto.Equal(&clientv1.SubmitReply{Code: clientv1.Code_NOT_LEADER, Leader: "10.0.0.1:7070", Epoch: 3, Message: sub.Message}, &sub), "%v", &sub)
	var st clientv1.StatusReply
	require.NoError(t, call(cc, clientv1.Client_Status_FullMethodName, &clientv1.StatusRequest{Session: sid[:], RequestId: "r"}, &st))
	require.Equal(t, clientv1.Code_NOT_LEADER, st.Code)
	require.Equal(t, "10.0.0.1:7070", st.Leader)
	var op clientv1.OpenSessionReply
	require.NoError(t, call(cc, clientv1.Client_OpenSession_FullMethodName, &clientv1.OpenSessionRequest{}, &op))
	require.Equal(t, clientv1.Code_NOT_LEADER, op.Code)
	require.Equal(t, uint64(3), op.Epoch)
	var tx clientv1.TxnReply
	require.NoError(t, call(cc, clientv1.Client_Txn_FullMethodName, &clientv1.TxnRequest{Session: sid[:], RequestId: "r"}, &tx))
	require.Equal(t, clientv1.Code_NOT_LEADER, tx.Code)
	require.Equal(t, "10.0.0.1:7070", tx.Leader)
	var g clientv1.GetReply
	require.NoError(t, call(cc, clientv1.Client_Get_FullMethodName, &clientv1.GetRequest{Key: []byte("k")}, &g))
	require.Equal(t, clientv1.Code_NOT_LEADER, g.Code)
	var rg clientv1.RangeReply
	require.NoError(t, call(cc, clientv1.Client_Range_FullMethodName, &clientv1.RangeRequest{}, &rg))
	require.Equal(t, uint64(3), rg.Epoch)
	err = call(cc, clientv1.Client_Submit_FullMethodName, &clientv1.SubmitRequest{Session: sid[:3], RequestId: "r"}, &sub)
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "a session of 3 bytes: %v", err)
}

// TestInsecurePrincipal: on a plaintext server (loopback tests only) with
// Options.Insecure the caller names itself in metadata; without that
// metadata, or without Options.Insecure, it is refused.
func TestInsecurePrincipal(t *testing.T) {
	for _, on := range []bool{true, false} {
		l, err := leader.Open(t.TempDir(), &leader.Options{Shards: 1, Logger: quiet(), Store: store.Options{Logger: quiet()}})
		require.NoError(t, err)
		defer l.Close()
		svc, err := clientapi.New(l, &clientapi.Options{Insecure: on, Logger: quiet()})
		require.NoError(t, err)
		srv, err := grpctransport.Listen("127.0.0.1:0", &grpctransport.ServerOptions{Insecure: true, Logger: quiet(),
			Services: []grpctransport.Service{svc.GRPC()}})
		require.NoError(t, err)
		defer srv.Close()
		cc, err := grpc.NewClient(srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer cc.Close()
		sid := session.NewID()
		req := &clientv1.SubmitRequest{Session: sid[:], RequestId: "r", Payload: ops(add("n", 1))}
		var rep clientv1.SubmitReply
		named := metadata.AppendToOutgoingContext(context.Background(), clientapi.PrincipalMetadata, "ivan")
		err = callCtx(named, cc, clientv1.Client_Submit_FullMethodName, req, &rep)
		if !on {
			require.Equal(t, codes.Unauthenticated, grpcstatus.Code(err), "metadata without Options.Insecure: %v", err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, clientv1.Code_OK, rep.Code, rep.Message)
		_, found, err := l.For(sid).Ledger().Lookup("ivan", "r")
		require.NoError(t, err)
		require.True(t, found, "the metadata's name is the scope")
		err = callCtx(context.Background(), cc, clientv1.Client_Submit_FullMethodName, req, &rep)
		require.Equal(t, codes.Unauthenticated, grpcstatus.Code(err), "no name: %v", err)
	}
}

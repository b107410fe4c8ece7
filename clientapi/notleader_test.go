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

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/internal/clientwire"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
)

// TestNotLeader: a node serving NotLeader answers every method NotLeader
// with the leader's address and epoch as it knows them now, and refuses
// an undecodable request.
func TestNotLeader(t *testing.T) {
	p := testutil.NewTLSPair(t)
	var epoch uint64 = 3
	srv, err := grpctransport.ListenServices("127.0.0.1:0", &grpctransport.ServerOptions{
		TLS: grpctransport.ServerTLSConfig(p.Pool, p.Leader), Logger: quiet(),
		Services: []grpctransport.UnaryService{clientapi.NotLeader(func() (string, uint64) { return "10.0.0.1:7070", epoch })}})
	require.NoError(t, err)
	defer srv.Close()
	cc := dial(t, srv.Addr().String(), p, testutil.ClientCert(t, p.Certs, "oncewal://client/alice"))

	var sub clientwire.SubmitReply
	require.NoError(t, call(cc, clientwire.SubmitMethod, &clientwire.SubmitRequest{RequestID: "r"}, &sub))
	require.Equal(t, clientwire.SubmitReply{Code: clientwire.NotLeader, Leader: "10.0.0.1:7070", Epoch: 3, Message: sub.Message}, sub)
	var st clientwire.StatusReply
	require.NoError(t, call(cc, clientwire.StatusMethod, &clientwire.StatusRequest{RequestID: "r"}, &st))
	require.Equal(t, clientwire.NotLeader, st.Code)
	require.Equal(t, "10.0.0.1:7070", st.Leader)
	var op clientwire.OpenSessionReply
	require.NoError(t, call(cc, clientwire.OpenSessionMethod, &clientwire.OpenSessionRequest{}, &op))
	require.Equal(t, clientwire.NotLeader, op.Code)
	require.Equal(t, uint64(3), op.Epoch)
	_, err = grpctransportCall(cc, clientwire.SubmitMethod, []byte{1})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), "%v", err)
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
			Services: []grpctransport.UnaryService{svc.Unary()}})
		require.NoError(t, err)
		defer srv.Close()
		cc, err := grpc.NewClient(srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer cc.Close()
		sid := session.NewID()
		req := &clientwire.SubmitRequest{Session: sid, RequestID: "r", Payload: ops(add("n", 1))}
		var rep clientwire.SubmitReply
		named := metadata.AppendToOutgoingContext(context.Background(), clientapi.PrincipalMetadata, "ivan")
		err = callCtx(named, cc, clientwire.SubmitMethod, req, &rep)
		if !on {
			require.Equal(t, codes.Unauthenticated, grpcstatus.Code(err), "metadata without Options.Insecure: %v", err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, clientwire.OK, rep.Code, rep.Message)
		_, found, err := l.For(sid).Ledger().Lookup("ivan", "r")
		require.NoError(t, err)
		require.True(t, found, "the metadata's name is the scope")
		err = callCtx(context.Background(), cc, clientwire.SubmitMethod, req, &rep)
		require.Equal(t, codes.Unauthenticated, grpcstatus.Code(err), "no name: %v", err)
	}
}

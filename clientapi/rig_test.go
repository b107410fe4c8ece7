package clientapi_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// rig is a real leader in a temporary directory serving the client service
// on a real gRPC server with mutual TLS on loopback.
type rig struct {
	t    *testing.T
	l    *leader.Leader
	svc  *clientapi.Service
	addr string
	tls  testutil.TLSPair
}

func newRig(t *testing.T, lo leader.Options, so *clientapi.Options) *rig {
	t.Helper()
	lo.Logger, lo.Store.Logger = quiet(), quiet()
	l, err := leader.Open(t.TempDir(), &lo)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	if so == nil {
		so = &clientapi.Options{}
	}
	so.Logger = quiet()
	svc, err := clientapi.New(l, so)
	require.NoError(t, err)
	r := &rig{t: t, l: l, svc: svc, tls: testutil.NewTLSPair(t)}
	srv, err := grpctransport.Listen("127.0.0.1:0", &grpctransport.ServerOptions{
		TLS: grpctransport.ServerTLSConfig(r.tls.Pool, r.tls.Leader), Logger: quiet(),
		Services: []grpctransport.Service{svc.GRPC()}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	r.addr = srv.Addr().String()
	return r
}

// conn dials the rig with a client certificate naming uris.
func (r *rig) conn(uris ...string) *grpc.ClientConn {
	return dial(r.t, r.addr, r.tls, testutil.ClientCert(r.t, r.tls.Certs, uris...))
}

// client dials the rig as client name.
func (r *rig) client(name string) *grpc.ClientConn { return r.conn("oncewal://client/" + name) }

func dial(t *testing.T, addr string, p testutil.TLSPair, cert tls.Certificate) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(grpctransport.ClientTLSConfig(p.Pool, cert, ""))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// call makes one call of method with req and decodes the answer into rep;
// the error is the call's gRPC status.
func call(cc *grpc.ClientConn, method string, req, rep proto.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return callCtx(ctx, cc, method, req, rep)
}

func callCtx(ctx context.Context, cc *grpc.ClientConn, method string, req, rep proto.Message) error {
	return cc.Invoke(ctx, method, req, rep)
}

func submit(t *testing.T, cc *grpc.ClientConn, req *clientv1.SubmitRequest) *clientv1.SubmitReply {
	t.Helper()
	var rep clientv1.SubmitReply
	require.NoError(t, call(cc, clientv1.Client_Submit_FullMethodName, req, &rep))
	return &rep
}

func status(t *testing.T, cc *grpc.ClientConn, req *clientv1.StatusRequest) *clientv1.StatusReply {
	t.Helper()
	var rep clientv1.StatusReply
	require.NoError(t, call(cc, clientv1.Client_Status_FullMethodName, req, &rep))
	return &rep
}

func openSession(t *testing.T, cc *grpc.ClientConn, req *clientv1.OpenSessionRequest) *clientv1.OpenSessionReply {
	t.Helper()
	var rep clientv1.OpenSessionReply
	require.NoError(t, call(cc, clientv1.Client_OpenSession_FullMethodName, req, &rep))
	require.Equal(t, clientv1.Code_OK, rep.Code, rep.Message)
	return &rep
}

// ops is the default payload of ops.
func ops(o ...*clientv1.Op) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&clientv1.Ops{Ops: o})
	if err != nil {
		panic(err)
	}
	return b
}

func add(key string, d int64) *clientv1.Op {
	return &clientv1.Op{Kind: clientv1.Op_ADD, Key: []byte(key), Delta: d}
}

func put(key, v string) *clientv1.Op {
	return &clientv1.Op{Kind: clientv1.Op_PUT, Key: []byte(key), Value: []byte(v)}
}

// sid is the session ID a reply carries.
func sid(b []byte) (id session.ID) {
	copy(id[:], b)
	return id
}

// counter is key's counter in session id on the leader's store.
func (r *rig) counter(id session.ID, key string) int64 {
	r.t.Helper()
	n, err := r.l.For(id).Store().State().Counter(id, []byte(key))
	require.NoError(r.t, err)
	return n
}

// waitFor polls cond until it holds (a bounded wait for a state, never an
// assertion on time).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 30s")
		}
		time.Sleep(time.Millisecond)
	}
}

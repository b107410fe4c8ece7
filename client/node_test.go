package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/metadata"

	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// node is a scripted client service on a real gRPC server on loopback:
// each method answers what its script says for the n-th call (0-based) of
// that method, and the node records every request it decoded and who sent
// it. It is the seam the client is tested against: the client's behaviour
// is what it does with each answer.
type node struct {
	addr string

	mu         sync.Mutex
	submits    []*clientv1.SubmitRequest
	opens      []*clientv1.OpenSessionRequest
	statuses   []*clientv1.StatusRequest
	principals []string // per Submit: the certificate's identity, or the metadata's

	submit func(n int, r *clientv1.SubmitRequest) (*clientv1.SubmitReply, error)
	open   func(n int, r *clientv1.OpenSessionRequest) *clientv1.OpenSessionReply
	status func(n int, r *clientv1.StatusRequest) *clientv1.StatusReply
}

// testHorizon is the horizon the scripted nodes give their sessions.
const testHorizon = 10 * time.Minute

// sessionN is the n-th session a scripted node opens.
func sessionN(n int) sessionID { return sessionID{0: 0x5e, 1: byte(n + 1)} }

// is reports whether the session ID field b names id (exactly its bytes).
func is(b []byte, id sessionID) bool { return bytes.Equal(b, id[:]) }

// nodeServer is the generated client service's face of a scripted node.
type nodeServer struct {
	clientv1.UnimplementedClientServer
	t *testing.T
	n *node
}

func (s nodeServer) Submit(ctx context.Context, r *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
	n := s.n
	n.mu.Lock()
	i := len(n.submits)
	n.submits = append(n.submits, r)
	n.principals = append(n.principals, principal(ctx))
	n.mu.Unlock()
	return n.submit(i, r)
}

func (s nodeServer) OpenSession(_ context.Context, r *clientv1.OpenSessionRequest) (*clientv1.OpenSessionReply, error) {
	n := s.n
	n.mu.Lock()
	i := len(n.opens)
	n.opens = append(n.opens, r)
	n.mu.Unlock()
	return n.open(i, r), nil
}

func (s nodeServer) Status(_ context.Context, r *clientv1.StatusRequest) (*clientv1.StatusReply, error) {
	n := s.n
	if n.status == nil {
		s.t.Errorf("node: a Status its script does not expect")
		return &clientv1.StatusReply{Code: clientv1.Code_UNAVAILABLE, Message: "unscripted"}, nil
	}
	n.mu.Lock()
	i := len(n.statuses)
	n.statuses = append(n.statuses, r)
	n.mu.Unlock()
	return n.status(i, r), nil
}

// startNode serves n's scripts (nil: OK for every call, with a fresh
// session per OpenSession) under tlsConf, or plaintext if nil.
func startNode(t *testing.T, n *node, tlsConf *tls.Config) *node {
	t.Helper()
	if n.submit == nil {
		n.submit = func(int, *clientv1.SubmitRequest) (*clientv1.SubmitReply, error) {
			return &clientv1.SubmitReply{Code: clientv1.Code_OK, Lsn: 7, Epoch: 1}, nil
		}
	}
	if n.open == nil {
		n.open = func(i int, _ *clientv1.OpenSessionRequest) *clientv1.OpenSessionReply {
			id := sessionN(i)
			return &clientv1.OpenSessionReply{Code: clientv1.Code_OK, Session: id[:], Horizon: int64(testHorizon)}
		}
	}
	impl := nodeServer{t: t, n: n}
	svc := grpctransport.Service{Name: clientv1.Client_ServiceDesc.ServiceName, MaxRequest: clientv1.MaxRequest,
		Register: func(r grpc.ServiceRegistrar) { clientv1.RegisterClientServer(r, impl) }}
	s, err := grpctransport.Listen("127.0.0.1:0", &grpctransport.ServerOptions{TLS: tlsConf, Insecure: tlsConf == nil,
		Logger: quiet(), Services: []grpctransport.Service{svc}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	n.addr = s.Addr().String()
	return n
}

// principal is who the caller of ctx is: its certificate's identity, or
// (plaintext) the oncewal-principal metadata.
func principal(ctx context.Context) string {
	if id, err := grpctransport.PeerIdentity(ctx); err == nil {
		return id.String()
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(principalKey); len(v) == 1 {
		return "metadata:" + v[0]
	}
	return ""
}

func (n *node) seenSubmits() []*clientv1.SubmitRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*clientv1.SubmitRequest(nil), n.submits...)
}

func (n *node) seenOpens() []*clientv1.OpenSessionRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*clientv1.OpenSessionRequest(nil), n.opens...)
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// fastBackoff keeps the tests' retries quick; what they check is which
// attempts are made, never how long they took.
var fastBackoff = backoff.Config{BaseDelay: time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Millisecond}

// newTestClient is a plaintext client of addrs as principal "tester",
// with fast backoff; edit adjusts the options.
func newTestClient(t *testing.T, addrs []string, edit func(*Options)) *Client {
	t.Helper()
	o := &Options{Addrs: addrs, Insecure: true, Principal: "tester", Backoff: fastBackoff, Logger: quiet()}
	if edit != nil {
		edit(o)
	}
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// deadAddr is a loopback address that refuses connections: a port that
// was listened on and closed.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

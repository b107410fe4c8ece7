package client

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/metadata"

	"github.com/oncewal/oncewal/internal/clientwire"
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
	submits    []clientwire.SubmitRequest
	opens      []clientwire.OpenSessionRequest
	statuses   []clientwire.StatusRequest
	principals []string // per Submit: the certificate's identity, or the metadata's

	submit func(n int, r *clientwire.SubmitRequest) (*clientwire.SubmitReply, error)
	open   func(n int, r *clientwire.OpenSessionRequest) *clientwire.OpenSessionReply
	status func(n int, r *clientwire.StatusRequest) *clientwire.StatusReply
}

// testHorizon is the horizon the scripted nodes give their sessions.
const testHorizon = 10 * time.Minute

// sessionN is the n-th session a scripted node opens.
func sessionN(n int) clientwire.SessionID { return clientwire.SessionID{0: 0x5e, 1: byte(n + 1)} }

// startNode serves n's scripts (nil: OK for every call, with a fresh
// session per OpenSession) under tlsConf, or plaintext if nil.
func startNode(t *testing.T, n *node, tlsConf *tls.Config) *node {
	t.Helper()
	if n.submit == nil {
		n.submit = func(int, *clientwire.SubmitRequest) (*clientwire.SubmitReply, error) {
			return &clientwire.SubmitReply{Code: clientwire.OK, LSN: 7, Epoch: 1}, nil
		}
	}
	if n.open == nil {
		n.open = func(i int, _ *clientwire.OpenSessionRequest) *clientwire.OpenSessionReply {
			return &clientwire.OpenSessionReply{Code: clientwire.OK, Session: sessionN(i), Horizon: int64(testHorizon)}
		}
	}
	svc := grpctransport.UnaryService{Name: clientwire.Service, MaxRequest: clientwire.MaxFrame, Methods: map[string]grpctransport.UnaryHandler{
		"Submit": func(ctx context.Context, b []byte) ([]byte, error) {
			var r clientwire.SubmitRequest
			if err := r.Unmarshal(b); err != nil {
				t.Errorf("node: submit: %v", err)
				return nil, err
			}
			n.mu.Lock()
			i := len(n.submits)
			n.submits = append(n.submits, r)
			n.principals = append(n.principals, principal(ctx))
			n.mu.Unlock()
			rep, err := n.submit(i, &r)
			if err != nil {
				return nil, err
			}
			return rep.Marshal(), nil
		},
		"OpenSession": func(_ context.Context, b []byte) ([]byte, error) {
			var r clientwire.OpenSessionRequest
			if err := r.Unmarshal(b); err != nil {
				t.Errorf("node: open: %v", err)
				return nil, err
			}
			n.mu.Lock()
			i := len(n.opens)
			n.opens = append(n.opens, r)
			n.mu.Unlock()
			return n.open(i, &r).Marshal(), nil
		},
		"Status": func(_ context.Context, b []byte) ([]byte, error) {
			var r clientwire.StatusRequest
			if err := r.Unmarshal(b); err != nil {
				t.Errorf("node: status: %v", err)
				return nil, err
			}
			n.mu.Lock()
			i := len(n.statuses)
			n.statuses = append(n.statuses, r)
			n.mu.Unlock()
			return n.status(i, &r).Marshal(), nil
		},
	}}
	s, err := grpctransport.Listen("127.0.0.1:0", &grpctransport.ServerOptions{TLS: tlsConf, Insecure: tlsConf == nil,
		Logger: quiet(), Services: []grpctransport.UnaryService{svc}})
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

func (n *node) seenSubmits() []clientwire.SubmitRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]clientwire.SubmitRequest(nil), n.submits...)
}

func (n *node) seenOpens() []clientwire.OpenSessionRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]clientwire.OpenSessionRequest(nil), n.opens...)
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

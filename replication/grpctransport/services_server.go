package grpctransport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/oncewal/oncewal/snapshot"
	"google.golang.org/grpc"
)

// ServiceServer serves Services (ServerOptions.Services) and, if
// ServerOptions.Snapshots is set, snapshots — without replication: a node
// that does not lead — a follower — answers the client service on it (with
// "not leader") and lets a peer that won an election catch a shard up from
// its stores, under the same TLS and identity rules as a Server (a
// replication stream is Unimplemented). Options other than TLS, Insecure,
// Logger, keepalives, Services and Snapshots are ignored.
type ServiceServer struct {
	lis      net.Listener
	once     sync.Once
	served   chan struct{}
	refused  atomic.Uint64
	identity atomic.Uint64
	stop     func()
}

// ListenServices listens on the TCP address addr and serves opts.Services
// (and opts.Snapshots) on it until Close. At least one of them is required
// (ErrBadOptions).
func ListenServices(addr string, opts *ServerOptions) (*ServiceServer, error) {
	var o ServerOptions
	if opts != nil {
		o = *opts
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	if len(o.Services) == 0 && o.Snapshots == nil {
		return nil, badOptions([]error{errors.New("ListenServices: no Services or Snapshots to serve")})
	}
	s := &ServiceServer{served: make(chan struct{})}
	creds, err := o.creds(&s.refused)
	if err != nil {
		return nil, err
	}
	if s.lis, err = net.Listen("tcp", addr); err != nil {
		return nil, fmt.Errorf("grpctransport: %w", err)
	}
	gs := o.grpcServer(creds)
	registerServices(gs, o.Services)
	if o.Snapshots != nil {
		snaps := &snapshotService{donors: snapshot.NewRouter(o.Snapshots), insecure: o.Insecure, log: o.Logger, refused: &s.identity}
		gs.RegisterService(&grpc.ServiceDesc{
			ServiceName: serviceName,
			HandlerType: (*any)(nil),
			Methods: []grpc.MethodDesc{{
				MethodName: snapshotMethodName,
				Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
					return snaps.handle(ctx, dec)
				},
			}},
		}, struct{}{})
	}
	s.stop = gs.Stop
	go func() {
		defer close(s.served)
		_ = gs.Serve(s.lis)
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *ServiceServer) Addr() net.Addr { return s.lis.Addr() }

// RefusedIdentity counts snapshot calls refused because the caller's
// certificate names no node or follower.
func (s *ServiceServer) RefusedIdentity() uint64 { return s.identity.Load() }

// RefusedTLS counts connections whose TLS handshake failed (each is logged).
func (s *ServiceServer) RefusedTLS() uint64 { return s.refused.Load() }

// Close stops the server and returns once every handler has returned and
// the listener is closed; later calls on its connections fail. Idempotent.
func (s *ServiceServer) Close() error {
	s.once.Do(func() {
		s.stop()
		<-s.served
	})
	return nil
}

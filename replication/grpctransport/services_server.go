package grpctransport

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// ServiceServer serves only UnaryServices (ServerOptions.Services), with
// neither replication nor snapshots: a node that does not lead — a follower
// — answers the client service on it (with "not leader"), under the same
// TLS rules as a Server. Options other than TLS, Insecure, Logger,
// keepalives and Services are ignored.
type ServiceServer struct {
	lis     net.Listener
	once    sync.Once
	served  chan struct{}
	refused atomic.Uint64
	stop    func()
}

// ListenServices listens on the TCP address addr and serves opts.Services
// on it until Close. At least one service is required (ErrBadOptions).
func ListenServices(addr string, opts *ServerOptions) (*ServiceServer, error) {
	var o ServerOptions
	if opts != nil {
		o = *opts
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	if len(o.Services) == 0 {
		return nil, badOptions([]error{errors.New("ListenServices: no Services to serve")})
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
	for i := range o.Services {
		o.Services[i].register(gs)
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

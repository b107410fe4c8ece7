package grpctransport

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/replication"
)

// Service is a gRPC service that a Server (or a ServiceServer) serves
// beside replication, on the same port and under the same TLS, with the
// standard protobuf codec: what protoc-gen-go-grpc generates registers it
// (ServerOptions.Services). The client service (oncewal.client.v1.Client)
// is one. Every server with services also answers the standard health
// service (grpc.health.v1.Health: SERVING while it serves) and server
// reflection, so that grpcurl and grpc_health_probe work against a node.
type Service struct {
	// Name is the full service name ("oncewal.client.v1.Client").
	Name string
	// Register registers the service on the server, e.g.
	// func(r grpc.ServiceRegistrar) { clientv1.RegisterClientServer(r, impl) }.
	Register func(grpc.ServiceRegistrar)
	// MaxRequest bounds a request message in bytes; gRPC refuses a larger
	// one (ResourceExhausted) before it reaches the service. Required. The
	// server's limit is the largest of its services' (gRPC has one per
	// server), so a service checks its own, smaller limits itself.
	MaxRequest int
}

func (u *Service) validate() error {
	var errs []error
	if u.Name == "" || u.Name == serviceName || u.Name == healthpb.Health_ServiceDesc.ServiceName {
		errs = append(errs, fmt.Errorf("service name %q is empty, the replication service's or the health service's", u.Name))
	}
	if u.Register == nil {
		errs = append(errs, fmt.Errorf("service %s has no Register", u.Name))
	}
	if u.MaxRequest <= 0 {
		errs = append(errs, fmt.Errorf("service %s: MaxRequest %d is not positive", u.Name, u.MaxRequest))
	}
	return errors.Join(errs...)
}

// registerServices registers services on gs, with the health service
// (every service and the server as a whole SERVING) and reflection.
func registerServices(gs *grpc.Server, services []Service) {
	if len(services) == 0 {
		return
	}
	hs := health.NewServer()
	for i := range services {
		services[i].Register(gs)
		hs.SetServingStatus(services[i].Name, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
}

// PeerIdentity returns the identity of the caller of the gRPC call or
// stream in ctx, from its verified client certificate.
func PeerIdentity(ctx context.Context) (pki.Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return pki.Identity{}, fmt.Errorf("%w: no peer", pki.ErrNoIdentity)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return pki.Identity{}, fmt.Errorf("%w: the peer has no verified certificate", pki.ErrNoIdentity)
	}
	return pki.IdentityOf(ti.State.VerifiedChains[0][0])
}

// mayFollow reports whether the caller in ctx may follow as hello's ID
// (a nil error), else why not, wrapping replication.ErrIdentityMismatch:
// its certificate must name a node or a follower, and by hello's ID. An
// anonymous hello claims no ID (only a Shipper serves one, a Fanout
// refuses it), so any node or follower may send it. Without TLS
// (ServerOptions.Insecure) there is no identity and the ID is taken on
// trust.
func mayFollow(ctx context.Context, insecure bool, hello replication.Ack) error {
	if insecure {
		return nil
	}
	id, err := PeerIdentity(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w: a follower's certificate must name it with the URI SAN oncewal://follower/ID (oncewal gencerts DIR --followers ID issues one)",
			replication.ErrIdentityMismatch, err)
	case id.Role == pki.RoleClient:
		return fmt.Errorf("%w: certificate names client %s, which may not follow: give the follower the certificate gencerts issued for its --id (oncewal gencerts DIR --followers ...,ID)",
			replication.ErrIdentityMismatch, id.Name)
	case hello.FollowerID != "" && id.Name != hello.FollowerID:
		return fmt.Errorf("%w: certificate names %s %s, hello says %s: give each follower the certificate gencerts issued for its --id (follower-%s.pem), or start it with --id %s",
			replication.ErrIdentityMismatch, id.Role, id.Name, hello.FollowerID, hello.FollowerID, id.Name)
	}
	return nil
}

// mayFetchSnapshot reports whether the caller in ctx may download a
// store: a node or a follower may (any one: a follower being rebuilt
// fetches from any donor), a client may not. Insecure: no identity, taken
// on trust.
func mayFetchSnapshot(ctx context.Context, insecure bool) error {
	if insecure {
		return nil
	}
	id, err := PeerIdentity(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w: only a node or a follower may fetch a snapshot", replication.ErrIdentityMismatch, err)
	case id.Role == pki.RoleClient:
		return fmt.Errorf("%w: certificate names client %s: only a node or a follower may fetch a snapshot", replication.ErrIdentityMismatch, id.Name)
	}
	return nil
}

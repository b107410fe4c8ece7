package grpctransport

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/replication"
)

// UnaryService is a service of unary methods that a Server serves beside
// replication, on the same port, under the same TLS and with the same raw
// codec (ServerOptions.Services): each call is one request frame and one
// answer frame, bytes in and bytes out. The client service
// (oncewal.client.v1.Client) is one.
type UnaryService struct {
	// Name is the full service name ("oncewal.client.v1.Client").
	Name string
	// Methods maps a method name ("Submit") to its handler.
	Methods map[string]UnaryHandler
	// MaxRequest bounds a request frame in bytes; gRPC refuses a larger
	// message (ResourceExhausted) before it reaches a handler. Required.
	MaxRequest int
}

// UnaryHandler answers one request frame. An error is the call's gRPC
// status (use status.Error for a code; any other error is Unknown).
type UnaryHandler func(ctx context.Context, req []byte) ([]byte, error)

func (u *UnaryService) validate() error {
	var errs []error
	if u.Name == "" || u.Name == serviceName {
		errs = append(errs, fmt.Errorf("service name %q is empty or the replication service's", u.Name))
	}
	if len(u.Methods) == 0 {
		errs = append(errs, fmt.Errorf("service %s has no methods", u.Name))
	}
	if u.MaxRequest <= 0 {
		errs = append(errs, fmt.Errorf("service %s: MaxRequest %d is not positive", u.Name, u.MaxRequest))
	}
	return errors.Join(errs...)
}

// register adds u to gs. The server's receive limit is the largest of its
// services' (gRPC has one per server), so each handler checks its own.
func (u *UnaryService) register(gs *grpc.Server) {
	desc := &grpc.ServiceDesc{ServiceName: u.Name, HandlerType: (*any)(nil)}
	for name, h := range u.Methods {
		desc.Methods = append(desc.Methods, grpc.MethodDesc{
			MethodName: name,
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				var in frame
				if err := dec(&in); err != nil {
					return nil, err
				}
				if len(in.b) > u.MaxRequest {
					return nil, status.Errorf(codes.ResourceExhausted, "grpctransport: %s request of %d bytes, limit %d", name, len(in.b), u.MaxRequest)
				}
				out, err := h(ctx, in.b)
				if err != nil {
					return nil, err
				}
				return &frame{out}, nil
			},
		})
	}
	gs.RegisterService(desc, struct{}{})
}

// CallUnary calls a method of a UnaryService on cc (a connection made
// with grpc.NewClient) with the raw codec: req is the request frame, the
// answer frame is returned. maxAnswer bounds the answer.
func CallUnary(ctx context.Context, cc grpc.ClientConnInterface, method string, req []byte, maxAnswer int, opts ...grpc.CallOption) ([]byte, error) {
	var out frame
	opts = append(opts, grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallRecvMsgSize(maxAnswer), grpc.MaxCallSendMsgSize(len(req)+1))
	if err := cc.Invoke(ctx, method, &frame{req}, &out, opts...); err != nil {
		return nil, err
	}
	return out.b, nil
}

// Identity is who a certificate says its holder is: a role in the
// deployment and a name (a follower's ID, a client's principal). A
// certificate names it with one URI SAN, oncewal://ROLE/NAME.
type Identity struct {
	Role string
	Name string
}

// Roles a certificate can name.
const (
	RoleNode     = "node"     // a replica: leader, follower, or either (oncewal node)
	RoleFollower = "follower" // a follower only
	RoleClient   = "client"   // a client of the client service
)

// identityScheme is the scheme of the URI SAN that names an Identity.
const identityScheme = "oncewal"

// ErrNoIdentity: a peer without a verified certificate (an insecure
// server), or a certificate that names no oncewal identity.
var ErrNoIdentity = errors.New("grpctransport: no oncewal identity")

// URI returns the URI SAN that names id.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: identityScheme, Host: id.Role, Path: "/" + id.Name}
}

func (id Identity) String() string { return id.Role + "/" + id.Name }

// IdentityOf returns the identity cert names: its one URI SAN of scheme
// oncewal, with a known role and a non-empty name without slashes. A
// certificate that names none, or more than one, is ErrNoIdentity.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var ids []Identity
	for _, u := range cert.URIs {
		if u.Scheme != identityScheme {
			continue
		}
		name := strings.TrimPrefix(u.Path, "/")
		switch {
		case u.Host != RoleNode && u.Host != RoleFollower && u.Host != RoleClient:
			return Identity{}, fmt.Errorf("%w: %s names the unknown role %q", ErrNoIdentity, u, u.Host)
		case name == "" || strings.Contains(name, "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil:
			return Identity{}, fmt.Errorf("%w: %s is not oncewal://ROLE/NAME", ErrNoIdentity, u)
		}
		ids = append(ids, Identity{Role: u.Host, Name: name})
	}
	switch len(ids) {
	case 0:
		return Identity{}, fmt.Errorf("%w: certificate %q has no oncewal:// URI SAN", ErrNoIdentity, cert.Subject.CommonName)
	case 1:
		return ids[0], nil
	}
	return Identity{}, fmt.Errorf("%w: certificate %q names %d identities", ErrNoIdentity, cert.Subject.CommonName, len(ids))
}

// PeerIdentity returns the identity of the caller of the gRPC call or
// stream in ctx, from its verified client certificate.
func PeerIdentity(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, fmt.Errorf("%w: no peer", ErrNoIdentity)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return Identity{}, fmt.Errorf("%w: the peer has no verified certificate", ErrNoIdentity)
	}
	return IdentityOf(ti.State.VerifiedChains[0][0])
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
	case id.Role == RoleClient:
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
	case id.Role == RoleClient:
		return fmt.Errorf("%w: certificate names client %s: only a node or a follower may fetch a snapshot", replication.ErrIdentityMismatch, id.Name)
	}
	return nil
}

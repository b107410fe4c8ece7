package grpctransport

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/testutil"
)

// echoService answers a UnaryCall with its caller's identity followed by
// the request's payload: grpc's interop test service, a standard
// protoc-generated service as the client service is one.
type echoService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (echoService) UnaryCall(ctx context.Context, r *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	id, err := PeerIdentity(ctx)
	if err != nil {
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	body := append([]byte(id.String()+":"), r.GetPayload().GetBody()...)
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: body}}, nil
}

func echo(maxRequest int) Service {
	return Service{Name: testgrpc.TestService_ServiceDesc.ServiceName, MaxRequest: maxRequest,
		Register: func(r grpc.ServiceRegistrar) { testgrpc.RegisterTestServiceServer(r, echoService{}) }}
}

// TestService: a service registered through ServerOptions.Services
// answers on the replication port under its mutual TLS with the standard
// protobuf codec (while replication keeps its raw frames), sees its
// caller's identity, and is refused a request over the server's limit,
// the largest service's MaxRequest. The server also answers the health
// service (SERVING, for the server and for the service) and reflection.
func TestService(t *testing.T) {
	c := certs(t)
	stls, err := serverTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Listen("127.0.0.1:0", &ServerOptions{TLS: stls, Logger: quietLogger(), Services: []Service{echo(1 << 10)}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dial := func(pair tls.Certificate) *grpc.ClientConn {
		cc, err := grpc.NewClient(s.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(ClientTLSConfig(c.CA.Pool(), pair, ""))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call := func(cc *grpc.ClientConn, body []byte) (string, error) {
		rep, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: body}})
		return string(rep.GetPayload().GetBody()), err
	}
	alice := dial(testutil.ClientCert(t, c, "oncewal://client/alice"))
	if out, err := call(alice, []byte("hi")); err != nil || out != "client/alice:hi" {
		t.Fatalf("echo = %q, %v", out, err)
	}
	if _, err := call(alice, bytes.Repeat([]byte{1}, 1<<10)); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("over the server's limit: %v", err)
	}
	// The generated follower certificate names its follower; one without
	// a URI SAN names no identity.
	fpair, err := c.FollowerPair()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := call(dial(fpair), nil); err != nil || out != "follower/"+pki.DefaultFollower+":" {
		t.Errorf("follower certificate: %q, %v", out, err)
	}
	if _, err := call(dial(testutil.ClientCert(t, c)), nil); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "no oncewal:// URI SAN") {
		t.Errorf("no identity: %v", err)
	}
	for _, svc := range []string{"", testgrpc.TestService_ServiceDesc.ServiceName} {
		h, err := healthpb.NewHealthClient(alice).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v, %v", svc, h.GetStatus(), err)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(alice).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rep, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, svc := range rep.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	if !slices.Contains(names, testgrpc.TestService_ServiceDesc.ServiceName) || !slices.Contains(names, healthpb.Health_ServiceDesc.ServiceName) {
		t.Errorf("reflection lists %v", names)
	}
}

func TestIdentityOf(t *testing.T) {
	c := certs(t)
	for _, tc := range []struct {
		uris []string
		want pki.Identity
		err  string
	}{
		{[]string{"oncewal://follower/f1"}, pki.Identity{Role: pki.RoleFollower, Name: "f1"}, ""},
		{[]string{"https://example.com/x", "oncewal://client/bank"}, pki.Identity{Role: pki.RoleClient, Name: "bank"}, ""},
		{[]string{"oncewal://node/n3"}, pki.Identity{Role: pki.RoleNode, Name: "n3"}, ""},
		{nil, pki.Identity{}, "no oncewal:// URI SAN"},
		{[]string{"oncewal://admin/x"}, pki.Identity{}, "unknown role"},
		{[]string{"oncewal://client/"}, pki.Identity{}, "not oncewal://ROLE/NAME"},
		{[]string{"oncewal://client/a/b"}, pki.Identity{}, "not oncewal://ROLE/NAME"},
		{[]string{"oncewal://client/a", "oncewal://follower/a"}, pki.Identity{}, "names 2 identities"},
	} {
		pair := testutil.ClientCert(t, c, tc.uris...)
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		got, err := pki.IdentityOf(cert)
		if tc.err != "" {
			if !errors.Is(err, pki.ErrNoIdentity) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want pki.ErrNoIdentity with %q", tc.uris, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %v, %v; want %v", tc.uris, got, err, tc.want)
		}
		if u := got.URI().String(); u != tc.uris[len(tc.uris)-1] {
			t.Errorf("URI() = %s, want %s", u, tc.uris[len(tc.uris)-1])
		}
	}
}

func TestServicesValidate(t *testing.T) {
	reg := func(grpc.ServiceRegistrar) {}
	o := &ServerOptions{Insecure: true, Services: []Service{
		{Name: "", Register: reg, MaxRequest: 1},
		{Name: "a.B", MaxRequest: 0},
		{Name: "grpc.health.v1.Health", Register: reg, MaxRequest: 1},
		{Name: "c.D", Register: reg, MaxRequest: 1},
		{Name: "c.D", Register: reg, MaxRequest: 1},
	}}
	err := o.Validate()
	for _, want := range []string{`service name ""`, "a.B has no Register", "MaxRequest 0", `"grpc.health.v1.Health" is empty, the replication service's or the health service's`, "c.D given twice"} {
		if !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q", err, want)
		}
	}
}

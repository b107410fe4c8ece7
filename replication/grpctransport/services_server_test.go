package grpctransport

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/testutil"
)

// TestListenServices: a ServiceServer answers its services under mutual TLS
// and serves no replication stream; without services it is refused before
// binding anything.
func TestListenServices(t *testing.T) {
	if _, err := ListenServices("127.0.0.1:0", &ServerOptions{Insecure: true}); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("no services: %v", err)
	}
	c := certs(t)
	stls, err := serverTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	who := UnaryService{Name: "oncewal.test.v1.Who", MaxRequest: 64, Methods: map[string]UnaryHandler{
		"Who": func(ctx context.Context, _ []byte) ([]byte, error) {
			id, err := PeerIdentity(ctx)
			if err != nil {
				return nil, status.Error(codes.PermissionDenied, err.Error())
			}
			return []byte(id.String()), nil
		},
	}}
	s, err := ListenServices("127.0.0.1:0", &ServerOptions{TLS: stls, Logger: quietLogger(), Services: []UnaryService{who}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cc, err := grpc.NewClient(s.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(
		ClientTLSConfig(c.CA.Pool(), testutil.ClientCert(t, c, "oncewal://client/bob"), ""))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := CallUnary(ctx, cc, "/oncewal.test.v1.Who/Who", nil, 64); err != nil || string(out) != "client/bob" {
		t.Fatalf("Who = %q, %v", out, err)
	}
	if _, err := CallUnary(ctx, cc, fullMethod, nil, 64); status.Code(err) != codes.Unimplemented {
		t.Errorf("replication on a services-only server: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := CallUnary(ctx, cc, "/oncewal.test.v1.Who/Who", nil, 64); err == nil {
		t.Error("a call after Close succeeded")
	}
}

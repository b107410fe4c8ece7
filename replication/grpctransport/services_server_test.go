package grpctransport

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
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
	s, err := ListenServices("127.0.0.1:0", &ServerOptions{TLS: stls, Logger: quietLogger(), Services: []Service{echo(64)}})
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
	who := func() (string, error) {
		rep, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testpb.SimpleRequest{})
		return string(rep.GetPayload().GetBody()), err
	}
	if out, err := who(); err != nil || out != "client/bob:" {
		t.Fatalf("who = %q, %v", out, err)
	}
	stream, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, fullMethod, grpc.ForceCodecV2(rawCodec{}))
	if err == nil {
		err = stream.RecvMsg(&frame{})
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("replication on a services-only server: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := who(); err == nil {
		t.Error("a call after Close succeeded")
	}
}

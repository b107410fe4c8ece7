package grpctransport

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/testutil"
)

// TestUnaryService: a service registered through ServerOptions.Services
// answers on the replication port under its mutual TLS, sees its caller's
// identity, and refuses a request over its own limit even though the
// server's gRPC limit is the largest service's.
func TestUnaryService(t *testing.T) {
	c := certs(t)
	stls, err := serverTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	echo := UnaryService{
		Name:       "oncewal.test.v1.Echo",
		MaxRequest: 64,
		Methods: map[string]UnaryHandler{
			"Echo": func(ctx context.Context, req []byte) ([]byte, error) {
				id, err := PeerIdentity(ctx)
				if err != nil {
					return nil, status.Error(codes.PermissionDenied, err.Error())
				}
				return append([]byte(id.String()+":"), req...), nil
			},
		},
	}
	big := UnaryService{Name: "oncewal.test.v1.Big", MaxRequest: 1 << 16, Methods: map[string]UnaryHandler{
		"Take": func(context.Context, []byte) ([]byte, error) { return nil, nil },
	}}
	s, err := Listen("127.0.0.1:0", &ServerOptions{TLS: stls, Logger: quietLogger(), Services: []UnaryService{echo, big}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	call := func(pair tls.Certificate, method string, req []byte) ([]byte, error) {
		cc, err := grpc.NewClient(s.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(ClientTLSConfig(c.CA.Pool(), pair, ""))))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return CallUnary(ctx, cc, method, req, 1<<10)
	}
	alice := testutil.ClientCert(t, c, "oncewal://client/alice")
	out, err := call(alice, "/oncewal.test.v1.Echo/Echo", []byte("hi"))
	if err != nil || string(out) != "client/alice:hi" {
		t.Fatalf("echo = %q, %v", out, err)
	}
	if _, err := call(alice, "/oncewal.test.v1.Echo/Echo", bytes.Repeat([]byte{1}, 65)); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("over the service's limit: %v", err)
	}
	if _, err := call(alice, "/oncewal.test.v1.Big/Take", bytes.Repeat([]byte{1}, 1<<16)); err != nil {
		t.Errorf("at the big service's limit: %v", err)
	}
	// The generated follower certificate names its follower; one without
	// a URI SAN names no identity.
	fpair, err := c.FollowerPair()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := call(fpair, "/oncewal.test.v1.Echo/Echo", nil); err != nil || string(out) != "follower/"+pki.DefaultFollower+":" {
		t.Errorf("follower certificate: %q, %v", out, err)
	}
	if _, err := call(testutil.ClientCert(t, c), "/oncewal.test.v1.Echo/Echo", nil); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "no oncewal:// URI SAN") {
		t.Errorf("no identity: %v", err)
	}
}

func TestIdentityOf(t *testing.T) {
	c := certs(t)
	for _, tc := range []struct {
		uris []string
		want Identity
		err  string
	}{
		{[]string{"oncewal://follower/f1"}, Identity{RoleFollower, "f1"}, ""},
		{[]string{"https://example.com/x", "oncewal://client/bank"}, Identity{RoleClient, "bank"}, ""},
		{[]string{"oncewal://node/n3"}, Identity{RoleNode, "n3"}, ""},
		{nil, Identity{}, "no oncewal:// URI SAN"},
		{[]string{"oncewal://admin/x"}, Identity{}, "unknown role"},
		{[]string{"oncewal://client/"}, Identity{}, "not oncewal://ROLE/NAME"},
		{[]string{"oncewal://client/a/b"}, Identity{}, "not oncewal://ROLE/NAME"},
		{[]string{"oncewal://client/a", "oncewal://follower/a"}, Identity{}, "names 2 identities"},
	} {
		pair := testutil.ClientCert(t, c, tc.uris...)
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		got, err := IdentityOf(cert)
		if tc.err != "" {
			if !errors.Is(err, ErrNoIdentity) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want ErrNoIdentity with %q", tc.uris, err, tc.err)
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
	h := map[string]UnaryHandler{"M": func(context.Context, []byte) ([]byte, error) { return nil, nil }}
	o := &ServerOptions{Insecure: true, Services: []UnaryService{
		{Name: "", Methods: h, MaxRequest: 1},
		{Name: "a.B", MaxRequest: 0},
		{Name: "c.D", Methods: h, MaxRequest: 1},
		{Name: "c.D", Methods: h, MaxRequest: 1},
	}}
	err := o.Validate()
	for _, want := range []string{`service name ""`, "a.B has no methods", "MaxRequest 0", "c.D given twice"} {
		if !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q", err, want)
		}
	}
}

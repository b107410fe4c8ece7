package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// dirListing is every entry of dir with its mode and bytes: a refused run
// must leave it as it was.
func dirListing(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	out := map[string]string{}
	for _, e := range ents {
		fi, err := e.Info()
		must(t, err)
		data, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		out[e.Name()] = fmt.Sprintf("%v %x", fi.Mode(), data)
	}
	return out
}

// TestGencertsAddClient: a second gencerts run in a directory that holds a
// CA uses that CA and writes only the client it was asked for — the CA and
// the node certificates untouched — whose certificate verifies against
// ca.pem as a client certificate, loads with grpctransport's loaders naming
// oncewal://client/app2, and passes a real mutual-TLS gRPC handshake with
// the first run's node certificate as the server.
func TestGencertsAddClient(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if _, errOut, code := runCmd(t, "gencerts", dir, "--nodes", "a,b", "--hosts", "127.0.0.1"); code != exitOK {
		t.Fatalf("gencerts: %d %s", code, errOut)
	}
	before := dirListing(t, dir)
	out, errOut, code := runCmd(t, "gencerts", dir, "--clients", "app2")
	if code != exitOK || errOut != "" {
		t.Fatalf("gencerts --clients app2 over the CA: %d %s", code, errOut)
	}
	cert, key := pki.ClientFiles("app2")
	p := func(n string) string { return filepath.Join(dir, n) }
	for _, w := range []string{"using the existing CA in " + dir, "wrote " + p(cert) + ", " + p(key) + " (0600): client app2",
		"--tls-cert " + p(cert)} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	after := dirListing(t, dir)
	var added []string
	for name, v := range after {
		if old, ok := before[name]; !ok {
			added = append(added, name)
		} else if old != v {
			t.Errorf("%s changed", name)
		}
	}
	slices.Sort(added)
	if want := []string{key, cert}; !slices.Equal(added, want) {
		t.Fatalf("added %q, want %q", added, want)
	}
	if fi, err := os.Stat(p(key)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v, want 0600", key, fi.Mode(), err)
	}

	// It chains to the CA every process already trusts, as a client.
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(readFile(t, p(pki.FileCA)))) {
		t.Fatal("ca.pem holds no certificate")
	}
	block, _ := pem.Decode([]byte(readFile(t, p(cert))))
	leaf, err := x509.ParseCertificate(block.Bytes)
	must(t, err)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("the added client does not verify against ca.pem: %v", err)
	}
	if id, err := pki.IdentityOf(leaf); err != nil || id != (pki.Identity{Role: pki.RoleClient, Name: "app2"}) {
		t.Errorf("the added client names %v (%v), want client/app2", id, err)
	}

	// The repository's loaders take it, and a node of the first run
	// serves it over mutual TLS, seeing oncewal://client/app2.
	clientTLS, err := grpctransport.LoadClientTLS(p(pki.FileCA), p(cert), p(key))
	must(t, err)
	nodeCert, nodeKey := pki.NodeFiles("a")
	serverTLS, err := grpctransport.LoadServerTLS(p(pki.FileCA), p(nodeCert), p(nodeKey))
	must(t, err)
	if id, err := pki.IdentityOf(clientTLS.Certificates[0].Leaf); err != nil || id.URI().String() != "oncewal://client/app2" {
		t.Errorf("LoadClientTLS: identity %v (%v), want oncewal://client/app2", id, err)
	}
	who := grpctransport.Service{Name: testgrpc.TestService_ServiceDesc.ServiceName, MaxRequest: 64,
		Register: func(r grpc.ServiceRegistrar) { testgrpc.RegisterTestServiceServer(r, whoService{}) }}
	srv, err := grpctransport.ListenServices("127.0.0.1:0", &grpctransport.ServerOptions{TLS: serverTLS,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Services: []grpctransport.Service{who}})
	must(t, err)
	defer srv.Close()
	cc, err := grpc.NewClient(srv.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	must(t, err)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testpb.SimpleRequest{})
	if got := rep.GetPayload().GetBody(); err != nil || string(got) != "oncewal://client/app2" {
		t.Fatalf("mutual TLS between node a and the added client: %q, %v (refused handshakes %d)", got, err, srv.RefusedTLS())
	}
}

// whoService answers a UnaryCall with its caller's identity URI.
type whoService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (whoService) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	id, err := grpctransport.PeerIdentity(ctx)
	if err != nil {
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: []byte(id.URI().String())}}, nil
}

// TestGencertsAddRefusals: every CA a run cannot sign with, every file it
// would overwrite and every identity clash refuses the run — exit 1, the
// typed error naming the problem and what to do, nothing on stdout — and
// the directory is as it was; flags that mean nothing with an existing CA
// are usage errors (exit 2), all named at once.
func TestGencertsAddRefusals(t *testing.T) {
	other := filepath.Join(t.TempDir(), "other")
	if _, errOut, code := runCmd(t, "gencerts", other); code != exitOK {
		t.Fatalf("gencerts: %d %s", code, errOut)
	}
	expired, err := pki.NewCA("expired CA", time.Now().Add(-72*time.Hour), time.Now().Add(-24*time.Hour))
	must(t, err)
	expiredKey, err := expired.KeyPEM()
	must(t, err)
	put := func(name string, data []byte) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) { must(t, os.WriteFile(filepath.Join(dir, name), data, 0o600)) }
	}
	from := func(srcDir, src, name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			if srcDir == "" {
				srcDir = dir
			}
			put(name, []byte(readFile(t, filepath.Join(srcDir, src))))(t, dir)
		}
	}
	rm := func(name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) { must(t, os.Remove(filepath.Join(dir, name))) }
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		args  []string
		code  int
		want  []string
	}{
		{"CA certificate without its key", rm(pki.FileCAKey), []string{"--clients", "app2"}, exitFailure,
			[]string{pki.ErrCAMissing.Error(), "ca.pem is there but its key", "put it back"}},
		{"CA key without its certificate", rm(pki.FileCA), []string{"--clients", "app2"}, exitFailure,
			[]string{pki.ErrCAMissing.Error(), "ca-key.pem is there but", "ca.pem is not"}},
		{"another CA's key", from(other, pki.FileCAKey, pki.FileCAKey), []string{"--clients", "app2"}, exitFailure,
			[]string{pki.ErrCAKeyMismatch.Error(), "ca-key.pem is not the key of"}},
		{"corrupt ca.pem", put(pki.FileCA, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n")), []string{"--clients", "app2"}, exitFailure,
			[]string{pki.ErrBadCA.Error(), "ca.pem holds no PEM block"}},
		{"corrupt ca-key.pem", put(pki.FileCAKey, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")), []string{"--clients", "app2"}, exitFailure,
			[]string{pki.ErrBadCA.Error(), "ca-key.pem: ", "restore it from a copy"}},
		{"a leaf as the CA", func(t *testing.T, dir string) {
			from("", "node-a.pem", pki.FileCA)(t, dir)
			from("", "node-a-key.pem", pki.FileCAKey)(t, dir)
		}, []string{"--clients", "app2"}, exitFailure, []string{pki.ErrNotCA.Error(), "is not a CA"}},
		{"expired CA", func(t *testing.T, dir string) {
			put(pki.FileCA, expired.CertPEM)(t, dir)
			put(pki.FileCAKey, expiredKey)(t, dir)
		}, []string{"--clients", "app2"}, exitFailure, []string{pki.ErrCAExpired.Error(), "expired on", "make a new CA in an empty directory"}},
		{"a requested file there", nil, []string{"--clients", "app2,load"}, exitFailure,
			[]string{pki.ErrExists.Error(), "client-load.pem", "client-load-key.pem", "not overwriting"}},
		{"a requested member there", nil, []string{"--nodes", "c,a"}, exitFailure, []string{pki.ErrExists.Error(), "node-a.pem"}},
		{"a follower named as a member", nil, []string{"--followers", "b"}, exitFailure,
			[]string{pki.ErrBadName.Error(), `node-b.pem names the node "b"`}},
		{"nothing named", nil, nil, exitUsage, []string{"already holds a CA", "name the identities to add with --clients, --nodes or --followers"}},
		{"--node, --hosts without --nodes, a bad name", nil, []string{"--node", "n9", "--hosts", "db9", "--clients", "a/b"}, exitUsage,
			[]string{"--node names the leader certificate of a new CA", "add a node with --nodes NAME", "--hosts applies to --nodes certificates",
				`"a/b": byte '/'`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "certs")
			if _, errOut, code := runCmd(t, "gencerts", dir, "--nodes", "a,b", "--clients", "load", "--hosts", "127.0.0.1"); code != exitOK {
				t.Fatalf("gencerts: %d %s", code, errOut)
			}
			if tc.setup != nil {
				tc.setup(t, dir)
			}
			before := dirListing(t, dir)
			out, errOut, code := runCmd(t, append([]string{"gencerts", dir}, tc.args...)...)
			if code != tc.code || out != "" {
				t.Errorf("exit %d, want %d; stdout %q; stderr:\n%s", code, tc.code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut)
				}
			}
			if after := dirListing(t, dir); fmt.Sprint(before) != fmt.Sprint(after) {
				t.Errorf("a refused run changed the directory: %q, then %q", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
			}
		})
	}
}

// TestGencertsHelpExamples: the examples in gencerts' help run as written,
// in order (the second adds to the first's CA), in a scratch directory.
func TestGencertsHelpExamples(t *testing.T) {
	help, _, code := runCmd(t, "help", "gencerts")
	if code != exitOK {
		t.Fatalf("help gencerts: %d", code)
	}
	wd := t.TempDir()
	var ran int
	for _, line := range strings.Split(help, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "oncewal gencerts ") {
			continue
		}
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		args := strings.Fields(line)[1:]
		for i, a := range args {
			if strings.HasPrefix(a, "./") {
				args[i] = filepath.Join(wd, a)
			}
		}
		if out, errOut, code := runCmd(t, args...); code != exitOK {
			t.Errorf("%q: exit %d\n%s%s", line, code, out, errOut)
		}
		ran++
	}
	if ran < 2 {
		t.Fatalf("help gencerts has %d examples, want the first run and the one that adds to its CA:\n%s", ran, help)
	}
	if _, err := os.Stat(filepath.Join(wd, "certs", "client-app2.pem")); err != nil || !strings.Contains(help, "uses the existing CA in DIR") {
		t.Errorf("the help's add example: %v", err)
	}
}

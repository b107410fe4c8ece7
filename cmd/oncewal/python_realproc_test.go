package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// debianPython is the interpreter Debian's python3-grpcio,
// python3-protobuf and python3-grpc-tools install for (another python3
// first on PATH, such as pyenv's, may lack them).
const debianPython = "/usr/bin/python3"

// pythonWithGRPC returns the Python that has grpc and grpc_tools. Without
// one the test is skipped, unless ONCEWAL_REQUIRE_PYTHON=1 (set by
// .ci/run, which installs them) makes it fail: CI never skips it.
func pythonWithGRPC(t *testing.T) string {
	t.Helper()
	for _, py := range []string{debianPython, "python3"} {
		if exec.Command(py, "-c", "import grpc, grpc_tools, google.protobuf").Run() == nil {
			return py
		}
	}
	if os.Getenv("ONCEWAL_REQUIRE_PYTHON") == "1" {
		t.Fatal("no python3 with grpc, grpc_tools and protobuf: apt-get install python3-grpcio python3-grpc-tools python3-protobuf")
	}
	t.Skip("no python3 with grpc, grpc_tools and protobuf (apt-get install python3-grpcio python3-grpc-tools python3-protobuf)")
	return ""
}

// TestRealProcessesPythonClient: a client in another language, from the
// published .proto alone, against the built binary. Python stubs are
// generated from proto/ (grpc_tools.protoc) into a temporary directory;
// examples/python/oncewal_client.py checks its routing against
// kvroute/testdata/shards.txt, then calls a real `oncewal leader` of 4
// shards under mutual TLS with a client certificate gencerts issued: an
// account opened in its keys' shard (OK), the request retried (REPLAY,
// the same result), a transfer the balance covers and one it does not
// (both branches), the balance read back (Get) and the account's keys
// (Range), an add to a name rejected and recorded (REJECTED twice), the ID
// reused for another request (CONFLICT), and a malformed request refused
// (INVALID_ARGUMENT). Then a Go client of the same principal — another
// process, other sessions — reads the balance the Python client left.
func TestRealProcessesPythonClient(t *testing.T) {
	py := pythonWithGRPC(t)
	rp := newRealProcs(t, "f1")
	cert := rp.cert
	stubs := filepath.Join(rp.dir, "stubs")
	must(t, os.MkdirAll(stubs, 0o755))
	root, err := filepath.Abs("../..")
	must(t, err)
	gen := exec.Command(py, "-m", "grpc_tools.protoc", "-I", filepath.Join(root, "proto"), "--python_out", stubs, "--grpc_python_out", stubs,
		filepath.Join(root, "proto", "oncewal", "client", "v1", "client.proto"))
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("grpc_tools.protoc: %v\n%s", err, out)
	}

	rp.startLeader(t, 4, "py")

	certFile, keyFile := pki.ClientFiles("py")
	run := exec.Command(py, filepath.Join(root, "examples", "python", "oncewal_client.py"),
		"--addr", fmt.Sprintf("localhost:%d", rp.port), "--ca", cert(pki.FileCA), "--cert", cert(certFile), "--key", cert(keyFile),
		"--run", "py1", "--check-routing", filepath.Join(root, "kvroute", "testdata", "shards.txt"))
	run.Env = append(os.Environ(), "PYTHONPATH="+stubs)
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("the Python client: %v\n%s", err, out)
	}
	for _, want := range []string{"rows agree", "shards: 4", "open: OK", "retry: REPLAY", "transfer 30: OK succeeded=True",
		"transfer 200: OK succeeded=False", "get: OK balance=70", "range: OK keys=2", "reject: REJECTED not_counter",
		"reject again: REJECTED not_counter", "conflict: CONFLICT", "malformed: INVALID_ARGUMENT"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the Python client's output lacks %q:\n%s", want, out)
		}
	}
	tlsConf, err := grpctransport.LoadClientTLS(cert(pki.FileCA), cert(certFile), cert(keyFile))
	must(t, err)
	gc, err := client.New(&client.Options{Addrs: []string{fmt.Sprintf("localhost:%d", rp.port)}, TLS: tlsConf})
	must(t, err)
	defer gc.Close()
	kv, found, err := gc.Get(context.Background(), []byte("{acct:py1}/balance"))
	if err != nil || !found || int64(binary.LittleEndian.Uint64(kv.Value)) != 70 || kv.Version != 2 {
		t.Fatalf("the Go client reads the Python client's balance: %v %v %x version %d", err, found, kv.Value, kv.Version)
	}
}

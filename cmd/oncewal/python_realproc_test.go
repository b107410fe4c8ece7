package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/internal/pki"
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
// examples/python/oncewal_client.py then calls a real `oncewal leader`
// under mutual TLS with a client certificate gencerts issued: a session
// opened, a request run (OK), retried with the same ID (REPLAY), the ID
// reused for another payload (CONFLICT), its status (REPLAY), and a
// malformed request refused (INVALID_ARGUMENT).
func TestRealProcessesPythonClient(t *testing.T) {
	py := pythonWithGRPC(t)
	rp := newRealProcs(t, "f1")
	certs := filepath.Join(rp.dir, "pycerts")
	if _, e, err := rp.run("gencerts", certs, "--followers", "f1", "--clients", "py"); err != nil {
		t.Fatalf("gencerts: %v %s", err, e)
	}
	cert := func(n string) string { return filepath.Join(certs, n) }
	stubs := filepath.Join(rp.dir, "stubs")
	must(t, os.MkdirAll(stubs, 0o755))
	root, err := filepath.Abs("../..")
	must(t, err)
	gen := exec.Command(py, "-m", "grpc_tools.protoc", "-I", filepath.Join(root, "proto"), "--python_out", stubs, "--grpc_python_out", stubs,
		filepath.Join(root, "proto", "oncewal", "client", "v1", "client.proto"))
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("grpc_tools.protoc: %v\n%s", err, out)
	}

	ld := &proc{name: "leader", log: filepath.Join(rp.dir, "leader.log"), args: []string{"leader",
		"--dir", filepath.Join(rp.dir, "leader"), "--followers", "f1", "--listen", fmt.Sprintf("127.0.0.1:%d", rp.port),
		"--tls-ca", cert(pki.FileCA), "--tls-cert", cert(pki.FileLeader), "--tls-key", cert(pki.FileLeaderKey)}}
	reapProcs(t, []*proc{ld})
	ld.start(t, rp.bin)
	waitUntil(t, "the leader to serve", func() bool { return strings.Contains(readFile(t, ld.log), "oncewal leader: serving") })

	certFile, keyFile := pki.ClientFiles("py")
	run := exec.Command(py, filepath.Join(root, "examples", "python", "oncewal_client.py"),
		"--addr", fmt.Sprintf("localhost:%d", rp.port), "--ca", cert(pki.FileCA), "--cert", cert(certFile), "--key", cert(keyFile),
		"--request-id", "py-1")
	run.Env = append(os.Environ(), "PYTHONPATH="+stubs)
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("the Python client: %v\n%s", err, out)
	}
	for _, want := range []string{"open_session: OK", "submit: OK lsn=", "retry: REPLAY", "conflict: CONFLICT", "status: REPLAY", "malformed: INVALID_ARGUMENT"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the Python client's output lacks %q:\n%s", want, out)
		}
	}
}

package main

import (
	"crypto/tls"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/internal/etcdtest"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/node"
)

// TestNodeUsage: oncewal node refuses a bad command line with exit 2 and
// a usage error naming every problem, before it touches etcd or --dir.
func TestNodeUsage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n")
	ok := []string{"--etcd", "http://127.0.0.1:1", "--cluster", "c", "--id", "a", "--dir", dir, "--listen", "127.0.0.1:7400", "--insecure"}
	without := func(flag string) []string {
		i := slices.Index(ok, flag)
		return append(slices.Clone(ok[:i]), ok[i+2:]...)
	}
	with := func(more ...string) []string { return append(slices.Clone(ok), more...) }
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{without("--etcd"), []string{"--etcd is required"}},
		{without("--cluster"), []string{"--cluster is required"}},
		{without("--id"), []string{"--id is required"}},
		{without("--listen"), []string{"--listen is required"}},
		{with("--ack", "none"), []string{`--ack "none" is not one of one, majority, all`}},
		{with("--ack", "most"), []string{`--ack "most"`}},
		{with("--lease-ttl", "1500ms"), []string{"--lease-ttl 1.5s: give whole seconds, at least 2s"}},
		{with("--cluster", "a/b"), []string{`--cluster "a/b" holds a '/'`}},
		{with("--id", "a b"), []string{"--id:"}},
		{with("--listen", ":7400"), []string{`--listen ":7400" names no host the others can dial: give --advertise`}},
		{with("--listen", "127.0.0.1:0"), []string{"give a fixed port"}},
		{with("--shards", "0"), []string{"--shards 0 is out of range"}},
		{append(without("--etcd"), "--ack", "none"), []string{"--etcd is required", `--ack "none"`}},
		{ok[:len(ok)-1], []string{"mutual TLS needs --tls-ca, --tls-cert and --tls-key"}},
	} {
		_, errOut, code := runCmd(t, append([]string{"node"}, tc.args...)...)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d (%s)", tc.args, code, exitUsage, errOut)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, "oncewal node: ") || !strings.Contains(errOut, w) {
				t.Errorf("%q: stderr %q lacks %q", tc.args, errOut, w)
			}
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a refused command line created --dir: %v", err)
	}
	if _, errOut, code := runCmd(t, "node", "--etcd", "x", "--cluster", "c", "--id", "a", "--dir", dir,
		"--listen", ":7400", "--advertise", "db1:7400", "--insecure", "-h"); code != exitOK || errOut != "" {
		t.Errorf("-h: %d %q", code, errOut)
	}
}

// TestNodeEtcdUnreachable: a node whose etcd does not answer within
// --etcd-dial-timeout exits 1 saying so, and writes nothing in --dir.
func TestNodeEtcdUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	dead := "http://" + lis.Addr().String()
	lis.Close()
	dir := filepath.Join(t.TempDir(), "n")
	_, errOut, code := runCmd(t, "node", "--etcd", dead, "--cluster", "c", "--id", "a", "--dir", dir,
		"--listen", freeAddr(t), "--insecure", "--etcd-dial-timeout", "300ms")
	if code != exitFailure || !strings.Contains(errOut, errEtcdUnreachable.Error()) || !strings.Contains(errOut, dead+" did not answer within 300ms") {
		t.Fatalf("exit %d, stderr %s; want %d and %q", code, errOut, exitFailure, errEtcdUnreachable)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a node that could not reach etcd created --dir: %v", err)
	}
}

// TestMembersCommand: members add, remove and list edit and read the
// cluster's members in a real etcd, as node.ReadMembers sees them; a bad
// ID or action is a usage error that changes nothing.
func TestMembersCommand(t *testing.T) {
	ep := etcdtest.Start(t)
	members := func(args ...string) (string, string, int) {
		t.Helper()
		return runCmd(t, append([]string{"members", "--etcd", ep, "--cluster", "prod"}, args...)...)
	}
	if out, errOut, code := members("list"); code != exitOK || !strings.Contains(out, "cluster prod has no members") {
		t.Fatalf("list, empty: %d %q %q", code, out, errOut)
	}
	for _, id := range []string{"b", "a", "c"} {
		if out, errOut, code := members("add", id); code != exitOK || !strings.Contains(out, "added "+id) {
			t.Fatalf("add %s: %d %q %q", id, code, out, errOut)
		}
	}
	if out, _, code := members("add", "a"); code != exitOK || !strings.Contains(out, "already a member: a; members of prod: a,b,c") {
		t.Errorf("add a again: %d %q", code, out)
	}
	if out, _, code := members("remove", "b"); code != exitOK || !strings.Contains(out, "removed b; members of prod: a,c") {
		t.Errorf("remove b: %d %q", code, out)
	}
	if out, _, code := members("remove", "x"); code != exitOK || !strings.Contains(out, "not a member: x") {
		t.Errorf("remove x: %d %q", code, out)
	}
	for _, bad := range [][]string{{"add"}, {"add", "a/b"}, {"add", "a", "b"}, {"rename", "a"}, {"list", "a"}, {"add", "d", "--json"}} {
		if _, errOut, code := members(bad...); code != exitUsage || !strings.Contains(errOut, "oncewal members: ") {
			t.Errorf("%q: exit %d %q, want a usage error", bad, code, errOut)
		}
	}
	out, _, code := members("list")
	if code != exitOK || out != "a\nc\n" {
		t.Errorf("list: %d %q, want a and c", code, out)
	}
	out, _, code = members("list", "--json")
	var got struct {
		Members []string   `json:"members"`
		Term    *node.Term `json:"term"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &got) != nil || !slices.Equal(got.Members, []string{"a", "c"}) || got.Term != nil {
		t.Errorf("list --json: %d %q", code, out)
	}
	if _, errOut, code := runCmd(t, "members", "--cluster", "prod", "list"); code != exitUsage || !strings.Contains(errOut, "--etcd is required") {
		t.Errorf("no --etcd: %d %q", code, errOut)
	}
}

// TestGencertsNodes: --nodes issues node-ID.pem per member, naming
// oncewal://node/ID and valid for --hosts (each member serves with it and
// dials with it), and without --followers no follower certificate.
func TestGencertsNodes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	out, errOut, code := runCmd(t, "gencerts", dir, "--nodes", "a,b,c", "--hosts", "localhost,127.0.0.1")
	if code != exitOK {
		t.Fatalf("gencerts: %d %s", code, errOut)
	}
	if !strings.Contains(out, "oncewal node --etcd") || !strings.Contains(out, "--id b --dir /tmp/oncewal/b --listen localhost:7402") {
		t.Errorf("gencerts output: %s", out)
	}
	for _, id := range []string{"a", "b", "c"} {
		cert, key := pki.NodeFiles(id)
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, cert), filepath.Join(dir, key))
		must(t, err)
		if got, err := pki.IdentityOf(pair.Leaf); err != nil || got != (pki.Identity{Role: pki.RoleNode, Name: id}) {
			t.Errorf("%s names %v (%v), want node/%s", cert, got, err, id)
		}
		if err := pair.Leaf.VerifyHostname("localhost"); err != nil {
			t.Errorf("%s: %v", cert, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "follower-"+pki.DefaultFollower+".pem")); !os.IsNotExist(err) {
		t.Errorf("--nodes without --followers issued the default follower: %v", err)
	}
	if _, errOut, code := runCmd(t, "gencerts", filepath.Join(t.TempDir(), "x"), "--nodes", "a,a"); code != exitUsage || !strings.Contains(errOut, `node "a" is given twice`) {
		t.Errorf("--nodes a,a: %d %q", code, errOut)
	}
}

// TestNodeForeignDir: a node given another member's directory exits 1
// naming it (node.ErrForeignDir) and changes nothing there.
func TestNodeForeignDir(t *testing.T) {
	ep := etcdtest.Start(t)
	dir := filepath.Join(t.TempDir(), "b")
	g, err := node.NewGRPC(&node.GRPCOptions{Listen: freeAddr(t), Insecure: true})
	must(t, err)
	defer g.Close()
	mem := coord.NewMemory()
	defer mem.Close()
	n, err := node.Open(&node.Options{Coordinator: mem, Cluster: "prod", ID: "b", Dir: dir, Addr: "127.0.0.1:1", Transport: g})
	must(t, err)
	must(t, n.Close())
	before := readFile(t, filepath.Join(dir, "NODE"))
	_, errOut, code := runCmd(t, "node", "--etcd", ep, "--cluster", "prod", "--id", "a", "--dir", dir, "--listen", freeAddr(t), "--insecure")
	if code != exitFailure || !strings.Contains(errOut, node.ErrForeignDir.Error()) || !strings.Contains(errOut, `member \"b\" of cluster \"prod\"`) {
		t.Fatalf("exit %d, stderr %s; want %d and %q", code, errOut, exitFailure, node.ErrForeignDir)
	}
	if after := readFile(t, filepath.Join(dir, "NODE")); after != before {
		t.Errorf("NODE changed: %q → %q", before, after)
	}
}

package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestGenerateRefusesBadNames: an empty name, a slash or another byte
// outside the alphabet, a name given twice in a role, a follower named as
// the node: ErrBadName naming every problem, and nothing issued.
func TestGenerateRefusesBadNames(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want []string
	}{
		{Spec{Followers: []string{"f1", ""}}, []string{`follower: pki: bad identity name: "" is not 1-64 bytes`}},
		{Spec{Followers: []string{"a/b"}, Clients: []string{"x y"}}, []string{`"a/b": byte '/' at 1`, `"x y": byte ' ' at 1`}},
		{Spec{Followers: []string{"f1", "f1"}}, []string{`follower "f1" is given twice`}},
		{Spec{Node: "n1", Followers: []string{"n1"}}, []string{`"n1" names both the node and a follower`}},
		{Spec{Clients: []string{"app", "app"}}, []string{`client "app" is given twice`}},
		{Spec{Followers: []string{strings.Repeat("a", MaxNameLen+1)}}, []string{"is not 1-64 bytes"}},
	} {
		tc.spec.ValidFor = time.Hour
		c, err := Generate(tc.spec)
		if !errors.Is(err, ErrBadName) || c != nil {
			t.Errorf("%+v: %v, %v; want ErrBadName and nothing", tc.spec, c, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %q lacks %q", tc.spec, err, w)
			}
		}
	}
	// The same name in two roles is two identities, two files.
	if _, err := Generate(Spec{Followers: []string{"x"}, Clients: []string{"x"}, ValidFor: time.Hour}); err != nil {
		t.Errorf("follower x and client x: %v", err)
	}
}

// TestWriteDirFilesByHolder: each certificate's file names its holder, and
// WriteDir over an existing file writes none.
func TestWriteDirFilesByHolder(t *testing.T) {
	c, err := Generate(Spec{Followers: []string{"f1", "f2"}, Clients: []string{"app1"}, ValidFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := c.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := []string{"ca-key.pem", "ca.pem", "client-app1-key.pem", "client-app1.pem", "follower-f1-key.pem", "follower-f1.pem",
		"follower-f2-key.pem", "follower-f2.pem", "leader-key.pem", "leader.pem"}
	if !slices.Equal(names, want) {
		t.Errorf("files %q, want %q", names, want)
	}

	again := t.TempDir()
	if err := os.WriteFile(filepath.Join(again, "follower-f2.pem"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteDir(again); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("WriteDir over an existing file: %v", err)
	}
	if ents, _ := os.ReadDir(again); len(ents) != 1 {
		t.Errorf("WriteDir refused but wrote %d files", len(ents)-1)
	}
}

// TestNodesCertificates: each member of Spec.Nodes gets node-NAME.pem, a
// certificate naming oncewal://node/NAME, valid for the hosts, usable to
// serve and to dial; a member name that is also the leader's node or a
// follower is refused, nothing issued.
func TestNodesCertificates(t *testing.T) {
	c, err := Generate(Spec{Hosts: []string{"db1.example", "127.0.0.1"}, Nodes: []string{"a", "b"}, ValidFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := c.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		cert, key := NodeFiles(name)
		if cert != "node-"+name+".pem" || key != "node-"+name+"-key.pem" {
			t.Fatalf("NodeFiles(%s) = %s, %s", name, cert, key)
		}
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, cert), filepath.Join(dir, key))
		if err != nil {
			t.Fatalf("member %s: %v", name, err)
		}
		x, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if len(x.URIs) != 1 || x.URIs[0].String() != "oncewal://node/"+name {
			t.Errorf("member %s: URIs %v, want oncewal://node/%s", name, x.URIs, name)
		}
		if !slices.Equal(x.DNSNames, []string{"db1.example"}) || len(x.IPAddresses) != 1 || x.IPAddresses[0].String() != "127.0.0.1" {
			t.Errorf("member %s: DNS %v IPs %v, want the hosts", name, x.DNSNames, x.IPAddresses)
		}
		for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := x.Verify(x509.VerifyOptions{Roots: c.CA.Pool(), DNSName: "db1.example", KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
				t.Errorf("member %s: not valid for usage %v: %v", name, u, err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, FileLeader)); err != nil {
		t.Errorf("the leader's certificate beside the members': %v", err)
	}
	for _, s := range []Spec{{Nodes: []string{"a", "a"}}, {Nodes: []string{DefaultNode}}, {Nodes: []string{"x"}, Followers: []string{"x"}}} {
		s.ValidFor = time.Hour
		if c, err := Generate(s); !errors.Is(err, ErrBadName) || c != nil {
			t.Errorf("%+v: %v, %v; want ErrBadName and nothing", s, c, err)
		}
	}
}

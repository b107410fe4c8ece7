package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// snapshotDir is every file of dir with its mode and bytes, to show that a
// refused call wrote nothing.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(filepath.Join(dir, e.Name())) // an unreadable file is its mode
		out[e.Name()] = fmt.Sprintf("%v %x", fi.Mode(), data)
	}
	return out
}

// writtenCluster is a directory that Generate wrote: a CA, the leader's
// certificate, members a and b, follower f1 and client app1.
func writtenCluster(t *testing.T) string {
	t.Helper()
	c, err := Generate(Spec{Hosts: []string{"127.0.0.1", "db.example"}, Nodes: []string{"a", "b"}, Followers: []string{"f1"},
		Clients: []string{"app1"}, ValidFor: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "certs")
	if err := c.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestAddWithExistingCA: Add signs new identities with the CA in the
// directory and WriteDir writes only their files — the CA and every other
// file untouched — each chaining to that CA for its usage and naming its
// identity; the validity ends no later than the CA's.
func TestAddWithExistingCA(t *testing.T) {
	dir := writtenCluster(t)
	before := snapshotDir(t, dir)
	c, err := Add(dir, Spec{Clients: []string{"app2"}, Followers: []string{"f2"}, Nodes: []string{"c"},
		Hosts: []string{"db3.example"}, ValidFor: 100 * 365 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	after := snapshotDir(t, dir)
	var added []string
	for name, v := range after {
		if old, ok := before[name]; !ok {
			added = append(added, name)
		} else if old != v {
			t.Errorf("%s changed", name)
		}
	}
	slices.Sort(added)
	want := []string{"client-app2-key.pem", "client-app2.pem", "follower-f2-key.pem", "follower-f2.pem", "node-c-key.pem", "node-c.pem"}
	if !slices.Equal(added, want) {
		t.Fatalf("added %q, want %q", added, want)
	}

	caPEM, err := os.ReadFile(filepath.Join(dir, FileCA))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.pem: no certificate")
	}
	block, _ := pem.Decode(caPEM)
	caCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !c.NotAfter.Equal(caCert.NotAfter) {
		t.Errorf("NotAfter %v, want the CA's %v (100 years asked)", c.NotAfter, caCert.NotAfter)
	}
	for _, tc := range []struct {
		cert, uri, host string
		usages          []x509.ExtKeyUsage
	}{
		{"client-app2", "oncewal://client/app2", "", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"follower-f2", "oncewal://follower/f2", "", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"node-c", "oncewal://node/c", "db3.example", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}},
	} {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, tc.cert+".pem"), filepath.Join(dir, tc.cert+"-key.pem"))
		if err != nil {
			t.Fatalf("%s: %v", tc.cert, err)
		}
		if fi, err := os.Stat(filepath.Join(dir, tc.cert+"-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s key: %v %v, want 0600", tc.cert, fi.Mode(), err)
		}
		x := pair.Leaf
		if len(x.URIs) != 1 || x.URIs[0].String() != tc.uri {
			t.Errorf("%s: URIs %v, want %s", tc.cert, x.URIs, tc.uri)
		}
		for _, u := range tc.usages {
			if _, err := x.Verify(x509.VerifyOptions{Roots: pool, DNSName: tc.host, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
				t.Errorf("%s: does not verify against ca.pem for %v: %v", tc.cert, u, err)
			}
		}
		if x.NotAfter.After(caCert.NotAfter) {
			t.Errorf("%s outlives the CA: %v > %v", tc.cert, x.NotAfter, caCert.NotAfter)
		}
	}
}

// TestAddRefusals: every CA Add cannot sign with, every file already
// there and every name that would collide refuses the whole call with its
// typed error naming the problem, and nothing is written.
func TestAddRefusals(t *testing.T) {
	other, err := Generate(Spec{ValidFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	expired, err := NewCA("old CA", time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := other.CA.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	expiredKey, err := expired.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	remove := func(name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	copyFile := func(from, to string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			data, err := os.ReadFile(filepath.Join(dir, from))
			if err != nil {
				t.Fatal(err)
			}
			write(to, data)(t, dir)
		}
	}
	app2 := Spec{Clients: []string{"app2"}}
	for _, tc := range []struct {
		name  string
		setup []func(t *testing.T, dir string)
		spec  Spec
		is    error
		want  []string
	}{
		{"no CA key", []func(*testing.T, string){remove(FileCAKey)}, app2, ErrCAMissing, []string{"ca.pem is there but its key", "ca-key.pem is not"}},
		{"no CA certificate", []func(*testing.T, string){remove(FileCA)}, app2, ErrCAMissing, []string{"ca-key.pem is there but", "ca.pem is not"}},
		{"ca-key.pem a directory", []func(*testing.T, string){remove(FileCAKey), func(t *testing.T, dir string) {
			if err := os.Mkdir(filepath.Join(dir, FileCAKey), 0o700); err != nil {
				t.Fatal(err)
			}
		}}, app2, ErrBadCA, []string{"ca-key.pem: is a directory"}},
		{"another CA's key", []func(*testing.T, string){write(FileCAKey, otherKey)}, app2, ErrCAKeyMismatch, []string{"ca-key.pem is not the key of"}},
		{"garbage ca.pem", []func(*testing.T, string){write(FileCA, []byte("not a certificate\n"))}, app2, ErrBadCA, []string{"ca.pem holds no PEM block"}},
		{"truncated ca.pem", []func(*testing.T, string){func(t *testing.T, dir string) {
			data, _ := os.ReadFile(filepath.Join(dir, FileCA))
			write(FileCA, data[:len(data)/2])(t, dir)
		}}, app2, ErrBadCA, []string{"ca.pem holds no PEM block"}},
		{"corrupt DER in ca.pem", []func(*testing.T, string){write(FileCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}))},
			app2, ErrBadCA, []string{"ca.pem: x509"}},
		{"two certificates in ca.pem", []func(*testing.T, string){func(t *testing.T, dir string) {
			data, _ := os.ReadFile(filepath.Join(dir, FileCA))
			write(FileCA, append(data, other.CA.CertPEM...))(t, dir)
		}}, app2, ErrBadCA, []string{"more than one CERTIFICATE"}},
		{"a certificate as ca-key.pem", []func(*testing.T, string){copyFile(FileCA, FileCAKey)}, app2, ErrBadCA,
			[]string{`ca-key.pem holds a "CERTIFICATE" PEM block, want PRIVATE KEY or EC PRIVATE KEY`}},
		{"a leaf as the CA", []func(*testing.T, string){copyFile(FileLeader, FileCA), copyFile(FileLeaderKey, FileCAKey)}, app2, ErrNotCA,
			[]string{"is not a CA (basic constraints CA:FALSE)"}},
		{"expired CA", []func(*testing.T, string){write(FileCA, expired.CertPEM), write(FileCAKey, expiredKey)}, app2, ErrCAExpired,
			[]string{"ca.pem expired on", "make a new CA in an empty directory"}},
		{"client file there", nil, Spec{Clients: []string{"app2", "app1"}}, ErrExists,
			[]string{"client-app1.pem, ", "client-app1-key.pem; not overwriting"}},
		{"key file alone there", []func(*testing.T, string){remove("client-app1.pem")}, Spec{Clients: []string{"app1"}}, ErrExists,
			[]string{"client-app1-key.pem; not overwriting"}},
		{"member file there", []func(*testing.T, string){}, Spec{Nodes: []string{"b", "z"}}, ErrExists, []string{"node-b.pem"}},
		{"follower named as the leader's node", nil, Spec{Followers: []string{DefaultNode}}, ErrBadName,
			[]string{`leader.pem names the node "n0"; a follower of that name could then follow as it`}},
		{"follower named as a member", nil, Spec{Followers: []string{"a"}}, ErrBadName, []string{`node-a.pem names the node "a"`}},
		{"member named as a follower", nil, Spec{Nodes: []string{"f1"}}, ErrBadName, []string{`follower-f1.pem names the follower "f1"`}},
		{"nothing named", nil, Spec{}, ErrBadName, []string{"nothing to add"}},
		{"bad name", nil, Spec{Clients: []string{"a/b"}}, ErrBadName, []string{`"a/b": byte '/'`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writtenCluster(t)
			for _, f := range tc.setup {
				f(t, dir)
			}
			before := snapshotDir(t, dir)
			tc.spec.ValidFor = time.Hour
			c, err := Add(dir, tc.spec)
			if !errors.Is(err, tc.is) || c != nil {
				t.Fatalf("%v, %v; want %v and nothing", c, err, tc.is)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			if after := snapshotDir(t, dir); !slices.Equal(slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after))) || fmt.Sprint(before) != fmt.Sprint(after) {
				t.Errorf("the directory changed: %q, then %q", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
			}
		})
	}

	t.Run("unreadable CA key", func(t *testing.T) {
		dir := writtenCluster(t)
		if err := os.Chmod(filepath.Join(dir, FileCAKey), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := os.ReadFile(filepath.Join(dir, FileCAKey)); err == nil {
			t.Skip("running as a user who reads a mode-0 file (root)")
		}
		before := snapshotDir(t, dir)
		if c, err := Add(dir, Spec{Clients: []string{"app2"}, ValidFor: time.Hour}); !errors.Is(err, ErrBadCA) || !errors.Is(err, os.ErrPermission) || c != nil {
			t.Fatalf("%v, %v; want ErrBadCA wrapping the permission error", c, err)
		}
		if after := snapshotDir(t, dir); fmt.Sprint(before) != fmt.Sprint(after) {
			t.Errorf("the directory changed")
		}
	})

	// The same key in SEC 1 form ("EC PRIVATE KEY", as openssl ecparam
	// writes it) is the same CA.
	t.Run("SEC 1 CA key", func(t *testing.T) {
		dir := writtenCluster(t)
		ca, err := LoadCA(dir)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.MarshalECPrivateKey(ca.Key)
		if err != nil {
			t.Fatal(err)
		}
		write(FileCAKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))(t, dir)
		if c, err := Add(dir, Spec{Clients: []string{"app2"}, ValidFor: time.Hour}); err != nil || len(c.Clients) != 1 {
			t.Fatalf("%v, %v", c, err)
		}
	})
}

// TestWriteDirRemovesWhatItWroteOnFailure: a file that appears between
// WriteDir's check and its write refuses the call (ErrExists) and the
// files it had written are removed.
func TestWriteDirRemovesWhatItWroteOnFailure(t *testing.T) {
	dir := writtenCluster(t)
	c, err := Add(dir, Spec{Clients: []string{"x", "y"}, ValidFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	before := snapshotDir(t, dir)
	// y's files appear after the check, as if another run wrote them
	// meanwhile: c holds y twice, so the second write of its name meets
	// the first.
	c.Clients = append(c.Clients, c.Clients[1])
	err = c.WriteDir(dir)
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "appeared while writing") {
		t.Fatalf("WriteDir: %v, want ErrExists", err)
	}
	if after := snapshotDir(t, dir); fmt.Sprint(before) != fmt.Sprint(after) {
		t.Errorf("WriteDir failed but left %q (had %q)", slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)))
	}
}

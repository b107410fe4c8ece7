package grpctransport

import (
	"context"
	"crypto/x509"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/wal"
)

// TestIdentityOfReadsPKI: what package pki issues (it cannot import this
// package) is what IdentityOf reads: the URI SAN of each role and name,
// and the one Identity.URI makes.
func TestIdentityOfReadsPKI(t *testing.T) {
	c := certs(t)
	for _, want := range []pki.Identity{{Role: pki.RoleNode, Name: "n0"}, {Role: pki.RoleFollower, Name: "f.2_x-Y"}, {Role: pki.RoleClient, Name: "app1"}} {
		if got, want := pki.IdentityURI(want.Role, want.Name).String(), want.URI().String(); got != want {
			t.Errorf("pki names %s, Identity.URI %s", got, want)
		}
		hosts := []string(nil)
		if want.Role == pki.RoleNode {
			hosts = []string{"localhost"}
		}
		l, err := c.CA.IssueIdentity(want.Role, want.Name, hosts, c.CA.Cert.NotBefore, c.CA.Cert.NotAfter)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := l.Pair()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := pki.IdentityOf(pair.Leaf); err != nil || got != want {
			t.Errorf("pki.IdentityOf(%s's certificate) = %v, %v", want, got, err)
		}
	}
	if got, err := pki.IdentityOf(mustLeaf(t, c.Leader)); err != nil || got != (pki.Identity{Role: pki.RoleNode, Name: pki.DefaultNode}) {
		t.Errorf("the leader's certificate names %v, %v", got, err)
	}
	if _, err := c.CA.IssueIdentity(pki.RoleFollower, "a/b", nil, c.CA.Cert.NotBefore, c.CA.Cert.NotAfter); !errors.Is(err, pki.ErrBadName) {
		t.Errorf("a name with a slash: %v, want pki.ErrBadName", err)
	}
}

func mustLeaf(t *testing.T, l pki.Leaf) *x509.Certificate {
	t.Helper()
	pair, err := l.Pair()
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf
}

// TestForgedFollowerIDRefused runs a real leader of followers f1 and f2
// over mutual TLS. A follower f2 holding f1's valid certificate, and one
// holding a client's certificate, are refused before the leader's Fanout
// sees their hello: the follower's Serve stops with
// replication.ErrIdentityMismatch and the reason, counts it by reason and
// logs it; the leader logs it and counts it; nothing is applied and f2's
// Fanout never accepts their stream. f2 with its own certificate is then served, and a
// quorum of both followers' acks forms.
func TestForgedFollowerIDRefused(t *testing.T) {
	checkGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srvLog, srvRec := newLogRecorder()
	srv, _ := mtls(t, srvLog)
	dir := t.TempDir()
	l, err := leader.Open(filepath.Join(dir, "leader"), &leader.Options{
		Shards:    1,
		Listener:  func(shard uint32) replication.Listener { return srv.Listener(shard) },
		Followers: []string{"f1", "f2"},
		Logger:    quietLogger(),
		Store:     store.Options{Logger: quietLogger()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- l.Run(runCtx) }()
	defer func() { stopRun(); <-ran }()
	s := session.NewID()
	for range 5 {
		if _, err := l.Append(wal.Event{Op: wal.OpAdd, Session: s, Key: []byte("n"), Delta: 1}); err != nil {
			t.Fatal(err)
		}
	}

	// serve runs follower id with a certificate naming role/name until it
	// stops (StopOnPermanentRefusal) or ctx ends.
	serve := func(id, role, name string, stop bool) (*follower.Follower, *logRecorder, chan error) {
		flog, frec := newLogRecorder()
		f, err := follower.Open(filepath.Join(dir, id+"-"+role+"-"+name), &follower.Options{
			Store: store.Options{ID: id, Logger: flog}, StopOnPermanentRefusal: stop,
			ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 10 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		d, err := NewDialer(srv.Addr().String(), &DialerOptions{TLS: identityTLS(t, certs(t), role, name), Logger: flog})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		done := make(chan error, 1)
		go func() { done <- f.Serve(ctx, d) }()
		return f, frec, done
	}
	for _, tc := range []struct {
		name       string
		role, cert string // the certificate follower f2 holds
		reason     string
	}{
		{"another follower's certificate", pki.RoleFollower, "f1", "certificate names follower f1, hello says f2"},
		{"a client's certificate", pki.RoleClient, "app1", "certificate names client app1, which may not follow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := srv.Stats().RefusedIdentity
			f, frec, done := serve("f2", tc.role, tc.cert, true)
			err := <-done
			if !errors.Is(err, follower.ErrPermanentRefusal) || !errors.Is(err, replication.ErrIdentityMismatch) ||
				!errors.Is(err, ErrRefused) {
				t.Fatalf("Serve: %v, want the identity refusal", err)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Serve: %v, want the reason %q", err, tc.reason)
			}
			if n := f.Stats().Link.Refusals["identity_mismatch"]; n == 0 {
				t.Errorf("link stats %+v: the refusal is not counted by its reason", f.Stats().Link)
			}
			if _, ok := frec.find("the leader refused this follower", tc.reason, "reason=identity_mismatch",
				"give this follower the certificate issued for --id f2"); !ok {
				t.Errorf("no follower log line with the reason and remedy: %q", frec.Lines())
			}
			if _, ok := srvRec.find("refused a follower whose certificate does not name its ID", "follower=f2", tc.reason); !ok {
				t.Errorf("no leader log line with the reason: %q", srvRec.Lines())
			}
			if got := srv.Stats().RefusedIdentity; got <= before {
				t.Errorf("server counted %d identity refusals, had %d", got, before)
			}
			if lsn, _ := f.Position(); lsn != 0 {
				t.Errorf("a refused follower applied up to LSN %d", lsn)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
	if st := l.Stats()[0].Shipping; st.Accepted != 0 {
		t.Fatalf("the leader's Fanout accepted %d connections of a forged identity: %+v", st.Accepted, st)
	}

	// Each with its own certificate: served, and a quorum of both forms.
	f1, _, f1Done := serve("f1", pki.RoleFollower, "f1", false)
	f2, _, f2Done := serve("f2", pki.RoleFollower, "f2", false)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := l.WaitAcked(wctx, leader.AckAll); err != nil {
		t.Fatalf("WaitAcked(all): %v; %+v", err, l.Stats())
	}
	for _, f := range []*follower.Follower{f1, f2} {
		if n, _ := f.State().Counter(s, []byte("n")); n != 5 {
			t.Errorf("a served follower counts %d, want 5", n)
		}
	}
	cancel()
	for _, done := range []chan error{f1Done, f2Done} {
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}
	for _, f := range []*follower.Follower{f1, f2} {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}
}

package grpctransport

import (
	"context"
	"crypto/tls"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"google.golang.org/grpc/credentials"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/wal"
)

// servedWAL starts a leader serving a WAL that holds a small workload, so a
// follower that got through would apply something.
func servedWAL(t *testing.T, srv *Server) *leader.Shipper {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "leader")
	w, err := wal.OpenWriter(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, evs := range recorded(t, sim.WorkloadOptions{Seed: 1, Requests: 50}).Shards[0] {
		if _, err := w.Append(1, evs); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	ship, err := leader.NewShipper(&leader.ShipperOptions{WALDir: dir, Listener: srv})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = ship.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return ship
}

func tlsPair(t *testing.T, c *pki.Certs) (*tls.Config, *tls.Config) {
	t.Helper()
	st, err := serverTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := clientTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	return st, ct
}

// TestTLSRefusals: a follower the leader must not trust, or a leader the
// follower must not trust, gets no batch: the follower's position stays 0,
// the leader's Listener never hands out the stream, and a log line on the
// refusing side says why.
func TestTLSRefusals(t *testing.T) {
	checkGoroutines(t)
	good := certs(t)
	other, err := pki.GenerateCerts(nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-48 * time.Hour)
	expiredFollower := *good
	old, err := good.CA.IssueIdentity(pki.RoleFollower, good.Followers[0].Name, nil, past, past.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	expiredFollower.Followers = []pki.Leaf{old}
	expiredLeader := *good
	if expiredLeader.Leader, err = good.CA.IssueIdentity(pki.RoleNode, pki.DefaultNode, pki.DefaultHosts, past, past.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// Follower with the right trust but a certificate from another CA.
	foreignFollower := *good
	foreignFollower.Followers = other.Followers

	type side int
	const (
		leaderRefuses side = iota
		followerRefuses
	)
	cases := []struct {
		name     string
		server   *pki.Certs
		client   func(t *testing.T) credentials.TransportCredentials
		refuser  side
		logParts []string
		auth     bool // the follower's Dial says replication.ErrAuthFailed
	}{
		{"follower cert from another CA", good, clientCreds(&foreignFollower), leaderRefuses,
			[]string{"refused follower connection", "unknown authority"}, true},
		{"follower trusts another CA", good, func(t *testing.T) credentials.TransportCredentials {
			_, ct := tlsPair(t, good)
			ct.RootCAs = other.CA.Pool()
			return credentials.NewTLS(ct)
		}, followerRefuses, []string{"TLS authentication failed", "unknown authority"}, true},
		{"no client certificate", good, func(t *testing.T) credentials.TransportCredentials {
			_, ct := tlsPair(t, good)
			ct.Certificates = nil // NewDialer refuses this; build the creds by hand
			return credentials.NewTLS(ct)
		}, leaderRefuses, []string{"refused follower connection", "didn't provide a certificate"}, true},
		{"plaintext client", good, func(*testing.T) credentials.TransportCredentials { return nil }, leaderRefuses,
			[]string{"refused follower connection", "does not look like a TLS handshake"}, false},
		{"expired follower certificate", good, clientCreds(&expiredFollower), leaderRefuses,
			[]string{"refused follower connection", "expired"}, true},
		{"expired leader certificate", &expiredLeader, clientCreds(good), followerRefuses,
			[]string{"TLS authentication failed", "expired"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			st, _ := tlsPair(t, tc.server)
			slog, srvLog := newLogRecorder()
			srv, err := Listen("127.0.0.1:0", &ServerOptions{TLS: st, Logger: slog})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			ship := servedWAL(t, srv)

			clog, cliLog := newLogRecorder()
			var d *Dialer
			if creds := tc.client(t); creds == nil {
				d, err = NewDialer(srv.Addr().String(), &DialerOptions{Insecure: true, Logger: clog})
			} else {
				// Same as NewDialer, with credentials it would not build.
				d = &Dialer{addr: srv.Addr().String(), conns: make(map[*followerConn]struct{}), creds: creds,
					opts: *(&DialerOptions{Logger: clog}).EnsureDefaults()}
			}
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()

			f, err := follower.Open(t.TempDir(), &follower.Options{Store: store.Options{Logger: quietLogger()}})
			if err != nil {
				t.Fatal(err)
			}
			sctx, stop := context.WithCancel(ctx)
			served := make(chan error, 1)
			go func() { served <- f.Serve(sctx, d) }()

			rec := srvLog
			if tc.refuser == followerRefuses {
				rec = cliLog
			}
			waitFor(t, ctx, "the refusal log line "+strings.Join(tc.logParts, " … "), func() bool {
				_, ok := rec.find(tc.logParts...)
				return ok
			})
			waitFor(t, ctx, "the follower to retry", func() bool { return d.Stats().DialFailures >= 3 })
			stop()
			if err := <-served; err != nil {
				t.Fatal(err)
			}
			line, _ := rec.find(tc.logParts...)
			t.Logf("log: %s", line)
			if lsn, _ := f.Position(); lsn != 0 {
				t.Errorf("follower applied up to LSN %d through a refused connection", lsn)
			}
			if st := f.Stats().Receiver; st.Batches != 0 {
				t.Errorf("follower received %d batches", st.Batches)
			}
			if s := srv.Stats(); s.Accepted != 0 || s.BatchesSent != 0 || s.Streams != 0 {
				t.Errorf("server stats %+v: a stream got through", s)
			}
			if s := ship.Stats(); s.Connections != 0 || s.BatchesSent != 0 {
				t.Errorf("shipper stats %+v", s)
			}
			if tc.refuser == leaderRefuses && srv.Stats().RefusedTLS == 0 {
				t.Error("server counted no refused handshake")
			}
			// The failure reaches the follower as a typed error, which its
			// redial loop counts as permanent (a retry cannot fix it).
			_, derr := d.Dial(ctx, replication.Ack{})
			if tc.auth {
				if !errors.Is(derr, replication.ErrAuthFailed) || !errors.Is(derr, replication.ErrDisconnected) {
					t.Errorf("Dial: %v, want replication.ErrAuthFailed", derr)
				}
				if l := f.Stats().Link; l.Permanent == 0 || l.Refusals["auth"] == 0 {
					t.Errorf("link stats %+v: the TLS failures are not counted as permanent", l)
				}
			} else if derr == nil {
				t.Error("Dial succeeded")
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func clientCreds(c *pki.Certs) func(t *testing.T) credentials.TransportCredentials {
	return func(t *testing.T) credentials.TransportCredentials {
		_, ct := tlsPair(t, c)
		return credentials.NewTLS(ct)
	}
}

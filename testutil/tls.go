package testutil

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
)

// TLSPair is a fresh CA and the leader (server) and follower (client)
// certificates it issued, for mutual TLS between the two ends of a test:
// grpctransport.ServerTLSConfig(p.Pool, p.Leader) on one end,
// grpctransport.ClientTLSConfig(p.Pool, p.Follower, "") on the other.
type TLSPair struct {
	// Certs holds the PEM, for a test that writes or edits it.
	Certs            *pki.Certs
	Pool             *x509.CertPool
	Leader, Follower tls.Certificate
}

// NewTLSPair generates a TLSPair valid for an hour, the leader's
// certificate for hosts (pki.DefaultHosts if none).
func NewTLSPair(t testing.TB, hosts ...string) TLSPair {
	t.Helper()
	c, err := pki.GenerateCerts(hosts, time.Hour)
	if err != nil {
		t.Fatalf("generating certificates: %v", err)
	}
	p := TLSPair{Certs: c, Pool: c.CA.Pool()}
	if p.Leader, err = c.LeaderPair(); err != nil {
		t.Fatalf("leader key pair: %v", err)
	}
	if p.Follower, err = c.FollowerPair(); err != nil {
		t.Fatalf("follower key pair: %v", err)
	}
	return p
}

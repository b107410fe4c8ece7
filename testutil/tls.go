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
// grpctransport.ClientTLSConfig(p.Pool, p.Follower, "") on the other. The
// leader's names the node pki.DefaultNode, the follower's the follower
// pki.DefaultFollower: a follower of another ID needs its own (Identity).
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

// Identity issues a certificate of p's CA naming role/name (pki.RoleNode,
// RoleFollower, RoleClient): a follower's for its ID, a client's.
func (p TLSPair) Identity(t testing.TB, role, name string) tls.Certificate {
	t.Helper()
	c := p.Certs.CA.Cert
	l, err := p.Certs.CA.IssueIdentity(role, name, nil, c.NotBefore, c.NotAfter)
	if err != nil {
		t.Fatalf("issuing %s/%s: %v", role, name, err)
	}
	pair, err := l.Pair()
	if err != nil {
		t.Fatalf("%s/%s key pair: %v", role, name, err)
	}
	return pair
}

package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
)

// TLSPair is a fresh CA and the leader (server) and follower (client)
// certificates it issued, for mutual TLS between the two ends of a test:
// grpctransport.ServerTLSConfig(p.Pool, p.Leader) on one end,
// grpctransport.ClientTLSConfig(p.Pool, p.Follower, "") on the other. The
// leader's names the node pki.DefaultNode, the follower's the follower
// pki.DefaultFollower: a follower of another ID needs its own
// (p.Certs.CA.IssueIdentity).
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

// ClientCert is a client certificate of c's CA valid for an hour whose URI
// SANs are uris ("oncewal://client/alice": pki.IdentityOf reads
// the caller's identity from it).
func ClientCert(t testing.TB, c *pki.Certs, uris ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "test-client"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.CA.Cert, &key.PublicKey, c.CA.Key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

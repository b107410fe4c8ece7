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

// ClientCert issues, from ca, a client certificate valid for an hour whose
// one URI SAN is uri: oncewal://ROLE/NAME names the holder's identity
// (grpctransport.IdentityOf), e.g. oncewal://client/alice for a client of
// the client service. Present it with the CA's pool as RootCAs.
func ClientCert(t testing.TB, ca *pki.CA, uri string) tls.Certificate {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatalf("client certificate URI %q: %v", uri, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: u.Host + u.Path},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatalf("issuing the client certificate: %v", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

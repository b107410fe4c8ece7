// Package pki makes a throwaway certificate authority and the leader's and
// follower's certificates for trying oncewal's mutual TLS locally: oncewal
// gencerts, the network demo, tests and examples. Production deployments
// bring their own PKI and load it with grpctransport.LoadServerTLS and
// LoadClientTLS. It is internal: not part of oncewal's API.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority for trying mutual TLS locally (oncewal
// gencerts, the network demo, tests). Production deployments bring their own
// PKI and only use LoadServerTLS/LoadClientTLS.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
}

// NewCA makes a self-signed ECDSA P-256 CA valid in [notBefore, notAfter].
func NewCA(name string, notBefore, notAfter time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"oncewal"}},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}

// Pool returns a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue signs an ECDSA P-256 leaf: a server certificate for hosts (DNS names
// or IP literals) when server is true, a client certificate otherwise. It
// returns the certificate and PKCS#8 key as PEM.
func (ca *CA) Issue(name string, hosts []string, server bool, notBefore, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"oncewal"}},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// DefaultHosts are the names a generated leader certificate is valid for.
var DefaultHosts = []string{"localhost", "127.0.0.1", "::1"}

// Certs is a CA with one leader (server) and one follower (client)
// certificate, all PEM.
type Certs struct {
	CA                        *CA
	LeaderCert, LeaderKey     []byte
	FollowerCert, FollowerKey []byte
}

// GenerateCerts makes a fresh CA and a leader certificate for hosts (default
// DefaultHosts) and a follower certificate, valid for validFor from an hour
// ago (the hour absorbs clock skew between machines).
func GenerateCerts(hosts []string, validFor time.Duration) (*Certs, error) {
	if len(hosts) == 0 {
		hosts = DefaultHosts
	}
	nb := time.Now().Add(-time.Hour)
	na := time.Now().Add(validFor)
	ca, err := NewCA("oncewal CA", nb, na)
	if err != nil {
		return nil, err
	}
	c := &Certs{CA: ca}
	if c.LeaderCert, c.LeaderKey, err = ca.Issue("oncewal-leader", hosts, true, nb, na); err != nil {
		return nil, err
	}
	if c.FollowerCert, c.FollowerKey, err = ca.Issue("oncewal-follower", nil, false, nb, na); err != nil {
		return nil, err
	}
	return c, nil
}

// LeaderPair is the leader's certificate and key, for
// grpctransport.ServerTLSConfig(c.CA.Pool(), pair).
func (c *Certs) LeaderPair() (tls.Certificate, error) {
	return tls.X509KeyPair(c.LeaderCert, c.LeaderKey)
}

// FollowerPair is the follower's certificate and key, for
// grpctransport.ClientTLSConfig(c.CA.Pool(), pair, "").
func (c *Certs) FollowerPair() (tls.Certificate, error) {
	return tls.X509KeyPair(c.FollowerCert, c.FollowerKey)
}

// Certificate file names WriteDir uses.
const (
	FileCA          = "ca.pem"
	FileCAKey       = "ca-key.pem"
	FileLeader      = "leader.pem"
	FileLeaderKey   = "leader-key.pem"
	FileFollower    = "follower.pem"
	FileFollowerKey = "follower-key.pem"
)

// WriteDir writes the certificates (0644) and keys (0600) into dir, creating
// it (0700). It refuses to overwrite existing files.
func (c *Certs) WriteDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := x509.MarshalPKCS8PrivateKey(c.CA.Key)
	if err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{FileCA, c.CA.CertPEM, 0o644},
		{FileCAKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: caKey}), 0o600},
		{FileLeader, c.LeaderCert, 0o644},
		{FileLeaderKey, c.LeaderKey, 0o600},
		{FileFollower, c.FollowerCert, 0o644},
		{FileFollowerKey, c.FollowerKey, 0o600},
	}
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(dir, f.name)); err == nil {
			return fmt.Errorf("pki: %s already exists; not overwriting", filepath.Join(dir, f.name))
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	for _, f := range files {
		fh, err := os.OpenFile(filepath.Join(dir, f.name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, f.mode)
		if err != nil {
			return err
		}
		_, err = fh.Write(f.data)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

package grpctransport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync/atomic"

	"github.com/oncewal/oncewal/replication"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ErrBadOptions: ServerOptions or DialerOptions are unusable (see Validate).
var ErrBadOptions = errors.New("grpctransport: bad options")

// ErrClosed: a call on a closed Server, Dialer or SnapshotClient, or on a
// connection one of them closed. It is replication.ErrClosed, the contract's
// word for a locally closed transport, so either test works.
var ErrClosed = replication.ErrClosed

// ServerTLSConfig returns the leader's mutual-TLS configuration: TLS 1.3
// only, cert as the leader's identity, and every follower must present a
// certificate that chains to ca.
func ServerTLSConfig(ca *x509.CertPool, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    ca,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
}

// ClientTLSConfig returns the follower's mutual-TLS configuration: TLS 1.3
// only, the leader's certificate must chain to ca (and name the host dialled,
// or serverName when set), and cert is presented as the follower's identity.
func ClientTLSConfig(ca *x509.CertPool, cert tls.Certificate, serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      ca,
		ServerName:   serverName,
	}
}

// LoadServerTLS reads PEM files (CA bundle, leader certificate, its key) and
// returns ServerTLSConfig for them.
func LoadServerTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	pool, cert, err := loadFiles(caFile, certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return ServerTLSConfig(pool, cert), nil
}

// LoadClientTLS reads PEM files (CA bundle, follower certificate, its key)
// and returns ClientTLSConfig for them.
func LoadClientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	pool, cert, err := loadFiles(caFile, certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return ClientTLSConfig(pool, cert, ""), nil
}

func loadFiles(caFile, certFile, keyFile string) (*x509.CertPool, tls.Certificate, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("grpctransport: CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, tls.Certificate{}, fmt.Errorf("grpctransport: CA %s: no PEM certificate found", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("grpctransport: certificate: %w", err)
	}
	return pool, cert, nil
}

// checkServerTLS enforces what this package promises for a leader: mutual
// TLS, verified against a CA pool, TLS 1.3 at least. It returns a clone.
func checkServerTLS(c *tls.Config) (*tls.Config, error) {
	var errs []error
	if c.ClientAuth != tls.RequireAndVerifyClientCert {
		errs = append(errs, fmt.Errorf("TLS.ClientAuth = %v, must be RequireAndVerifyClientCert (mutual TLS)", c.ClientAuth))
	}
	if c.ClientCAs == nil {
		errs = append(errs, errors.New("TLS.ClientCAs is required (the CA followers' certificates must chain to)"))
	}
	if len(c.Certificates) == 0 && c.GetCertificate == nil && c.GetConfigForClient == nil {
		errs = append(errs, errors.New("TLS has no server certificate"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c = c.Clone()
	c.MinVersion = max(c.MinVersion, tls.VersionTLS13)
	return c, nil
}

func checkClientTLS(c *tls.Config) (*tls.Config, error) {
	var errs []error
	if c.InsecureSkipVerify {
		errs = append(errs, errors.New("TLS.InsecureSkipVerify is not allowed (the leader must be verified)"))
	}
	if c.RootCAs == nil {
		errs = append(errs, errors.New("TLS.RootCAs is required (the CA the leader's certificate must chain to)"))
	}
	if len(c.Certificates) == 0 && c.GetClientCertificate == nil {
		errs = append(errs, errors.New("TLS has no client certificate (the leader requires one)"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c = c.Clone()
	c.MinVersion = max(c.MinVersion, tls.VersionTLS13)
	return c, nil
}

// loggedCreds logs every refused server handshake: a follower with a
// certificate from another CA, an expired one, none at all, or a plaintext
// client all end here, before any stream (and so any batch) exists.
// transportCreds picks a side's credentials: plaintext only when insecure is
// asked for, otherwise TLS after check (the side's mutual-TLS rules) passes.
func transportCreds(t *tls.Config, insecureOK bool, check func(*tls.Config) (*tls.Config, error)) (credentials.TransportCredentials, error) {
	switch {
	case t != nil && insecureOK:
		return nil, fmt.Errorf("%w: both TLS and Insecure set", ErrBadOptions)
	case insecureOK:
		return insecure.NewCredentials(), nil
	case t == nil:
		return nil, fmt.Errorf("%w: TLS is required (set Insecure only for tests/loopback)", ErrBadOptions)
	}
	cfg, err := check(t)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadOptions, err)
	}
	return credentials.NewTLS(cfg), nil
}

type loggedCreds struct {
	credentials.TransportCredentials
	log     *slog.Logger
	refused *atomic.Uint64
}

func (c loggedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.refused.Add(1)
		c.log.Warn("oncewal leader: refused follower connection: TLS handshake failed",
			"remote", raw.RemoteAddr().String(), "reason", err.Error(), "remedy", remedyAuth)
		return nil, nil, err
	}
	if ti, ok := info.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
		c.log.Debug("oncewal leader: TLS follower authenticated",
			"remote", raw.RemoteAddr().String(), "subject", ti.State.PeerCertificates[0].Subject.String())
	}
	return conn, info, nil
}

func (c loggedCreds) Clone() credentials.TransportCredentials {
	return loggedCreds{c.TransportCredentials.Clone(), c.log, c.refused}
}

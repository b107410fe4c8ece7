package grpctransport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// authProbe wraps a Dial's transport credentials to keep the TLS failure
// that gRPC only reports as text: a certificate this side could not verify
// (x509: unknown authority, expired, wrong name) or an alert from the peer
// refusing this side's certificate — which TLS 1.3 delivers on the first
// read after the handshake, so the probe also watches the connection's
// reads. The Dial then returns an error wrapping replication.ErrAuthFailed
// and the original error (errors.As(err, &x509.UnknownAuthorityError{})
// works).
type authProbe struct {
	credentials.TransportCredentials
	slot *authSlot
}

type authSlot struct {
	mu  sync.Mutex
	err error
}

func (s *authSlot) record(err error) {
	if !isAuthFailure(err) {
		return
	}
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

func (s *authSlot) get() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// isAuthFailure: err says a certificate was refused, by this side or the
// peer (not a connection that dropped mid-handshake).
func isAuthFailure(err error) bool {
	var (
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
		verify   *tls.CertificateVerificationError
		alert    tls.AlertError
		op       *net.OpError
	)
	// An alert from the peer comes as a net.OpError "remote error" (over
	// TCP; tls.AlertError over QUIC).
	return errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &hostname) ||
		errors.As(err, &verify) || (errors.As(err, &alert) && alert != 0) ||
		(errors.As(err, &op) && op.Op == "remote error")
}

func newAuthProbe(c credentials.TransportCredentials) *authProbe {
	return &authProbe{TransportCredentials: c, slot: &authSlot{}}
}

func (p *authProbe) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := p.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		p.slot.record(err)
		return nil, nil, err
	}
	// In TLS 1.3 the leader verifies this side's certificate after the
	// client's handshake is done, and says no with an alert that arrives
	// on the first read — or not at all, when the client's first write
	// meets the closed connection first (broken pipe). The leader's gRPC
	// server sends its HTTP/2 settings as soon as it accepts the
	// connection, before it reads anything, so reading one byte now gets
	// either that byte (replayed to gRPC below) or the alert.
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
	}
	first := make([]byte, 1)
	n, err := conn.Read(first)
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		p.slot.record(err)
		_ = conn.Close()
		return nil, nil, err
	}
	return &probedConn{Conn: conn, slot: p.slot, first: first[:n]}, info, nil
}

// Clone keeps the slot: gRPC may clone the credentials it is given.
func (p *authProbe) Clone() credentials.TransportCredentials {
	return &authProbe{TransportCredentials: p.TransportCredentials.Clone(), slot: p.slot}
}

// probedConn replays the byte ClientHandshake read and records an alert the
// peer sends later.
type probedConn struct {
	net.Conn
	slot  *authSlot
	first []byte
}

func (c *probedConn) Read(b []byte) (int, error) {
	if len(c.first) > 0 && len(b) > 0 {
		n := copy(b, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	n, err := c.Conn.Read(b)
	if err != nil {
		c.slot.record(err)
	}
	return n, err
}

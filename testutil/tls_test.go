package testutil_test

import (
	"crypto/tls"
	"io"
	"net"
	"testing"

	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// TestTLSPairHandshakes: the two certificates of a pair complete a mutual
// TLS handshake with each other, and not with another pair's CA.
func TestTLSPairHandshakes(t *testing.T) {
	p, other := testutil.NewTLSPair(t), testutil.NewTLSPair(t)
	for _, tc := range []struct {
		name   string
		client testutil.TLSPair // whose follower certificate and CA the client uses
		ok     bool
	}{
		{"same CA", p, true},
		{"other CA", other, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			server := &tls.Config{Certificates: []tls.Certificate{p.Leader}, ClientCAs: p.Pool, ClientAuth: tls.RequireAndVerifyClientCert}
			client := &tls.Config{Certificates: []tls.Certificate{tc.client.Follower}, RootCAs: tc.client.Pool, ServerName: "localhost"}
			a, b := net.Pipe()
			done := make(chan error, 1)
			go func() {
				s := tls.Server(a, server)
				err := s.Handshake()
				_ = s.Close()
				done <- err
			}()
			c := tls.Client(b, client)
			err := c.Handshake()
			if err == nil {
				_, _ = io.Copy(io.Discard, c) // until the server closes
			}
			_ = c.Close()
			serr := <-done
			if tc.ok {
				require.NoError(t, err)
				require.NoError(t, serr)
			} else {
				require.Error(t, err, "the client accepted a leader of another CA")
			}
		})
	}
}

package grpctransport

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
)

// CertFiles are the paths of the PEM files WriteCerts wrote: what
// LoadServerTLS (CA, Leader, LeaderKey) and LoadClientTLS (CA and a
// follower's pair) read.
type CertFiles struct {
	CA, CAKey         string
	Leader, LeaderKey string
	// Followers holds each follower's certificate and key by its ID,
	// Clients each client's by its name.
	Followers, Clients map[string]PairFiles
}

// PairFiles are the paths of a certificate and its key.
type PairFiles struct{ Cert, Key string }

// WriteCerts makes a fresh CA, a leader certificate for hosts (default
// localhost, 127.0.0.1 and ::1; it names the node n0 and is also a client
// certificate, so that node may follow as n0) and one client certificate
// per follower ID naming it (its Identity, which the leader binds the
// hello's ID to) and per client name (oncewal://client/NAME, the scope of
// its request IDs in the client service), valid for validFor, and writes
// them into dir as PEM —
// what `oncewal gencerts` writes, for tests, demos and a first deployment.
// It refuses to overwrite existing files. A deployment with its own CA
// skips it and loads its files with LoadServerTLS and LoadClientTLS.
func WriteCerts(dir string, hosts, followers, clients []string, validFor time.Duration) (CertFiles, error) {
	c, err := pki.Generate(pki.Spec{Hosts: hosts, Followers: followers, Clients: clients, ValidFor: validFor})
	if err != nil {
		return CertFiles{}, fmt.Errorf("grpctransport: certificates: %w", err)
	}
	if err := c.WriteDir(dir); err != nil {
		return CertFiles{}, fmt.Errorf("grpctransport: certificates: %w", err)
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	out := CertFiles{CA: p(pki.FileCA), CAKey: p(pki.FileCAKey), Leader: p(pki.FileLeader), LeaderKey: p(pki.FileLeaderKey),
		Followers: make(map[string]PairFiles), Clients: make(map[string]PairFiles)}
	for _, f := range c.Followers {
		cert, key := f.Files()
		out.Followers[f.Name] = PairFiles{p(cert), p(key)}
	}
	for _, cl := range c.Clients {
		cert, key := cl.Files()
		out.Clients[cl.Name] = PairFiles{p(cert), p(key)}
	}
	return out, nil
}

package grpctransport

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
)

// CertFiles are the paths of the PEM files WriteCerts wrote: what
// LoadServerTLS (CA, Leader, LeaderKey) and LoadClientTLS (CA, Follower,
// FollowerKey) read.
type CertFiles struct {
	CA, CAKey             string
	Leader, LeaderKey     string
	Follower, FollowerKey string
}

// WriteCerts makes a fresh CA, a leader (server) certificate for hosts
// (default localhost, 127.0.0.1 and ::1) and a follower (client)
// certificate, valid for validFor, and writes them into dir as PEM — what
// `oncewal gencerts` writes, for tests, demos and a first deployment. It
// refuses to overwrite existing files. A deployment with its own CA skips
// it and loads its files with LoadServerTLS and LoadClientTLS.
func WriteCerts(dir string, hosts []string, validFor time.Duration) (CertFiles, error) {
	c, err := pki.GenerateCerts(hosts, validFor)
	if err != nil {
		return CertFiles{}, fmt.Errorf("grpctransport: certificates: %w", err)
	}
	if err := c.WriteDir(dir); err != nil {
		return CertFiles{}, fmt.Errorf("grpctransport: certificates: %w", err)
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	return CertFiles{CA: p(pki.FileCA), CAKey: p(pki.FileCAKey), Leader: p(pki.FileLeader), LeaderKey: p(pki.FileLeaderKey),
		Follower: p(pki.FileFollower), FollowerKey: p(pki.FileFollowerKey)}, nil
}

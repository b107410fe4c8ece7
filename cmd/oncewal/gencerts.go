package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
)

const gencertsSynopsis = `gencerts DIR [--hosts H1,H2,…] [--days N]

Writes a fresh CA and two certificates for trying mutual TLS locally (ECDSA
P-256): ca.pem (+ ca-key.pem), leader.pem/leader-key.pem (a server
certificate for --hosts) and follower.pem/follower-key.pem (a client
certificate). Keys are written 0600. Existing files are never overwritten.`

// maxCertDays bounds --days: a hundred years is beyond any local trial, and
// days×24h must fit a time.Duration (it overflows past 106,751 days, which
// once made --days 99999999 a certificate expiring in 2246).
const maxCertDays = 36_500

func runGencerts(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("gencerts", gencertsSynopsis, stderr)
	hosts := fs.String("hosts", strings.Join(pki.DefaultHosts, ","), "names and IPs the leader certificate is valid for")
	days := fs.Int("days", 365, "validity in days")
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) != 1 {
		return usageError(fs, stderr, "need exactly one DIR")
	}
	var check flagCheck
	inRange(&check, "days", *days, 1, maxCertDays)
	var hs []string
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		check.failf("--hosts names no host")
	}
	if code, bad := check.refuse(fs, stderr); bad {
		return code
	}
	dir := pos[0]
	validFor := time.Duration(*days) * 24 * time.Hour
	c, err := pki.GenerateCerts(hs, validFor)
	if err == nil {
		err = c.WriteDir(dir)
	}
	if err != nil {
		fmt.Fprintln(stderr, "oncewal gencerts:", err)
		return exitFailure
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	fmt.Fprintf(stdout, "wrote %s, %s (0600), %s, %s (0600), %s, %s (0600)\n",
		p(pki.FileCA), p(pki.FileCAKey), p(pki.FileLeader), p(pki.FileLeaderKey),
		p(pki.FileFollower), p(pki.FileFollowerKey))
	fmt.Fprintf(stdout, "leader certificate valid for %s until %s\n\n", strings.Join(hs, ", "),
		time.Now().Add(validFor).Format(time.DateOnly))
	fmt.Fprintf(stdout, "  oncewal leader --dir /tmp/oncewal/n0 --followers f1 --listen 127.0.0.1:7070 --generate 5000 \\\n"+
		"      --tls-ca %s --tls-cert %s --tls-key %s\n", p(pki.FileCA), p(pki.FileLeader), p(pki.FileLeaderKey))
	fmt.Fprintf(stdout, "  oncewal follower --dir /tmp/oncewal/f1 --id f1 --leader localhost:7070 \\\n"+
		"      --tls-ca %s --tls-cert %s --tls-key %s\n", p(pki.FileCA), p(pki.FileFollower), p(pki.FileFollowerKey))
	return exitOK
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
)

const gencertsSynopsis = `gencerts DIR [--hosts H1,H2,…] [--node NAME] [--followers ID1,ID2,…] [--clients NAME1,…]
                  [--nodes ID1,ID2,…] [--days N]

Writes a fresh CA and one certificate per identity for trying mutual TLS
locally (ECDSA P-256): ca.pem (+ ca-key.pem); leader.pem/leader-key.pem, the
leader's server certificate for --hosts, naming the node --node (it may also
follow as --id NODE); follower-ID.pem/follower-ID-key.pem for each of
--followers; client-NAME.pem/client-NAME-key.pem for each of --clients;
node-ID.pem/node-ID-key.pem for each member of --nodes, an oncewal node
cluster (serves and dials, valid for --hosts; with --nodes, --followers
defaults to none). Each
certificate names its holder with the URI SAN oncewal://ROLE/NAME: the leader
serves a follower only under the ID its certificate names, and never a
client's. Keys are written 0600. Existing files are never overwritten; a bad
name (empty, a slash or another byte outside [A-Za-z0-9._-], given twice)
writes nothing.`

// maxCertDays bounds --days: a hundred years is beyond any local trial, and
// days×24h must fit a time.Duration (it overflows past 106,751 days, which
// once made --days 99999999 a certificate expiring in 2246).
const maxCertDays = 36_500

func runGencerts(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("gencerts", gencertsSynopsis, stderr)
	hosts := fs.String("hosts", strings.Join(pki.DefaultHosts, ","), "names and IPs the leader certificate is valid for")
	node := fs.String("node", pki.DefaultNode, "the node `NAME` the leader certificate names (oncewal://node/NAME); that node may also follow as --id NAME")
	followers := fs.String("followers", pki.DefaultFollower, "comma-separated follower `IDs`, one certificate each (follower-ID.pem), usable only by a follower run with that --id; empty: none")
	clients := fs.String("clients", "", "comma-separated client `NAMEs`, one certificate each (client-NAME.pem), for the client service; a client certificate cannot follow")
	nodes := fs.String("nodes", "", "comma-separated member `IDs` of an oncewal node cluster, one certificate each (node-ID.pem, URI SAN oncewal://node/ID, valid for --hosts), for oncewal node --id ID")
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
	validFor := time.Duration(*days) * 24 * time.Hour
	spec := pki.Spec{Hosts: hs, Node: strings.TrimSpace(*node), Followers: nameList(*followers), Clients: nameList(*clients),
		Nodes: nameList(*nodes), ValidFor: validFor}
	// A node cluster has no plain followers: the default one would only
	// be a file to ignore.
	followersSet := false
	fs.Visit(func(f *flag.Flag) { followersSet = followersSet || f.Name == "followers" })
	if len(spec.Nodes) > 0 && !followersSet {
		spec.Followers = nil
	}
	if strings.TrimSpace(*node) == "" {
		check.failf("--node is empty: name the leader's node (default %s)", pki.DefaultNode)
	}
	if err := spec.Validate(); err != nil {
		var joined interface{ Unwrap() []error }
		if errors.As(err, &joined) {
			for _, e := range joined.Unwrap() {
				check.failf("%v", e)
			}
		} else {
			check.failf("%v", err)
		}
	}
	if code, bad := check.refuse(fs, stderr); bad {
		return code
	}
	dir := pos[0]
	c, err := pki.Generate(spec)
	if err == nil {
		err = c.WriteDir(dir)
	}
	if err != nil {
		fmt.Fprintln(stderr, "oncewal gencerts:", err)
		return exitFailure
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	fmt.Fprintf(stdout, "wrote %s, %s (0600)\n", p(pki.FileCA), p(pki.FileCAKey))
	for _, l := range c.Leaves() {
		cert, key := l.Files()
		fmt.Fprintf(stdout, "wrote %s, %s (0600): %s %s\n", p(cert), p(key), l.Role, l.Name)
	}
	fmt.Fprintf(stdout, "leader certificate valid for %s until %s\n\n", strings.Join(hs, ", "),
		time.Now().Add(validFor).Format(time.DateOnly))
	if len(c.Nodes) > 0 {
		for i, n := range c.Nodes {
			cert, key := n.Files()
			fmt.Fprintf(stdout, "  oncewal node --etcd http://127.0.0.1:2379 --cluster demo --id %s --dir /tmp/oncewal/%s --listen %s \\\n"+
				"      --tls-ca %s --tls-cert %s --tls-key %s\n", n.Name, n.Name, net.JoinHostPort(hs[0], strconv.Itoa(7401+i)), p(pki.FileCA), p(cert), p(key))
		}
		return exitOK
	}
	ids := strings.Join(spec.Followers, ",")
	if ids == "" {
		ids = "ID"
	}
	fmt.Fprintf(stdout, "  oncewal leader --dir /tmp/oncewal/%s --followers %s --listen 127.0.0.1:7070 \\\n"+
		"      --tls-ca %s --tls-cert %s --tls-key %s\n", spec.Node, ids, p(pki.FileCA), p(pki.FileLeader), p(pki.FileLeaderKey))
	for _, f := range c.Followers {
		cert, key := f.Files()
		fmt.Fprintf(stdout, "  oncewal follower --dir /tmp/oncewal/%s --id %s --leader localhost:7070 \\\n"+
			"      --tls-ca %s --tls-cert %s --tls-key %s\n", f.Name, f.Name, p(pki.FileCA), p(cert), p(key))
	}
	return exitOK
}

// nameList splits a comma-separated list of names, trimming each; an
// empty element is kept for pki.Spec.Validate to refuse, an empty list is
// none.
func nameList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	out := strings.Split(s, ",")
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	return out
}

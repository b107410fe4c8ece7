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
writes nothing.

Adding identities to an existing cluster: when DIR already holds ca.pem and
ca-key.pem, gencerts uses the existing CA in DIR and issues only the
identities --followers, --clients and --nodes name (at least one): no new CA,
no leader.pem, no default follower, so every process keeps its certificates
and already trusts the new ones. --hosts applies to the --nodes certificates
(default localhost,127.0.0.1,::1) and needs --nodes; --node is refused (a
node joins with --nodes NAME). The new certificates expire with the CA at the
latest. A new follower may not take a node's name or a new member a
follower's. Any of these refuses the whole run and writes nothing: a file to
be written already there; ca.pem without ca-key.pem or the reverse; a key that
is not the CA's; a file that cannot be read or is not the expected PEM; a
certificate that is not a CA; an expired CA.

Examples:
  oncewal gencerts ./certs --followers f1,f2 --clients load
  oncewal gencerts ./certs --clients app2      # later: one more client principal, same CA`

// maxCertDays bounds --days: a hundred years is beyond any local trial, and
// days×24h must fit a time.Duration (it overflows past 106,751 days, which
// once made --days 99999999 a certificate expiring in 2246).
const maxCertDays = 36_500

func runGencerts(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("gencerts", gencertsSynopsis, stderr)
	hosts := fs.String("hosts", strings.Join(pki.DefaultHosts, ","), "names and IPs the leader certificate (and each --nodes one) is valid for; with an existing CA in DIR, only the --nodes ones")
	node := fs.String("node", pki.DefaultNode, "the node `NAME` the leader certificate names (oncewal://node/NAME); that node may also follow as --id NAME. Refused with an existing CA in DIR (use --nodes)")
	followers := fs.String("followers", pki.DefaultFollower, "comma-separated follower `IDs`, one certificate each (follower-ID.pem), usable only by a follower run with that --id; empty: none. With an existing CA in DIR: none unless given")
	clients := fs.String("clients", "", "comma-separated client `NAMEs`, one certificate each (client-NAME.pem), for the client service; a client certificate cannot follow")
	nodes := fs.String("nodes", "", "comma-separated member `IDs` of an oncewal node cluster, one certificate each (node-ID.pem, URI SAN oncewal://node/ID, valid for --hosts), for oncewal node --id ID")
	days := fs.Int("days", 365, "validity in days (with an existing CA in DIR: at most until the CA expires)")
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) != 1 {
		return usageError(fs, stderr, "need exactly one DIR")
	}
	dir := pos[0]
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// A CA's file in DIR means adding to it; a missing half is Add's to
	// report (ErrCAMissing), after the flags. A DIR that cannot be looked
	// into (a file, no permission) is WriteDir's to report, after them too.
	addMode, _ := pki.HasCA(dir)
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
	// be a file to ignore; nor does a run that adds to an existing CA
	// issue any identity it was not asked for.
	if (len(spec.Nodes) > 0 || addMode) && !set["followers"] {
		spec.Followers = nil
	}
	validate := spec.Validate
	if addMode {
		validate = spec.ValidateAdd
		if set["node"] {
			check.failf("--node names the leader certificate of a new CA, and %s already holds a CA (%s): add a node with --nodes NAME", dir, pki.FileCA)
		}
		if set["hosts"] && len(spec.Nodes) == 0 {
			check.failf("--hosts applies to --nodes certificates when adding to the CA in %s (follower and client certificates name no hosts)", dir)
		}
		if len(spec.Followers)+len(spec.Clients)+len(spec.Nodes) == 0 {
			check.failf("%s already holds a CA (%s, %s): name the identities to add with --clients, --nodes or --followers (for a new CA, choose an empty directory)",
				dir, pki.FileCA, pki.FileCAKey)
		}
	} else if strings.TrimSpace(*node) == "" {
		check.failf("--node is empty: name the leader's node (default %s)", pki.DefaultNode)
	}
	if err := validate(); err != nil {
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
	var c *pki.Certs
	var err error
	if addMode {
		c, err = pki.Add(dir, spec)
	} else {
		c, err = pki.Generate(spec)
	}
	if err == nil {
		err = c.WriteDir(dir)
	}
	if err != nil {
		fmt.Fprintln(stderr, "oncewal gencerts:", strings.ReplaceAll(err.Error(), "\n", "\noncewal gencerts: "))
		return exitFailure
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	if addMode {
		fmt.Fprintf(stdout, "using the existing CA in %s (%s, %q, valid until %s); wrote only the new identities:\n",
			dir, p(pki.FileCA), c.CA.Cert.Subject.CommonName, c.CA.Cert.NotAfter.Format(time.DateOnly))
	} else {
		fmt.Fprintf(stdout, "wrote %s, %s (0600)\n", p(pki.FileCA), p(pki.FileCAKey))
	}
	for _, l := range c.Leaves() {
		cert, key := l.Files()
		fmt.Fprintf(stdout, "wrote %s, %s (0600): %s %s\n", p(cert), p(key), l.Role, l.Name)
	}
	if addMode {
		fmt.Fprintf(stdout, "valid until %s", c.NotAfter.Format(time.DateOnly))
		if c.NotAfter.Equal(c.CA.Cert.NotAfter) {
			// Cut to the CA's end: say so when --days asked for more than
			// a day beyond it (a CA made with the same --days is seconds
			// short).
			fmt.Fprint(stdout, " (when the CA expires")
			if time.Now().Add(validFor).Sub(c.NotAfter) > 24*time.Hour {
				fmt.Fprintf(stdout, ": --days %d would outlive it", *days)
			}
			fmt.Fprint(stdout, ")")
		}
		if len(c.Nodes) > 0 {
			fmt.Fprintf(stdout, "; the node certificates for %s", strings.Join(hs, ", "))
		}
		fmt.Fprint(stdout, "\n\n")
		printAdded(stdout, c, p, hs[0])
		return exitOK
	}
	fmt.Fprintf(stdout, "leader certificate valid for %s until %s\n\n", strings.Join(hs, ", "),
		c.NotAfter.Format(time.DateOnly))
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

// printAdded says how the identities a run added to an existing CA join:
// a member is listed in etcd and started, a follower registered with the
// leader (--followers) and started, a client names its files.
func printAdded(w io.Writer, c *pki.Certs, p func(string) string, host string) {
	for _, n := range c.Nodes {
		cert, key := n.Files()
		fmt.Fprintf(w, "  oncewal members add --etcd http://127.0.0.1:2379 --cluster demo %s\n"+
			"  oncewal node --etcd http://127.0.0.1:2379 --cluster demo --id %s --dir /tmp/oncewal/%s --listen %s \\\n"+
			"      --tls-ca %s --tls-cert %s --tls-key %s\n", n.Name, n.Name, n.Name, net.JoinHostPort(host, "PORT"), p(pki.FileCA), p(cert), p(key))
	}
	for _, f := range c.Followers {
		cert, key := f.Files()
		fmt.Fprintf(w, "  # register %s: restart the leader with it in --followers\n"+
			"  oncewal follower --dir /tmp/oncewal/%s --id %s --leader localhost:7070 \\\n"+
			"      --tls-ca %s --tls-cert %s --tls-key %s\n", f.Name, f.Name, f.Name, p(pki.FileCA), p(cert), p(key))
	}
	for _, cl := range c.Clients {
		cert, key := cl.Files()
		fmt.Fprintf(w, "  oncewal load --addrs localhost:7070 --tls-ca %s --tls-cert %s --tls-key %s\n", p(pki.FileCA), p(cert), p(key))
	}
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

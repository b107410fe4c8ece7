package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/metrics"
	"github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/store"
)

const nodeSynopsis = `node --etcd URLS --cluster NAME --id ID --dir DIR --listen ADDR [--advertise ADDR]
                    [--shards N] [--ack one|majority|all] [--lease-ttl D] [--etcd-prefix P]
                    [--tls-ca F --tls-cert F --tls-key F | --insecure] [--metrics-addr ADDR]

Runs one member of a cluster with automatic failover: the same command
line on every machine but --id, --dir and --listen. The member follows
whoever leads; when the leader's etcd lease ends (it died, stopped, or
lost etcd) every member campaigns, and the winner fences the others (each
promises the new epoch in its stores and reports its position), promotes
the most advanced replica (itself, after catching up from a more advanced
member if needed, or hands the term to that member) and publishes itself
as the leader; the others follow it. Only members campaign: add each ID
with 'oncewal members add' (a node started with another ID waits, saying
so, and /readyz answers 503 until it is added). See node/doc.go.

DIR holds the member's NODE file (its cluster and ID: another cluster's or
member's DIR is refused, nothing written), DIR/replica (every shard's
store, and the WAL while it leads) and DIR/deposed (the last replica it
led and then had to rebuild as a follower, kept for an operator). The
gRPC server on --listen serves replication, snapshots and the client
service (oncewal.client.v1.Client) while leading; while following it
answers clients "not leader" with the leader's address. --advertise is
the address the others and clients reach it at (published with each term
it wins); default --listen, which must then name a host.

etcd keys, under PREFIX/NAME/: leader/LEASE (the election key of each
campaigning member, on its lease of --lease-ttl), data/members (the
replica set), data/term (the current term: epoch, winner, address,
state), data/epoch_base, data/report/ID (each member's promise to a
fencing winner).

When etcd is unreachable: a leader that cannot renew its lease stops
acknowledging writes before the lease can end (its --lease-ttl) and
steps down; nobody can win meanwhile, so the cluster refuses writes until
etcd answers again — never two leaders. Followers keep their stores and
their link to a leader that still serves.

--ack is the cluster's acknowledgement policy: every client write waits
for it (one, majority or all of the followers), and a winner's fencing
quorum is computed from it; give every member the same. A request a
dead or deposed leader was running is run afresh, once, on the client's
retry at the new leader (its claim is freed at once); --claim-lease bounds
how long a live leader's stuck handler holds a request ID. With TLS, the
certificate (--tls-cert; 'oncewal gencerts DIR --nodes a,b,c' issues one
per member, URI SAN oncewal://node/ID) both serves and dials, and must
name --advertise's host. --metrics-addr serves /metrics, /healthz and
/readyz: 200 when leading with --ack's quorum of followers connected, or
following a published leader with every shard's link up; 503 naming the
reason otherwise. One INFO or WARN line per role change. SIGINT/SIGTERM
stop it cleanly: a leader resigns, and another member takes over at
once. Exit 1 when etcd does not answer within --etcd-dial-timeout, or the
directory is another member's or in use; 2 on bad usage.`

func runNode(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("node", nodeSynopsis, stderr)
	ef := addEtcdFlags(fs)
	id := fs.String("id", "", "this member's stable ID, as 'oncewal members add' listed it (required)")
	dir := fs.String("dir", "", "the member's directory (created if missing; required)")
	listen := fs.String("listen", "", "host:port to serve replication, snapshots and clients on (required)")
	advertise := fs.String("advertise", "", "host:port the other members and clients reach this one at (default --listen)")
	shards := fs.Int("shards", 1, "the cluster's shard count (the same on every member, fixed for its lifetime)")
	ack := fs.String("ack", "majority", "the cluster's ack policy: one, majority or all of the followers")
	leaseTTL := fs.Duration("lease-ttl", coord.DefaultLeaseTTL, "etcd lease of a leadership, whole seconds >= 2s: a dead leader is succeeded about this long after its last renewal")
	claimLease := fs.Duration("claim-lease", idempotency.DefaultLease, "how long the leader running a client request holds its request ID (renewed while it runs); a new leader frees the claims of a dead or deposed one at once")
	tf := addTLSFlags(fs, "node")
	mf := addMetricsFlags(fs, false)
	lf := addLogFlags(fs)
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	var c flagCheck
	ef.check(&c)
	switch err := replication.ValidFollowerID(*id); {
	case *id == "":
		c.failf("--id is required: this member's ID (oncewal members add --etcd ... --cluster ... ID)")
	case err != nil:
		c.failf("--id: %v", err)
	}
	if *dir == "" {
		c.failf("--dir is required: the member's directory")
	}
	addr := nodeAddr(&c, *listen, *advertise)
	inRange(&c, "shards", *shards, 1, replication.MaxShards)
	policy, ackOK := parseAckPolicy(*ack)
	if !ackOK || policy == 0 {
		c.failf("--ack %q is not one of one, majority, all (a failover cannot keep what the leader alone acknowledged)", *ack)
	}
	if *leaseTTL < 2*time.Second || *leaseTTL%time.Second != 0 {
		c.failf("--lease-ttl %v: give whole seconds, at least 2s (etcd grants leases in seconds)", *leaseTTL)
	}
	inRange(&c, "claim-lease", *claimLease, 100*time.Millisecond, idempotency.MaxRetention)
	mf.check(&c)
	lf.check(&c)
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}
	log := lf.logger(stderr)
	serverTLS, code, ok := tf.open(fs, stderr, log, "oncewal node", true, "plaintext, unauthenticated; use only on loopback for tests")
	if !ok {
		return code
	}
	var dialTLS *tls.Config
	if serverTLS != nil {
		var err error
		if dialTLS, err = grpctransport.LoadClientTLS(*tf.ca, *tf.cert, *tf.key); err != nil {
			log.Error("oncewal node: TLS", "err", err)
			return exitFailure
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer stopWithin(ctx, log, "oncewal node", shutdownGrace)()
	if err := serveNode(ctx, log, nodeConfig{etcd: ef, leaseTTL: *leaseTTL, id: *id, dir: *dir, listen: *listen, addr: addr,
		shards: *shards, ack: policy, claimLease: *claimLease, serverTLS: serverTLS, dialTLS: dialTLS, metricsAddr: *mf.addr}); err != nil {
		log.Error("oncewal node: stopped", "id", *id, "dir", *dir, "err", err)
		return exitFailure
	}
	return exitOK
}

// nodeAddr checks --listen and --advertise and returns the address to
// publish: --advertise, or --listen when it names a host (an unspecified
// one, such as :7400 or 0.0.0.0:7400, is no address to dial). Port 0 is
// refused: the address is published, so it must be known before binding.
func nodeAddr(c *flagCheck, listen, advertise string) string {
	if listen == "" {
		c.failf("--listen is required: host:port to serve the other members and clients on")
		return ""
	}
	hostPort(c, "listen", listen, false)
	if _, port, err := net.SplitHostPort(listen); err == nil && port == "0" {
		c.failf("--listen %q: give a fixed port (the address is published to the other members)", listen)
	}
	if advertise != "" {
		hostPort(c, "advertise", advertise, true)
		return advertise
	}
	host, _, err := net.SplitHostPort(listen)
	if ip := net.ParseIP(host); err == nil && (host == "" || ip != nil && ip.IsUnspecified()) {
		c.failf("--listen %q names no host the others can dial: give --advertise host:port", listen)
	}
	return listen
}

type nodeConfig struct {
	etcd               *etcdFlags
	leaseTTL           time.Duration
	id, dir            string
	listen, addr       string
	shards             int
	ack                leader.AckPolicy
	claimLease         time.Duration
	serverTLS, dialTLS *tls.Config // nil: --insecure
	metricsAddr        string
}

func serveNode(ctx context.Context, log *slog.Logger, c nodeConfig) error {
	co, _, err := c.etcd.open(log, c.leaseTTL)
	if err != nil {
		return err
	}
	defer co.Close()
	cluster := *c.etcd.cluster
	g, err := node.NewGRPC(&node.GRPCOptions{Listen: c.listen, ServerTLS: c.serverTLS, DialTLS: c.dialTLS,
		Insecure: c.serverTLS == nil, Client: clientapi.Options{Logger: log}, Logger: log})
	if err != nil {
		return err
	}
	defer g.Close()
	links := newLinkTransport(g)
	so := store.Options{Logger: log}
	n, err := node.Open(&node.Options{Coordinator: co, Cluster: cluster, ID: c.id, Dir: c.dir, Shards: c.shards,
		Addr: c.addr, Transport: links, Ack: c.ack, Logger: log,
		Leader:   leader.Options{Store: so, Logger: log, Ledger: idempotency.LedgerOptions{Lease: c.claimLease}},
		Follower: follower.NodeOptions{Follower: follower.Options{Store: so}}})
	if err != nil {
		return err
	}
	defer n.Close()
	maddr, stopMetrics, err := serveMetrics(c.metricsAddr, log, nodeReady(n, links, c.ack, c.shards), nodeCollector(n))
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	defer stopMetrics()
	log.Info("oncewal node: running", "id", c.id, "cluster", cluster, "dir", c.dir, "listen", c.listen, "advertise", c.addr,
		"shards", c.shards, "ack", c.ack, "lease_ttl", c.leaseTTL, "mtls", c.serverTLS != nil, "metrics", maddr)
	if err := n.Run(ctx); err != nil {
		return err
	}
	log.Info("oncewal node: stopped", "id", c.id)
	return nil
}

// nodeReady is /readyz of a node (the synopsis says when it is ready).
func nodeReady(n *node.Node, links *linkTransport, policy leader.AckPolicy, shards int) func() error {
	return func() error {
		st := n.Status()
		switch {
		case st.NotMember:
			return metrics.NotReady("%w", node.ErrNotMember)
		case st.Role == node.RoleFencing:
			return metrics.NotReady("fencing a term it won before leading it")
		case st.Role == node.RoleLeader:
			l, err := n.Leader()
			if err != nil {
				return metrics.NotReady("stepping down: %w", err)
			}
			if err := l.Quorum(policy); err != nil {
				return metrics.NotReady("leading epoch %d without its quorum: %w", st.Epoch, err)
			}
			return nil
		case st.LeaderAddr == "":
			return metrics.NotReady("no leader published yet (a term is being decided, or etcd is unreachable)")
		}
		if err := links.up(st.LeaderAddr, shards); err != nil {
			return metrics.NotReady("following %s at %s (epoch %d): %w", st.LeaderID, st.LeaderAddr, st.Epoch, err)
		}
		return nil
	}
}

// nodeCollector exports a node's role and terms, so that a dashboard sees
// which member leads at which epoch.
func nodeCollector(n *node.Node) prometheus.Collector {
	status := func(f func(node.Status) float64) func() float64 {
		return func() float64 { return f(n.Status()) }
	}
	return collectorSet{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "oncewal_node_leading", Help: "1 while this member leads, else 0."},
			status(func(s node.Status) float64 { return boolFloat(s.Role == node.RoleLeader) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "oncewal_node_epoch", Help: "Epoch of the term this member leads or follows (0: none known)."},
			status(func(s node.Status) float64 { return float64(s.Epoch) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "oncewal_node_terms_won_total", Help: "Terms this member won since it started."},
			status(func(s node.Status) float64 { return float64(s.Terms) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "oncewal_node_promotions_total", Help: "Terms this member led since it started."},
			status(func(s node.Status) float64 { return float64(s.Promotions) })),
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// collectorSet is several collectors registered as one.
type collectorSet []prometheus.Collector

func (cs collectorSet) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

func (cs collectorSet) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}

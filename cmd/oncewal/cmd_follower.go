package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/metrics"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/prometheus/client_golang/prometheus"
)

const followerSynopsis = `follower --dir DIR --leader ADDR --id NAME [--shard N | --shards N]
                        [--tls-ca F --tls-cert F --tls-key F | --insecure]
                        [--client-listen ADDR [--client-tls-cert F --client-tls-key F] [--client-shards N]]

Replicates from the leader at ADDR (gRPC, mutual TLS unless --insecure):
with --shard N (default 0), shard N into the follower store in DIR; with
--shards N, every shard 0..N-1 of the deployment into the follower node
directory DIR (DIR/shard-NNNN, one store per shard, the layout oncewal
promote turns into a leader's). DIR is created if missing. Every distinct
event is applied exactly once, across reconnects and restarts of either
side.

--id is this follower's stable name, sent in every hello: the leader serves
only the followers registered with its --followers, one stream each, and
refuses any other (the refusal and its reason are logged here, and the
follower keeps retrying; --stop-on-refusal exits 1 instead). A DIR that is
not what was asked for (a node directory given with --shard, a single store
with --shards, a WAL or leader directory, unrelated files, a store of
another shard or with other options) is refused unchanged. Stops cleanly on
SIGINT/SIGTERM, also while a store is opening (the stores are flushed and
closed); logs its stats every --stats-interval. --metrics-addr serves
/metrics, /healthz and /readyz (ready: every store open, connected to a
leader that sent something within --leader-timeout, within --ready-max-lag
of the leader).

--client-listen serves the client service (oncewal.client.v1.Client) on
ADDR: a Get or Range with a minimum LSN (the LSN a write answered) is
read from this follower's own stores once they have applied it
(read-your-writes; after a bounded wait, "behind" with how far), and
every other call answers "not leader" with --leader and the highest epoch
this follower's stores have seen, so that a client learns where the
leader is. Reads need the deployment's shard count to route keys: with
--shards N it is N; with a single store (--shard), give it as
--client-shards (without it, reads too answer "not leader"). Under mutual
TLS it needs a server
certificate (--client-tls-cert/--client-tls-key, default --tls-cert/
--tls-key, which a follower's client-only certificate is not: gencerts'
leader.pem is one); clients' certificates are checked against --tls-ca.`

func runFollower(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("follower", followerSynopsis, stderr)
	dir := fs.String("dir", "", "follower store directory (with --shards: node directory)")
	leaderAddr := fs.String("leader", "", "leader address host:port (with TLS, the host must be named in the leader's certificate)")
	id := fs.String("id", "", "this follower's stable ID, registered on the leader with --followers (required)")
	shard := fs.Uint("shard", 0, "shard replicated into the store DIR")
	shards := fs.Int("shards", 0, "replicate every shard 0..N-1 into the node directory DIR (0: one shard, --shard)")
	tf := addTLSFlags(fs, "follower")
	minFree := minFreeFlag(fs)
	memTable := memTableFlag(fs)
	serverName := fs.String("tls-server-name", "", "name to verify in the leader's certificate (default: the host of --leader)")
	statsEvery := fs.Duration("stats-interval", 10*time.Second, "log stats this often (0: only at exit)")
	noSync := fs.Bool("nosync", false, "commit without fsync (faster; an ack then does not prove durability)")
	stopOnRefusal := fs.Bool("stop-on-refusal", false, "exit 1 when the leader refuses this follower for a reason no retry fixes (wrong shard, unknown ID, diverged, behind retention, a refused certificate)")
	rebuild := fs.String("rebuild", "auto", "auto: when the leader refuses this store as diverged or behind its retained log (also an empty store after retention dropped the log's start), replace it with a verified snapshot fetched from the leader, then replicate on; never: leave the refusal standing (see README, Rebuilding a follower)")
	leaderTimeout := fs.Duration("leader-timeout", follower.DefaultLeaderTimeout,
		"drop the connection and redial when the leader sends nothing (no batch, no heartbeat; it sends one every second) for this long: it is stopped, hung or cut off, and /readyz fails meanwhile (0: no bound)")
	rebuildRate := fs.Int64("rebuild-rate", snapshot.DefaultRateLimit, "cap a rebuild's transfer at this many bytes/s (the donor's own cap applies too); -1: no cap")
	clientListen := fs.String("client-listen", "", "serve the client service on this address, answering \"not leader\" with --leader (default: none)")
	clientCert := fs.String("client-tls-cert", "", "PEM file of the server certificate --client-listen presents (default --tls-cert; it must be a server certificate)")
	clientKey := fs.String("client-tls-key", "", "PEM file of --client-tls-cert's key (default --tls-key)")
	clientShards := fs.Int("client-shards", 0, "with a single store (--shard), the deployment's shard count, so that --client-listen serves reads at a minimum LSN of the store's shard (0: it answers them \"not leader\")")
	mf := addMetricsFlags(fs, true)
	lf := addLogFlags(fs)
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	var c flagCheck
	if *clientListen != "" {
		hostPort(&c, "client-listen", *clientListen, false)
	} else if *clientCert != "" || *clientKey != "" || *clientShards != 0 {
		c.failf("--client-tls-cert, --client-tls-key and --client-shards need --client-listen")
	}
	if *tf.insecure && (*clientCert != "" || *clientKey != "") {
		c.failf("--insecure serves --client-listen in plaintext: it excludes --client-tls-cert and --client-tls-key")
	}
	if *dir == "" || *leaderAddr == "" {
		c.failf("--dir and --leader are required")
	}
	if *leaderAddr != "" {
		hostPort(&c, "leader", *leaderAddr, true)
	}
	switch err := replication.ValidFollowerID(*id); {
	case *id == "":
		c.failf("--id is required: the name the leader registers this follower under (its --followers)")
	case err != nil:
		c.failf("--id: %v", err)
	}
	inRange(&c, "shard", *shard, 0, math.MaxUint32)
	inRange(&c, "shards", *shards, 0, replication.MaxShards)
	shardSet := false
	fs.Visit(func(f *flag.Flag) { shardSet = shardSet || f.Name == "shard" })
	if shardSet && *shards > 0 {
		c.failf("--shard and --shards exclude each other (--shards N serves shards 0..N-1)")
	}
	inRange(&c, "client-shards", *clientShards, 0, replication.MaxShards)
	switch {
	case *clientShards != 0 && *shards > 0:
		c.failf("--client-shards is for a single store: with --shards N the deployment has N shards")
	case *clientShards != 0 && uint(*clientShards) <= *shard:
		c.failf("--client-shards %d has no shard %d (--shard)", *clientShards, *shard)
	}
	atLeast(&c, "stats-interval", *statsEvery, 0)
	atLeast(&c, "leader-timeout", *leaderTimeout, 0)
	rebuildMode, err := follower.ParseRebuildMode(*rebuild)
	if err != nil {
		c.failf("--rebuild: %v", err)
	}
	if *rebuildRate == 0 || *rebuildRate < -1 {
		c.failf("--rebuild-rate must be positive or -1 (no cap)")
	}
	checkMinFree(&c, *minFree)
	checkMemTable(&c, *memTable)
	mf.check(&c)
	lf.check(&c)
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}
	log := lf.logger(stderr)
	tlsCfg, code, ok := tf.open(fs, stderr, log, "oncewal follower", false, "plaintext, unauthenticated; use only on loopback for tests")
	if !ok {
		return code
	}
	var clientTLS *tls.Config
	if tlsCfg != nil {
		tlsCfg.ServerName = *serverName
		if *clientListen != "" {
			var err error
			if clientTLS, err = clientServerTLS(*tf.ca, or(*clientCert, *tf.cert), or(*clientKey, *tf.key)); err != nil {
				log.Error("oncewal follower: --client-listen", "err", err)
				return exitFailure
			}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer stopWithin(ctx, log, "oncewal follower", shutdownGrace)()
	if err := serveFollower(ctx, log, followerConfig{
		dir: *dir, leader: *leaderAddr, id: *id, shard: uint32(*shard), shards: *shards,
		tls: tlsCfg, noSync: *noSync, statsEvery: *statsEvery, stopOnRefusal: *stopOnRefusal,
		metricsAddr: *mf.addr, readyMaxLag: *mf.maxLag, rebuild: rebuildMode, rebuildRate: *rebuildRate,
		minFree: *minFree, memTable: *memTable, leaderTimeout: *leaderTimeout,
		clientListen: *clientListen, clientTLS: clientTLS, clientShards: *clientShards,
	}); err != nil {
		log.Error("oncewal follower: stopped", "err", err)
		return exitFailure
	}
	return exitOK
}

type followerConfig struct {
	dir, leader, id string
	shard           uint32
	shards          int         // > 0: node directory of shards 0..shards-1
	tls             *tls.Config // nil: insecure
	noSync          bool
	statsEvery      time.Duration
	stopOnRefusal   bool
	rebuild         follower.RebuildMode
	rebuildRate     int64
	minFree         int64                                   // --min-free-bytes
	memTable        int64                                   // --memtable-size
	metricsAddr     string                                  // "": no metrics server
	readyMaxLag     time.Duration                           // /readyz lag bound (0: none)
	leaderTimeout   time.Duration                           // --leader-timeout (0: none)
	opened          func(applied func(shard uint32) uint64) // tests: called once the stores are open
	openedRows      func(rows func() []follower.ShardStats) // tests: each shard's figures, once open
	metricsServing  func(addr string)                       // tests: the metrics server's address
	clientListen    string                                  // --client-listen ("": none)
	clientTLS       *tls.Config                             // its server TLS (nil: insecure)
	clientShards    int                                     // --client-shards (0: with --shards, that count; else no replica reads)
}

func serveFollower(ctx context.Context, log *slog.Logger, c followerConfig) (err error) {
	d, err := grpctransport.NewDialer(c.leader, &grpctransport.DialerOptions{TLS: c.tls, Insecure: c.tls == nil, Logger: log})
	if err != nil {
		return err
	}
	defer d.Close()
	fo := follower.Options{Store: store.Options{ID: c.id, Shard: c.shard, NoSync: c.noSync, Logger: log, MinFreeBytes: c.minFree, MemTableSize: c.memTable}, StopOnPermanentRefusal: c.stopOnRefusal, LeaderTimeout: leaderTimeoutOption(c.leaderTimeout), Rebuild: c.rebuild}
	var (
		serve     func(context.Context) error
		rows      func() []follower.ShardStats
		stores    func(shard uint32) (*store.Store, error) // the store a client read at a MinLSN reads
		closeFn   func() error
		collector prometheus.Collector
		ready     func() error
	)
	if c.shards > 0 {
		shards := make([]uint32, c.shards)
		for i := range shards {
			shards[i] = uint32(i)
		}
		no := fo
		if c.rebuild == follower.RebuildAuto {
			// Each refused shard is rebuilt from the leader's snapshot
			// of that shard; the others keep serving.
			client, err := grpctransport.NewSnapshotClient(c.leader, &grpctransport.DialerOptions{TLS: c.tls, Insecure: c.tls == nil, Logger: log})
			if err != nil {
				return err
			}
			defer client.Close()
			no.Rebuild, no.RebuildFrom, no.Snapshot.RateLimit = follower.RebuildAuto, client, c.rebuildRate
		}
		if err := checkNoIntent(c.dir); err != nil {
			return err
		}
		n, err := follower.OpenNodeContext(ctx, c.dir, shards, &follower.NodeOptions{Follower: no, ShardCount: c.shards})
		if err != nil {
			return err
		}
		collector, ready = metrics.NewNodeCollector(n), metrics.NodeReady(n, c.readyMaxLag)
		serve = func(ctx context.Context) error { return n.Serve(ctx, func(uint32) replication.Dialer { return d }) }
		rows = func() []follower.ShardStats { return n.Stats().Shards }
		stores = func(shard uint32) (st *store.Store, err error) {
			err = n.Follower(shard, func(f *follower.Follower) error { st = f.Store(); return nil })
			return st, err
		}
		closeFn = n.Close
	} else {
		f, err := follower.OpenContext(ctx, c.dir, &fo)
		// A damaged store is what a rebuild replaces: with --rebuild=auto,
		// follower.Run below rebuilds it before it serves (f is nil).
		damaged := c.rebuild == follower.RebuildAuto && errors.Is(err, store.ErrCorrupt)
		switch {
		case damaged:
			log.Error("oncewal follower: the store is damaged; rebuilding it from the leader's snapshot before serving", "dir", c.dir, "err", err)
		case err != nil:
			return err
		default:
			collector, ready = metrics.NewFollowerCollector(f), metrics.FollowerReady(f, c.readyMaxLag)
			serve = func(ctx context.Context) error { return f.Serve(ctx, d) }
			rows = func() []follower.ShardStats {
				lsn, epoch := f.Position()
				return []follower.ShardStats{{Shard: c.shard, AppliedLSN: lsn, Epoch: epoch, Stats: f.Stats()}}
			}
			stores = singleStore(c.shard, func() *follower.Follower { return f })
			closeFn = f.Close
		}
		if c.rebuild == follower.RebuildAuto {
			// follower.Run reopens the store after each rebuild; the
			// first open above checked the directory and options, and
			// is handed over.
			client, err := grpctransport.NewSnapshotClient(c.leader, &grpctransport.DialerOptions{TLS: c.tls, Insecure: c.tls == nil, Logger: log})
			if err != nil {
				if f != nil {
					_ = f.Close()
				}
				return err
			}
			defer client.Close()
			var cur atomic.Pointer[follower.Follower]
			var rebuilds atomic.Int64
			cur.Store(f)
			ro := fo
			ro.Rebuild, ro.RebuildFrom, ro.Snapshot.RateLimit = follower.RebuildAuto, client, c.rebuildRate
			if f != nil {
				if err := f.Close(); err != nil {
					return err
				}
			}
			serve = func(ctx context.Context) error {
				return follower.Run(ctx, c.dir, &ro, d, &follower.RunHooks{
					Opened: func(f *follower.Follower) { cur.Store(f) },
					Rebuilt: func(reason error, m snapshot.Manifest, st snapshot.Stats) {
						rebuilds.Add(1)
						log.Info("oncewal follower: rebuilt", "reason", reason, "applied_lsn", m.Cut.AppliedLSN,
							"epoch", m.Cut.Epoch, "bytes", st.Bytes, "mb_per_s", float64(st.Bytes)/1e6/max(st.Elapsed.Seconds(), 1e-9))
					},
				})
			}
			rows = func() []follower.ShardStats {
				f := cur.Load()
				if f == nil { // a damaged store not rebuilt yet
					return []follower.ShardStats{{Shard: c.shard, Err: store.ErrCorrupt, Rebuilds: int(rebuilds.Load())}}
				}
				lsn, epoch := f.Position()
				return []follower.ShardStats{{Shard: c.shard, AppliedLSN: lsn, Epoch: epoch, Stats: f.Stats(), Rebuilds: int(rebuilds.Load())}}
			}
			stores = singleStore(c.shard, cur.Load)
			closeFn = func() error { return nil } // Run closes each store it opened
			// The metrics and the readiness check follow the store Run
			// serves now (a rebuild reopens it), not the first one.
			current := func() (*follower.Follower, int) { return cur.Load(), int(rebuilds.Load()) }
			collector, ready = metrics.NewFollowerCollectorOf(current), metrics.FollowerReadyOf(current, c.readyMaxLag)
		}
	}
	defer func() {
		// Close waits for Serve, flushes every memtable and closes the
		// stores; nothing applies after Serve returned, so the positions
		// read before Close are final.
		final := rows()
		if cerr := closeFn(); err == nil {
			err = cerr
		}
		for _, s := range final {
			log.Info("oncewal follower: closed", "shard", s.Shard, "applied_lsn", s.AppliedLSN, "epoch", s.Epoch)
		}
	}()
	addr, stopMetrics, err := serveMetrics(c.metricsAddr, log, ready, collector)
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	defer stopMetrics()
	if c.metricsServing != nil {
		c.metricsServing(addr)
	}
	if c.clientListen != "" {
		stopClients, err := serveClients(c, log, rows, stores)
		if err != nil {
			return fmt.Errorf("--client-listen: %w", err)
		}
		defer stopClients()
	}
	if c.openedRows != nil {
		c.openedRows(rows)
	}
	if c.opened != nil {
		c.opened(func(shard uint32) uint64 {
			for _, s := range rows() {
				if s.Shard == shard {
					return s.AppliedLSN
				}
			}
			return 0
		})
	}
	logStats := func() {
		t := d.Stats()
		for _, s := range rows() {
			log.Info("oncewal follower: stats", append([]any{"shard", s.Shard},
				followerStatsAttrs(s.AppliedLSN, s.Epoch, s.Stats, t)...)...)
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { every(c.statsEvery, done, logStats) })
	log.Info("oncewal follower: replicating", "leader", c.leader, "id", c.id, "dir", c.dir, "mtls", c.tls != nil)
	err = serve(ctx)
	close(done)
	wg.Wait()
	logStats()
	return err
}

// followerStatsAttrs is the periodic stats line. Every term of the receiver's
// accounting identity is in it, so the line itself shows that
// events = applied + discarded_* + skipped_closed + skipped_too_old +
// refused_events; the batches refused are broken down by reason. The
// transport's figures (dials, refusals by the leader, bytes) are the
// Dialer's, shared by every shard of a node.
func followerStatsAttrs(lsn, epoch uint64, s follower.Stats, t grpctransport.DialerStats) []any {
	r := s.Receiver
	return []any{"applied_lsn", lsn, "epoch", epoch,
		"batches", r.Batches, "events", r.Events, "applied", r.Applied,
		"discarded_position", r.DiscardedPosition, "discarded_hwm", r.DiscardedHWM,
		"discarded_window", r.DiscardedWindow, "discarded_in_batch", r.DiscardedInBatch,
		"skipped_closed", r.SkippedClosed, "skipped_too_old", r.SkippedTooOld, "refused_events", r.RefusedEvents,
		"refused_gap", r.SeqGaps + r.OutOfOrder, "refused_stale_epoch", r.StaleEpochs, "refused_wrong_shard", r.WrongShard,
		"refused_corrupt", r.Corrupt, "refused_apply_error", r.ApplyErrors,
		"window", s.WindowLen, "background_errors", s.BackgroundErrors, "write_stalled", s.WriteStalled, "disk_full", s.DiskFull, "dials", t.Dials, "dial_failures", t.DialFailures, "refused_by_leader", t.Refused,
		"bytes_received", t.BytesReceived}
}

// leaderTimeoutOption is --leader-timeout as follower.Options.LeaderTimeout,
// where 0 means the default and a negative value none.
func leaderTimeoutOption(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// serveClients serves the client service on --client-listen: reads at a
// MinLSN from stores (clientapi.Replica) when the deployment's shard count
// is known (--shards, --client-shards), and "not leader" for every other
// call, with --leader and the highest epoch any of the follower's stores
// has applied.
func serveClients(c followerConfig, log *slog.Logger, rows func() []follower.ShardStats, stores func(uint32) (*store.Store, error)) (stop func(), err error) {
	where := func() (string, uint64) {
		var epoch uint64
		for _, s := range rows() {
			epoch = max(epoch, s.Epoch)
		}
		return c.leader, epoch
	}
	svc := clientapi.NotLeader(where)
	shards := max(c.shards, c.clientShards)
	if shards > 0 {
		if svc, err = clientapi.Replica(where, stores, &clientapi.ReplicaOptions{Shards: shards, Insecure: c.clientTLS == nil, Logger: log}); err != nil {
			return nil, err
		}
	}
	srv, err := grpctransport.ListenServices(c.clientListen, &grpctransport.ServerOptions{TLS: c.clientTLS, Insecure: c.clientTLS == nil,
		Logger: log, Services: []grpctransport.Service{svc}})
	if err != nil {
		return nil, err
	}
	log.Info("oncewal follower: client service (not leader)", "listen", srv.Addr().String(), "leader", c.leader, "replica_reads", shards > 0)
	return func() { _ = srv.Close() }, nil
}

// singleStore is the stores of a follower of one store of shard: cur's,
// nil while a damaged store is being rebuilt.
func singleStore(shard uint32, cur func() *follower.Follower) func(uint32) (*store.Store, error) {
	return func(s uint32) (*store.Store, error) {
		if s != shard {
			return nil, fmt.Errorf("this follower holds shard %d only", shard)
		}
		f := cur()
		if f == nil {
			return nil, fmt.Errorf("shard %d's store is being rebuilt", shard)
		}
		return f.Store(), nil
	}
}

// errNotServerCert: --client-listen was given a certificate a TLS client
// would refuse as a server's.
var errNotServerCert = errors.New("not a server certificate")

// clientServerTLS is --client-listen's mutual TLS: its certificate must be
// usable by a server (a follower's client-only certificate is not), and
// clients' certificates must chain to ca.
func clientServerTLS(ca, cert, key string) (*tls.Config, error) {
	cfg, err := grpctransport.LoadServerTLS(ca, cert, key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if err != nil {
		return nil, err
	}
	if len(leaf.ExtKeyUsage) > 0 && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny) {
		return nil, fmt.Errorf("%w: %s allows client authentication only, so clients would refuse it; give --client-tls-cert and --client-tls-key "+
			"a server certificate of the same CA for this host (oncewal gencerts' leader.pem is one)", errNotServerCert, cert)
	}
	return cfg, nil
}

// or is a if set, else b.
func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

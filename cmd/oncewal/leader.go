package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/metrics"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/wal"
)

const leaderSynopsis = `leader --dir DIR --followers ID,ID,... [--shards N] [--epoch E] [--listen ADDR]
                      [--tls-ca F --tls-cert F --tls-key F | --insecure]
                      [--max-retained-bytes B] [--segment-size B] [--min-free-bytes B] [--memtable-size B]
                      [--generate RATE --sessions N --clients N --batch N --retry-rate F --ack POLICY
                       --ack-log FILE]

Runs the leader of every shard of a deployment on this node. DIR is the
leader node directory: DIR/shard-NNNN is each shard's local store (the same
store a follower keeps) and DIR/wal every shard's WAL; both are created if
missing. One gRPC server on --listen (mutual TLS unless --insecure) serves
every shard; each follower states its shard and its --id, and each
registered follower (--followers, the same list for every shard) gets its
own stream per shard. A follower not listed is refused and told why. The
same server and TLS serve the client service (oncewal.client.v1.Client:
submit a request once, its status, open a session) to callers whose
certificate names oncewal://client/NAME; with --insecure a caller names
itself in the oncewal-principal metadata (loopback tests only).

Retention: each registered follower has a replication slot per shard (its
acknowledged LSN, persisted); WAL segments below every live slot are
deleted. When what the slots pin exceeds --max-retained-bytes, the most
lagging followers are dropped from retention and refused (behind retention)
once what they need is gone.

--epoch 0 keeps the epoch the stores have committed, or the epoch of the
WAL's last batch if higher (the WAL is the authority: a lost store is
rebuilt from it), 1 for a new DIR; a higher one is a promotion (see oncewal
promote); at most 9223372036854775807. A DIR another leader has open, a
corrupt log or one whose epoch goes back (the error names the oncewal
waldump --cut-epoch-regression command that repairs it), a non-WAL
DIR/wal, stores or segments of shards beyond --shards, another --shards
than DIR/SHARDS records, a follower's directory or store never promoted
(run oncewal promote), or an --epoch below the stores' or the WAL's fail at
start, exit 1, and change nothing in DIR.

With --generate the leader also runs a client workload at RATE events/s
through the leader's one stamping path (sessions opening, puts, deletes,
non-idempotent adds, each with a client request key; --retry-rate of them
sent again with the same key, as a client retries after a lost answer).
--clients N splits it among N clients appending concurrently (each with
its share of the sessions and of RATE), so appends to one shard share the
WAL's sync (group commit). --ack waits for that many followers'
acknowledgements of each batch before the client's next (none, one,
majority, all). --ack-log FILE appends the 16-byte client key of every
request acknowledged to its client (logged, and --ack met) to FILE, so a
test can check after kill -9 that nothing acknowledged was lost. Logs
one stats line per shard and per follower, and one of the client service's
replies, every --stats-interval; stops cleanly on SIGINT/SIGTERM.
--metrics-addr serves /metrics, /healthz and /readyz (ready: open,
shipping, and enough followers connected for a majority of the replicas,
the leader counted: one of two, two of three; else 503 naming the lost
quorum). The leader logs one WARN line when that quorum is lost and one
INFO line when it is back. A client request waiting for its ack policy
longer than 5s is answered Unavailable (outcome unknown: retry with the
same request ID), naming how many followers acknowledged it.`

// Bounds of the flags. A batch of maxGenerateBatch generated events stays
// far below wal.MaxBodySize; more sessions than maxGenerateSessions only
// cost memory.
const (
	maxGenerateRate     = 10_000_000
	maxGenerateSessions = 1_000_000
	maxGenerateBatch    = 100_000
	maxGenerateClients  = 1024
	minSegmentSize      = 4 << 10
	maxSegmentSize      = 1 << 40
)

func runLeader(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("leader", leaderSynopsis, stderr)
	dir := fs.String("dir", "", "leader node directory (DIR/shard-NNNN stores, DIR/wal logs; created if missing)")
	shards := fs.Int("shards", 1, "the deployment's shard count (fixed for its lifetime)")
	epoch := fs.Uint64("epoch", 0, "leader epoch (0: keep the stores' epoch; higher: promotion)")
	followers := fs.String("followers", "", "comma-separated IDs of the registered followers of every shard (required)")
	listen := fs.String("listen", "127.0.0.1:7070", "address to serve followers and clients on (replication and the client service)")
	tf := addTLSFlags(fs, "leader")
	maxRetained := fs.Int64("max-retained-bytes", leader.DefaultMaxRetainedBytes, "per shard: WAL bytes the followers' slots may pin before the most lagging is dropped")
	retainEvery := fs.Duration("retention-interval", leader.DefaultRetentionInterval, "how often slots advance and unneeded segments are deleted")
	segSize := fs.Int64("segment-size", wal.DefaultSegmentSize, "WAL segment size in bytes")
	minFree := minFreeFlag(fs)
	memTable := memTableFlag(fs)
	rate := fs.Int("generate", 0, "run a generated client workload at this many events/s (0: none)")
	sessions := fs.Int("sessions", 100, "concurrent client sessions of the generated workload")
	clients := fs.Int("clients", 1, "generator: concurrent clients, each appending its share of the sessions")
	batch := fs.Int("batch", 256, "max events per generated batch")
	retryRate := fs.Float64("retry-rate", 0.01, "share of generated requests sent twice with the same client key")
	ack := fs.String("ack", "none", "generator: wait for this many followers per batch: none, one, majority, all")
	ackLog := fs.String("ack-log", "", "generator: append the 16-byte client key of every acknowledged request to this file")
	statsEvery := fs.Duration("stats-interval", 10*time.Second, "log stats this often (0: only at exit)")
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
	if *dir == "" {
		c.failf("--dir is required")
	}
	ids := followerList(&c, *followers)
	hostPort(&c, "listen", *listen, false)
	inRange(&c, "shards", *shards, 1, replication.MaxShards)
	checkEpochFlag(&c, *epoch)
	inRange(&c, "max-retained-bytes", *maxRetained, 1, math.MaxInt64)
	inRange(&c, "retention-interval", *retainEvery, time.Millisecond, 24*time.Hour)
	inRange(&c, "segment-size", *segSize, minSegmentSize, maxSegmentSize)
	checkMinFree(&c, *minFree)
	checkMemTable(&c, *memTable)
	inRange(&c, "generate", *rate, 0, maxGenerateRate)
	okSessions := inRange(&c, "sessions", *sessions, 1, maxGenerateSessions)
	if inRange(&c, "clients", *clients, 1, maxGenerateClients) && okSessions && *clients > *sessions {
		c.failf("--clients %d exceeds --sessions %d: each client needs a session of its own", *clients, *sessions)
	}
	inRange(&c, "batch", *batch, 1, maxGenerateBatch)
	inRange(&c, "retry-rate", *retryRate, 0, 1)
	policy, ackOK := parseAckPolicy(*ack)
	if !ackOK {
		c.failf("--ack %q is not one of none, one, majority, all", *ack)
	}
	if *ackLog != "" && *rate == 0 {
		c.failf("--ack-log needs --generate: only the generator's requests are acknowledged")
	}
	atLeast(&c, "stats-interval", *statsEvery, 0)
	mf.check(&c)
	lf.check(&c)
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}
	log := lf.logger(stderr)
	tlsCfg, code, ok := tf.open(fs, stderr, log, "oncewal leader", true, "plaintext, unauthenticated; use only on loopback for tests")
	if !ok {
		return code
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer stopWithin(ctx, log, "oncewal leader", shutdownGrace)()
	if err := serveLeader(ctx, log, leaderConfig{
		dir: *dir, shards: *shards, epoch: *epoch, followers: ids, listen: *listen, tls: tlsCfg,
		maxRetained: *maxRetained, retainEvery: *retainEvery, segmentSize: *segSize, minFree: *minFree, memTable: *memTable,
		gen:        genConfig{rate: *rate, sessions: *sessions, clients: *clients, batch: *batch, retryRate: *retryRate, ack: policy},
		ackLog:     *ackLog,
		statsEvery: *statsEvery, metricsAddr: *mf.addr,
	}); err != nil {
		log.Error("oncewal leader: stopped", "dir", *dir, "err", err)
		return exitFailure
	}
	return exitOK
}

// followerList parses --followers: comma-separated, each a valid non-empty
// follower ID, none twice.
func followerList(c *flagCheck, s string) []string {
	if strings.TrimSpace(s) == "" {
		c.failf("--followers is required: the IDs of the followers that replicate every shard (each runs oncewal follower --id ID)")
		return nil
	}
	var ids []string
	seen := map[string]bool{}
	for _, id := range strings.Split(s, ",") {
		id = strings.TrimSpace(id)
		switch {
		case id == "":
			c.failf("--followers %q holds an empty ID", s)
		case replication.ValidFollowerID(id) != nil:
			c.failf("--followers: %v", replication.ValidFollowerID(id))
		case seen[id]:
			c.failf("--followers: %q listed twice", id)
		default:
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// parseAckPolicy parses --ack; policy 0 is "none".
func parseAckPolicy(s string) (leader.AckPolicy, bool) {
	switch s {
	case "none":
		return 0, true
	case "one":
		return leader.AckOne, true
	case "majority":
		return leader.AckMajority, true
	case "all":
		return leader.AckAll, true
	}
	return 0, false
}

type leaderConfig struct {
	dir         string
	shards      int
	epoch       uint64
	followers   []string
	listen      string
	tls         *tls.Config // nil: --insecure
	maxRetained int64
	retainEvery time.Duration
	segmentSize int64
	minFree     int64 // --min-free-bytes
	memTable    int64 // --memtable-size
	gen         genConfig
	ackLog      string // --ack-log: the generator's acknowledged client keys
	statsEvery  time.Duration
	metricsAddr string                              // "": no metrics server
	ready       func(addr string, l *leader.Leader) // tests: called once serving
	metrics     func(addr string)                   // tests: the metrics server's address
}

// lateListener is a shard's Listener before the server exists: the leader
// is opened first — a locked or unreadable directory must fail as such,
// not as an address in use — and the server bound after; Accept is only
// called by Run, which starts once the server is set.
type lateListener struct {
	srv   **grpctransport.Server
	shard uint32
}

func (l lateListener) Accept(ctx context.Context) (replication.LeaderConn, replication.Ack, error) {
	return (*l.srv).Listener(l.shard).Accept(ctx)
}

func serveLeader(ctx context.Context, log *slog.Logger, c leaderConfig) (err error) {
	if c.ackLog != "" {
		// Appended to, never synced: a kill -9 keeps what was written in
		// the page cache, which is all a test on this machine reads.
		f, err := os.OpenFile(c.ackLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("--ack-log: %w", err)
		}
		defer f.Close()
		c.gen.ackLog = f
	}
	if err := checkNoIntent(c.dir); err != nil {
		return err
	}
	var srv *grpctransport.Server
	l, err := leader.Open(c.dir, &leader.Options{
		Shards: c.shards, Epoch: c.epoch, Followers: c.followers,
		Listener:          func(s uint32) replication.Listener { return lateListener{&srv, s} },
		MaxRetainedBytes:  c.maxRetained,
		RetentionInterval: c.retainEvery,
		SegmentSize:       c.segmentSize,
		Store:             store.Options{Logger: log, MinFreeBytes: c.minFree, MemTableSize: c.memTable},
		// Every claim is the client service's, run in this process: one in
		// flight when it starts was its predecessor's, which is gone.
		Ledger: idempotency.LedgerOptions{FreeOrphanedClaims: true},
		Logger: log,
	})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := l.Close(); err == nil {
			err = cerr
		}
	}()
	// Every shard's store is a snapshot donor: a follower that cannot
	// continue from the log (new after retention dropped its start, behind
	// it, diverged, a deposed leader) rebuilds from it over the same port.
	donors := make([]snapshot.Source, c.shards)
	ds := make([]*snapshot.Donor, c.shards)
	for s := range uint32(c.shards) {
		d, err := l.Donor(s, nil)
		if err != nil {
			return err
		}
		defer d.Close()
		donors[s], ds[s] = d, d
	}
	// The client service shares the port and its mutual TLS; a plaintext
	// leader (--insecure, loopback tests) takes a client's name from its
	// oncewal-principal metadata.
	clients, err := clientapi.New(l, &clientapi.Options{Insecure: c.tls == nil, Logger: log})
	if err != nil {
		return err
	}
	sopts := &grpctransport.ServerOptions{Logger: log, TLS: c.tls, Insecure: c.tls == nil,
		Snapshots: func(s uint32) snapshot.Source {
			if int(s) < len(donors) {
				return donors[s]
			}
			return nil
		},
		Services: []grpctransport.Service{clients.GRPC()}}
	if srv, err = grpctransport.Listen(c.listen, sopts); err != nil {
		return err
	}
	defer srv.Close()
	for s := range uint32(c.shards) {
		srv.Listener(s)
	}
	sh0, _ := l.Shard(0)
	log.Info("oncewal leader: serving", "dir", c.dir, "listen", srv.Addr().String(), "shards", c.shards,
		"epoch", sh0.Epoch(), "followers", strings.Join(c.followers, ","), "mtls", c.tls != nil,
		"generate_per_s", c.gen.rate, "clients", max(c.gen.clients, 1), "max_retained_bytes", c.maxRetained)
	if c.ready != nil {
		c.ready(srv.Addr().String(), l)
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	shipping := func() error {
		if runCtx.Err() != nil {
			return metrics.NotReady("the leader stopped shipping")
		}
		if err := l.Quorum(leader.AckMajority); err != nil {
			return metrics.NotReady("%w", err)
		}
		return nil
	}
	maddr, stopMetrics, err := serveMetrics(c.metricsAddr, log, shipping, metrics.NewLeaderCollector(l))
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	defer stopMetrics()
	if c.metrics != nil {
		c.metrics(maddr)
	}
	var wg sync.WaitGroup
	var runErr, genErr error
	wg.Go(func() {
		runErr = l.Run(runCtx)
		cancel()
	})
	var gen *generator
	if c.gen.rate > 0 {
		gen = newGenerator(l, c.gen, log)
		wg.Go(func() {
			if genErr = gen.run(runCtx); genErr != nil {
				cancel()
			}
		})
	}
	logStats := func() {
		logLeaderStats(log, l, srv, gen, ds)
		logClientStats(log, clients.Stats())
	}
	wg.Go(func() { every(c.statsEvery, runCtx.Done(), logStats) })
	wg.Go(func() { watchQuorum(runCtx, log, l, time.Second) })
	wg.Wait()
	logStats()
	log.Info("oncewal leader: stopped", "dir", c.dir)
	switch {
	case genErr != nil:
		return fmt.Errorf("generator: %w", genErr)
	case runErr != nil && !errors.Is(runErr, context.Canceled):
		return runErr
	}
	return nil
}

// watchQuorum logs one WARN line when the majority quorum is lost and one
// INFO line when it is back, checking every tick until ctx ends: a
// transition, not a line per tick, so a leader down to too few followers
// says so once and the stats lines say the rest.
func watchQuorum(ctx context.Context, log *slog.Logger, l *leader.Leader, tick time.Duration) {
	var lost error
	every(tick, ctx.Done(), func() {
		err := l.Quorum(leader.AckMajority)
		switch {
		case err != nil && lost == nil:
			log.Warn("oncewal leader: quorum lost: majority writes fail (ErrAckTimeout) and /readyz fails until enough followers reconnect", "err", err)
		case err == nil && lost != nil:
			log.Info("oncewal leader: quorum back: enough followers are connected for majority writes")
		}
		lost = err
	})
}

// logLeaderStats logs one line per shard, one per follower of each shard
// and one for the transport. donors are the shards' snapshot donors.
func logLeaderStats(log *slog.Logger, l *leader.Leader, srv *grpctransport.Server, gen *generator, donors []*snapshot.Donor) {
	for _, st := range l.Stats() {
		r := st.Retention
		attrs := []any{"shard", st.Shard, "epoch", st.Epoch, "next_lsn", st.NextLSN,
			"first_retained_lsn", r.FirstLSN, "retained_bytes", r.RetainedBytes, "segments_deleted", r.SegmentsDeleted,
			"retention_errors", r.Errors, "refused", st.Shipping.Refused.Total(), "snapshot_pins", r.SnapshotPins,
			"wal_batches", st.WALBatches, "wal_syncs", st.WALSyncs}
		if int(st.Shard) < len(donors) {
			d := donors[st.Shard].Stats()
			attrs = append(attrs, "snapshots_serving", d.Serving, "snapshots_superseded", d.Superseded,
				"snapshots_idled_out", d.IdledOut, "snapshot_oldest_unread", d.OldestUnread.Round(time.Millisecond))
		}
		if gen != nil {
			g := gen.stats(st.Shard)
			attrs = append(attrs, "generated", g.generated, "retried", g.retried, "acked", g.acked, "expired", g.expired)
		}
		log.Info("oncewal leader: shard", attrs...)
		for _, f := range st.Shipping.Followers {
			var slot leader.SlotStats
			for _, s := range r.Slots {
				if s.ID == f.ID {
					slot = s
				}
			}
			log.Info("oncewal leader: follower", "shard", st.Shard, "follower", f.ID, "connected", f.Connected,
				"acked_lsn", f.AckedLSN, "lag_events", f.LagEvents, "lag_bytes", f.LagBytes,
				"slot_lsn", slot.Acked, "dropped", slot.Dropped, "connections", f.Connections,
				"refused_unknown", f.Refused.UnknownFollower, "refused_diverged", f.Refused.Diverged,
				"refused_behind_retention", f.Refused.BehindRetention, "refused_duplicate", f.Refused.DuplicateFollower, "refused_bad_hello", f.Refused.BadHello,
				"refused_other", f.Refused.Other, "batches_sent", f.BatchesSent, "resent", f.BatchesResent,
				"disk_reads", f.DiskReads)
		}
	}
	t := srv.Stats()
	log.Info("oncewal leader: transport", "streams", t.Streams, "tls_refused", t.RefusedTLS, "identity_refused", t.RefusedIdentity,
		"refused", t.Refused, "unserved_shard", t.UnservedShard, "bad_frames", t.BadFrames, "bytes_sent", t.BytesSent)
}

// logClientStats logs one line of the client service's replies: per method
// and code (submit_ok=…, status_unknown=…), and the calls refused for
// their caller's identity or an undecodable request.
func logClientStats(log *slog.Logger, st clientapi.Stats) {
	attrs := []any{"denied", st.Denied, "malformed", st.Malformed}
	for _, m := range []struct {
		name  string
		codes map[clientv1.Code]uint64
	}{{"submit", st.Submit}, {"status", st.Status}, {"open_session", st.OpenSession}, {"txn", st.Txn}, {"get", st.Get}, {"range", st.Range}} {
		for code := range clientv1.Code(16) {
			if n := m.codes[code]; n > 0 {
				attrs = append(attrs, m.name+"_"+strings.ToLower(code.String()), n)
			}
		}
	}
	log.Info("oncewal leader: client service", attrs...)
}

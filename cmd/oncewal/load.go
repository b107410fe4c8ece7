package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mrand "math/rand/v2"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/ctxtime"
)

const loadSynopsis = `load --addrs HOST:PORT[,HOST:PORT...] [--clients N] [--rate R] [--retry-rate F]
                    [--ack leader|one|majority|all] [--duration D] [--ack-log FILE] [--keys N]
                    [--tls-ca F --tls-cert F --tls-key F | --insecure --principal NAME]

Drives a cluster over the network through its client service
(oncewal.client.v1.Client) with the Go client package: --clients
concurrent clients share one client (one principal, one session, so one
shard's ledger) and together send --rate requests per second (0: as fast
as the answers come), each request a new request ID and the payload
oncewal leader --generate logs: a put, an add to "counter" or a delete of
one of 16 keys, in the client's session. With --keys N, each request is
instead a transaction on the principal's key space (Client.Txn): an add
of 1 to one of N keys load/k0 … (request n to key n mod N), logged in the
shard of its key, so one principal's requests spread over every shard;
the summary then counts the requests answered per shard (per_shard=[…]),
and every key's counter ends at the number of distinct requests to it.
--addrs may name any nodes: the client finds the leader
(a follower's --client-listen answers "not leader" with its address) and
follows it across a restart or a promotion.

A request the client answered "outcome unknown" is sent again with the
same request ID until it is answered (or the run ends), as a client must.
--retry-rate of the answered requests are sent once more with the same
request ID and payload, as a client that lost the answer would: the node
must answer them Replay — one answered OK again ran twice, a bug.
--ack-log FILE appends the 16-byte client key (idempotency.ClientKey of
the request ID) of every request answered OK or Replay, once per request,
so that a test can check after kill -9 that every one is in the leader's
WAL exactly once (its ledger record names the request ID).

Runs for --duration (0: until SIGINT/SIGTERM) — the requests in flight
then get 5 s to be answered — logs a stats line every --stats-interval and
prints a summary on stdout at the end. Exit 0; 1 if a request
was answered with a conflict, refused, or denied (the certificate names no
client), a retry ran twice, the ack log could not be written, or no
request at all was answered; 2 on bad usage.`

// Bounds of load's flags.
const (
	maxLoadRate    = 10_000_000
	maxLoadClients = 1024
	// loadMaxLag is how far a client may fall behind its schedule before
	// it gives up catching up: after a stall (a failover) it resumes at
	// --rate instead of bursting the backlog.
	loadMaxLag = time.Second
	// maxLoadKeys bounds --keys.
	maxLoadKeys = 1 << 20
)

func runLoad(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("load", loadSynopsis, stderr)
	addrs := fs.String("addrs", "", "comma-separated host:port of the nodes to reach (any of them: the client finds the leader); required")
	clients := fs.Int("clients", 4, "concurrent clients, each sending its share of --rate")
	rate := fs.Float64("rate", 1000, "requests per second over all clients, new requests only (retries come on top); 0: as fast as the answers come")
	retryRate := fs.Float64("retry-rate", 0.01, "share of answered requests sent again with the same request ID, as after a lost answer")
	ack := fs.String("ack", "majority", "ack policy of every request: leader, one, majority or all")
	duration := fs.Duration("duration", 0, "how long to run (0: until SIGINT/SIGTERM)")
	ackLog := fs.String("ack-log", "", "append the 16-byte client key of every request answered OK or Replay to this file")
	statsEvery := fs.Duration("stats-interval", 10*time.Second, "log a stats line this often (0: only the summary at the end)")
	keys := fs.Int("keys", 0, "with N > 0: each request is a transaction adding 1 to one of N keys of the principal's key space (spread over the shards); 0: the default payload in one session")
	tf := &tlsFlags{
		ca:       fs.String("tls-ca", "", "PEM file of the CA the nodes' certificates must chain to"),
		cert:     fs.String("tls-cert", "", "PEM file of this client's certificate (its URI SAN oncewal://client/NAME names the principal)"),
		key:      fs.String("tls-key", "", "PEM file of this client's private key"),
		insecure: fs.Bool("insecure", false, "plaintext, no authentication, the principal taken from --principal: ONLY for tests on loopback against an --insecure node"),
	}
	principal := fs.String("principal", "", "with --insecure: the client's name, the scope of its request IDs (with TLS the certificate names it)")
	lf := addLogFlags(fs)
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	var c flagCheck
	nodes := addrList(&c, *addrs)
	inRange(&c, "clients", *clients, 1, maxLoadClients)
	inRange(&c, "rate", *rate, 0, maxLoadRate)
	inRange(&c, "retry-rate", *retryRate, 0, 1)
	inRange(&c, "keys", *keys, 0, maxLoadKeys)
	policy, ackOK := parseClientAck(*ack)
	if !ackOK {
		c.failf("--ack %q is not one of leader, one, majority, all", *ack)
	}
	atLeast(&c, "duration", *duration, 0)
	atLeast(&c, "stats-interval", *statsEvery, 0)
	switch {
	case *tf.insecure && strings.TrimSpace(*principal) == "":
		c.failf("--insecure needs --principal NAME: a plaintext node takes the caller's name from it")
	case !*tf.insecure && *principal != "":
		c.failf("--principal is only for --insecure: with TLS the client certificate's oncewal://client/NAME names the caller")
	}
	lf.check(&c)
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}
	log := lf.logger(stderr)
	tlsCfg, code, ok := tf.open(fs, stderr, log, "oncewal load", false, "plaintext, the principal named by --principal; use only on loopback for tests")
	if !ok {
		return code
	}
	opts := &client.Options{Addrs: nodes, TLS: tlsCfg, Insecure: tlsCfg == nil, Ack: policy, Logger: log}
	if tlsCfg == nil {
		opts.Principal = strings.TrimSpace(*principal)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	sum, err := runLoadWith(ctx, log, loadConfig{
		client: opts, clients: *clients, rate: *rate, retryRate: *retryRate,
		ackLog: *ackLog, statsEvery: *statsEvery, keys: *keys,
	})
	if sum != nil {
		fmt.Fprintln(stdout, sum.String())
	}
	if err != nil {
		log.Error("oncewal load: failed", "err", err)
		return exitFailure
	}
	return exitOK
}

// addrList parses --addrs: comma-separated host:port, at least one.
func addrList(c *flagCheck, s string) []string {
	if strings.TrimSpace(s) == "" {
		c.failf("--addrs is required: the host:port of one or more nodes (a leader's --listen, a follower's --client-listen)")
		return nil
	}
	var out []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		hostPort(c, "addrs", a, true)
		out = append(out, a)
	}
	return out
}

// parseClientAck parses load's --ack. Unlike the generator's, there is no
// "none": an answer is given only once the request is durable at least in
// the leader's WAL.
func parseClientAck(s string) (client.Ack, bool) {
	switch s {
	case "leader":
		return client.AckLeader, true
	case "one":
		return client.AckOne, true
	case "majority":
		return client.AckMajority, true
	case "all":
		return client.AckAll, true
	}
	return 0, false
}

// loadConfig is a load run's configuration, checked by runLoad's flags.
type loadConfig struct {
	client     *client.Options
	clients    int
	rate       float64 // requests/s over all clients; 0: unpaced
	retryRate  float64
	ackLog     string
	statsEvery time.Duration
	runID      string // tests: the run's ID in its request IDs (default: random)
	keys       int    // > 0: transactions on the key space over this many keys
}

// loadStats counts a load run's requests. A request is a request ID; its
// first answer counts it once under ok or replayed, whatever number of
// submissions it took.
type loadStats struct {
	requests    atomic.Uint64 // request IDs sent
	ok          atomic.Uint64 // first answered OK
	replayed    atomic.Uint64 // first answered Replay (an attempt lost its answer inside the client)
	retries     atomic.Uint64 // answered requests sent again (--retry-rate)
	retryReplay atomic.Uint64 // of them, answered Replay, as they must be
	resent      atomic.Uint64 // submissions again after "outcome unknown"
	unknown     atomic.Uint64 // requests never answered, that may have run
	unavailable atomic.Uint64 // requests that did not run (no node took them, or the run ended first)
	conflicts   atomic.Uint64
	refused     atomic.Uint64 // refused, or the identity denied
	reruns      atomic.Uint64 // retries answered OK: the request ran twice
	// perShard counts the requests first answered in each shard (--keys),
	// grown under shardMu.
	shardMu  sync.Mutex
	perShard []uint64
}

func (s *loadStats) inShard(shard uint32) {
	s.shardMu.Lock()
	defer s.shardMu.Unlock()
	for uint32(len(s.perShard)) <= shard {
		s.perShard = append(s.perShard, 0)
	}
	s.perShard[shard]++
}

// loadSummary is a snapshot of loadStats over an elapsed time.
type loadSummary struct {
	elapsed                                              time.Duration
	requests, ok, replayed, retries, retryReplay, resent uint64
	unknown, unavailable, conflicts, refused, reruns     uint64
	perShard                                             []uint64 // nil unless --keys
}

func (s *loadStats) snapshot(elapsed time.Duration) loadSummary {
	return loadSummary{elapsed: elapsed,
		requests: s.requests.Load(), ok: s.ok.Load(), replayed: s.replayed.Load(),
		retries: s.retries.Load(), retryReplay: s.retryReplay.Load(), resent: s.resent.Load(),
		unknown: s.unknown.Load(), unavailable: s.unavailable.Load(),
		conflicts: s.conflicts.Load(), refused: s.refused.Load(), reruns: s.reruns.Load(), perShard: s.shards()}
}

func (s *loadStats) shards() []uint64 {
	s.shardMu.Lock()
	defer s.shardMu.Unlock()
	return slices.Clone(s.perShard)
}

// answered is the requests that got OK or Replay.
func (s loadSummary) answered() uint64 { return s.ok + s.replayed }

func (s loadSummary) String() string {
	out := fmt.Sprintf("oncewal load: %d requests in %s (%.0f answered/s): ok=%d replayed=%d retried=%d retry_replayed=%d "+
		"resent_after_unknown=%d outcome_unknown=%d unavailable=%d conflicts=%d refused=%d reruns=%d",
		s.requests, s.elapsed.Round(time.Millisecond), float64(s.answered())/max(s.elapsed.Seconds(), 1e-9),
		s.ok, s.replayed, s.retries, s.retryReplay, s.resent, s.unknown, s.unavailable, s.conflicts, s.refused, s.reruns)
	if s.perShard != nil {
		out += fmt.Sprintf(" per_shard=%v", s.perShard)
	}
	return out
}

func (s loadSummary) logAttrs() []any {
	return []any{"requests", s.requests, "ok", s.ok, "replayed", s.replayed, "retried", s.retries,
		"retry_replayed", s.retryReplay, "resent_after_unknown", s.resent, "outcome_unknown", s.unknown,
		"unavailable", s.unavailable, "conflicts", s.conflicts, "refused", s.refused, "reruns", s.reruns, "per_shard", fmt.Sprint(s.perShard)}
}

// loader is one load run: the shared client, the stats, the ack log.
type loader struct {
	c     *client.Client
	cfg   loadConfig
	log   *slog.Logger
	runID string // request IDs are unique to this run
	stats loadStats

	// sending ends when the run should send no new request: its context
	// ended, or a request failed in a way a load run must not (fail).
	sending    context.Context
	endSending context.CancelCauseFunc
	// inFlight ends the requests still running: loadDrain after sending
	// ended, or at once on a failure.
	inFlight    context.Context
	endInFlight context.CancelCauseFunc

	ackMu  sync.Mutex
	ackLog *os.File
}

// loadDrain is how long the requests in flight when a run ends may take
// to be answered before they are given up (counted outcome-unknown or
// unavailable): long enough for an ack from a live cluster, short enough
// that a run against a dead one stops promptly.
const loadDrain = 5 * time.Second

// errLoadDrained ends the requests still unanswered loadDrain after the
// run's end.
var errLoadDrained = errors.New("oncewal load: the run ended and the requests in flight were not answered within the drain time")

// runLoadWith runs the load until ctx ends or a request fails in a way a
// load run must not (the error), and returns the summary either way — nil
// if the run could not start (the error says why).
func runLoadWith(ctx context.Context, log *slog.Logger, cfg loadConfig) (*loadSummary, error) {
	start := time.Now()
	c, err := client.New(cfg.client)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ld := &loader{c: c, cfg: cfg, log: log, runID: cfg.runID}
	if ld.runID == "" {
		var seed [8]byte
		_, _ = rand.Read(seed[:])
		ld.runID = fmt.Sprintf("%x", seed)
	}
	if cfg.ackLog != "" {
		// Appended to, one write per request, never synced: a kill -9 of
		// a node does not touch this process, and what a test reads is in
		// the page cache.
		f, err := os.OpenFile(cfg.ackLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("--ack-log: %w", err)
		}
		defer f.Close()
		ld.ackLog = f
	}
	ld.sending, ld.endSending = context.WithCancelCause(ctx)
	defer ld.endSending(nil)
	ld.inFlight, ld.endInFlight = context.WithCancelCause(context.Background())
	defer ld.endInFlight(nil)
	drained := make(chan struct{})
	go func() {
		select {
		case <-ld.sending.Done():
		case <-drained:
			return
		}
		t := time.NewTimer(loadDrain)
		defer t.Stop()
		select {
		case <-t.C:
			ld.endInFlight(errLoadDrained)
		case <-drained:
		}
	}()
	log.Info("oncewal load: running", "addrs", strings.Join(cfg.client.Addrs, ","), "clients", cfg.clients,
		"rate_per_s", cfg.rate, "retry_rate", cfg.retryRate, "ack", cfg.client.Ack.String(), "run", ld.runID)

	statsDone := make(chan struct{})
	var statsWG sync.WaitGroup
	statsWG.Go(func() {
		last, lastAt := loadSummary{}, start
		every(cfg.statsEvery, statsDone, func() {
			now := time.Now()
			s := ld.stats.snapshot(now.Sub(start))
			rate := float64(s.answered()-last.answered()) / max(now.Sub(lastAt).Seconds(), 1e-9)
			log.Info("oncewal load: stats", append(s.logAttrs(), "answered_per_s", int64(rate))...)
			last, lastAt = s, now
		})
	})
	var wg sync.WaitGroup
	for i := range cfg.clients {
		wg.Go(func() { ld.runClient(i) })
	}
	wg.Wait()
	close(drained)
	close(statsDone)
	statsWG.Wait()
	s := ld.stats.snapshot(time.Since(start))
	log.Info("oncewal load: done", s.logAttrs()...)
	if err := context.Cause(ld.sending); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return &s, err
	}
	if s.requests > 0 && s.answered() == 0 {
		return &s, fmt.Errorf("none of %d requests was answered: check that a node of --addrs (%s) is up and one leads",
			s.requests, strings.Join(cfg.client.Addrs, ","))
	}
	return &s, nil
}

// fail ends the run at once: err is a bug a load run must not meet.
func (ld *loader) fail(err error) {
	ld.endSending(err)
	ld.endInFlight(err)
}

// runClient is client i: it sends its share of the rate until the run
// stops sending.
func (ld *loader) runClient(i int) {
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), uint64(i)))
	var gap time.Duration // between the client's requests; 0: unpaced
	if ld.cfg.rate > 0 {
		gap = time.Duration(float64(time.Second) * float64(ld.cfg.clients) / ld.cfg.rate)
	}
	next := time.Now()
	for n := uint64(0); ld.sending.Err() == nil; n++ {
		if gap > 0 {
			if lag := time.Since(next); lag > loadMaxLag {
				next = time.Now()
			}
			if ctxtime.Sleep(ld.sending, time.Until(next)) != nil {
				return
			}
			next = next.Add(gap)
		}
		id := loadRequestID(ld.runID, i, n)
		send := ld.request(n)
		ld.stats.requests.Add(1)
		res, err := ld.submit(id, send)
		if err != nil {
			continue
		}
		if res.replayed {
			ld.stats.replayed.Add(1)
		} else {
			ld.stats.ok.Add(1)
		}
		if res.keyed {
			ld.stats.inShard(res.shard)
		}
		if err := ld.acked(id); err != nil {
			ld.fail(err)
			return
		}
		if rng.Float64() < ld.cfg.retryRate {
			ld.retry(id, send)
		}
	}
}

// loadAnswer is what a load request was answered: whether it was a
// replay, the LSN, and for a transaction (keyed) its shard.
type loadAnswer struct {
	replayed, keyed bool
	lsn             uint64
	shard           uint32
}

// request is the n-th request's sending: the default payload through
// Submit, or with --keys an add to key n mod keys through Txn.
func (ld *loader) request(n uint64) func(ctx context.Context, id string) (loadAnswer, error) {
	if ld.cfg.keys == 0 {
		payload := loadPayload(n)
		return func(ctx context.Context, id string) (loadAnswer, error) {
			res, err := ld.c.Submit(ctx, id, payload)
			return loadAnswer{replayed: res.Replayed, lsn: res.LSN}, err
		}
	}
	t := client.Txn{Then: []client.TxnOp{client.OpAdd(loadKey(n, ld.cfg.keys), 1)}}
	return func(ctx context.Context, id string) (loadAnswer, error) {
		res, err := ld.c.Txn(ctx, id, t)
		return loadAnswer{replayed: res.Replayed, keyed: true, lsn: res.LSN, shard: res.Shard}, err
	}
}

// loadKey is the key --keys request n adds to.
func loadKey(n uint64, keys int) []byte { return fmt.Appendf(nil, "load/k%d", n%uint64(keys)) }

// submit sends the request until it is answered: again with the same ID
// while its outcome is unknown and the run goes on, as a client must; a
// final error is counted (and a failure ends the run).
func (ld *loader) submit(id string, send func(context.Context, string) (loadAnswer, error)) (loadAnswer, error) {
	for {
		res, err := send(ld.inFlight, id)
		if err == nil {
			return res, nil
		}
		if errors.Is(err, client.ErrOutcomeUnknown) && ld.sending.Err() == nil {
			ld.stats.resent.Add(1)
			continue
		}
		ld.failed(id, err)
		return res, err
	}
}

// retry sends an answered request again, as a client that lost its answer
// would; the answer must be its replay.
func (ld *loader) retry(id string, send func(context.Context, string) (loadAnswer, error)) {
	ld.stats.retries.Add(1)
	res, err := ld.submit(id, send)
	switch {
	case err != nil:
	case res.replayed:
		ld.stats.retryReplay.Add(1)
	default:
		ld.stats.reruns.Add(1)
		ld.fail(fmt.Errorf("request %q was answered OK twice (LSN %d the second time): it ran twice; a retry of an answered request must be its replay", id, res.lsn))
	}
}

// failed counts a request that ended without an answer; a conflict, a
// refusal and a denied identity end the run.
func (ld *loader) failed(id string, err error) {
	switch {
	case errors.Is(err, client.ErrConflict):
		ld.stats.conflicts.Add(1)
	case errors.Is(err, client.ErrRefused), errors.Is(err, client.ErrDenied), errors.Is(err, client.ErrRejected):
		ld.stats.refused.Add(1)
	case errors.Is(err, client.ErrOutcomeUnknown):
		ld.stats.unknown.Add(1)
		return
	default: // ErrUnavailable, the run's end: it did not run
		ld.stats.unavailable.Add(1)
		return
	}
	ld.fail(fmt.Errorf("request %q: %w", id, err))
}

// acked appends id's client key to the ack log, if any.
func (ld *loader) acked(id string) error {
	if ld.ackLog == nil {
		return nil
	}
	k := idempotency.ClientKey([]byte(id))
	ld.ackMu.Lock()
	defer ld.ackMu.Unlock()
	if _, err := ld.ackLog.Write(k[:]); err != nil {
		return fmt.Errorf("--ack-log: %w", err)
	}
	return nil
}

// loadRequestID names client i's n-th request of run: unique to the run,
// which a random run ID makes unique among runs of one principal.
func loadRequestID(run string, i int, n uint64) string {
	return fmt.Sprintf("oncewal-load-%s-%d-%d", run, i, n)
}

// loadPayload is the n-th request's payload: the operations oncewal leader
// --generate logs (genClient.request), one per request — deletes 10 %,
// adds to "counter" 30 %, puts 60 %, over 16 keys.
func loadPayload(n uint64) []byte {
	key := fmt.Appendf(nil, "k%d", n%16)
	switch n % 10 {
	case 0:
		return client.Ops(client.Delete(key))
	case 1, 2, 3:
		return client.Ops(client.Add([]byte("counter"), 1))
	}
	return client.Ops(client.Put(key, fmt.Appendf(nil, "v%d", n)))
}

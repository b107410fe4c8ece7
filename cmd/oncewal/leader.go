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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

const leaderSynopsis = `leader --wal DIR --listen ADDR [--shard N] [--epoch N]
                      [--tls-ca F --tls-cert F --tls-key F | --insecure] [--generate RATE --sessions N]

Serves the shard's WAL in DIR to followers over gRPC (mutual TLS unless
--insecure). With --generate it is also the writer: it appends a generated
client workload at RATE events/s (sessions opening, puts, deletes,
non-idempotent adds, each with an idempotency key) and ships only what it has
synced. Without --generate it ships what is already in DIR. Stops cleanly on
SIGINT/SIGTERM; logs its stats every --stats-interval.`

// Bounds of the generated workload. A batch of maxGenerateBatch generated
// events stays far below wal.MaxBodySize; more sessions than
// maxGenerateSessions only cost memory.
const (
	maxGenerateRate     = 10_000_000
	maxGenerateSessions = 1_000_000
	maxGenerateBatch    = 100_000
)

func runLeader(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("leader", leaderSynopsis, stderr)
	walDir := fs.String("wal", "", "leader WAL directory (created with --generate)")
	listen := fs.String("listen", "127.0.0.1:7070", "address to serve followers on")
	shard := fs.Uint("shard", 0, "shard served")
	epoch := fs.Uint64("epoch", 1, "leader epoch written into batches (fencing); >= 1")
	tf := addTLSFlags(fs, "leader")
	rate := fs.Int("generate", 0, "append a generated workload at this many events/s (0: serve only)")
	sessions := fs.Int("sessions", 100, "concurrent client sessions of the generated workload")
	batch := fs.Int("batch", 256, "max events per generated batch")
	statsEvery := fs.Duration("stats-interval", 10*time.Second, "log stats this often (0: only at exit)")
	lf := addLogFlags(fs)
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	var c flagCheck
	if *walDir == "" {
		c.failf("--wal is required")
	}
	hostPort(&c, "listen", *listen, false)
	inRange(&c, "shard", *shard, 0, math.MaxUint32)
	atLeast(&c, "epoch", *epoch, 1)
	inRange(&c, "generate", *rate, 0, maxGenerateRate)
	inRange(&c, "sessions", *sessions, 1, maxGenerateSessions)
	inRange(&c, "batch", *batch, 1, maxGenerateBatch)
	atLeast(&c, "stats-interval", *statsEvery, 0)
	lf.check(&c)
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}
	tlsCfg, msg, err := tf.load(true)
	if msg != "" {
		return usageError(fs, stderr, "%s", msg)
	}
	log := lf.logger(stderr)
	if err != nil {
		log.Error("oncewal leader: TLS", "err", err)
		return exitFailure
	}
	if tlsCfg == nil {
		log.Warn("oncewal leader: --insecure: plaintext, unauthenticated; use only on loopback for tests")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serveLeader(ctx, log, leaderConfig{
		walDir: *walDir, listen: *listen, shard: uint32(*shard), epoch: *epoch, tls: tlsCfg,
		rate: *rate, sessions: *sessions, batch: *batch, statsEvery: *statsEvery,
	}); err != nil {
		log.Error("oncewal leader: stopped", "err", err)
		return exitFailure
	}
	return exitOK
}

type leaderConfig struct {
	walDir, listen string
	shard          uint32
	epoch          uint64
	tls            *tls.Config // nil: --insecure
	rate, sessions int
	batch          int
	statsEvery     time.Duration
	ready          func(addr string) // tests: called once serving
}

func serveLeader(ctx context.Context, log *slog.Logger, c leaderConfig) (err error) {
	var w *wal.Writer
	var durable func() uint64
	if c.rate > 0 {
		if w, err = wal.OpenWriter(c.walDir, &wal.WriterOptions{Shard: c.shard}); err != nil {
			return err
		}
		defer func() {
			if cerr := w.Close(); err == nil {
				err = cerr
			}
		}()
		durable = w.DurableLSN
	} else if _, err := os.Stat(c.walDir); err != nil {
		return err
	}
	sopts := &grpctransport.ServerOptions{Logger: log, TLS: c.tls, Insecure: c.tls == nil}
	srv, err := grpctransport.Listen(c.listen, sopts)
	if err != nil {
		return err
	}
	defer srv.Close()

	notify := make(chan struct{}, 1)
	ship, err := replication.NewShipper(replication.ShipperOptions{
		WALDir: c.walDir, Shard: c.shard, Listener: srv,
		Epoch:      func() uint64 { return c.epoch },
		Notify:     notify,
		DurableLSN: durable,
		Logger:     log,
	})
	if err != nil {
		return err
	}
	log.Info("oncewal leader: serving", "wal", c.walDir, "listen", srv.Addr().String(), "shard", c.shard,
		"epoch", c.epoch, "mtls", sopts.TLS != nil, "generate_per_s", c.rate)
	if c.ready != nil {
		c.ready(srv.Addr().String())
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var shipErr, genErr error
	var generated atomic.Uint64
	wg.Go(func() {
		shipErr = ship.Run(runCtx)
		cancel()
	})
	if w != nil {
		wg.Go(func() {
			genErr = generate(runCtx, w, c, notify, &generated)
			if genErr != nil {
				cancel()
			}
		})
	}
	logStats := func() {
		s, t := ship.Stats(), srv.Stats()
		attrs := []any{"acked_lsn", s.AckedLSN, "sent_lsn", s.SentLSN, "batches_sent", s.BatchesSent,
			"resent", s.BatchesResent, "bytes_sent", s.BytesSent, "acks", s.Acks, "refusals", s.Refusals,
			"connections", s.Connections, "tls_refused", t.RefusedTLS, "bad_frames", t.BadFrames}
		if w != nil {
			attrs = append(attrs, "events_generated", generated.Load(), "durable_lsn", w.DurableLSN())
		}
		log.Info("oncewal leader: stats", attrs...)
	}
	wg.Go(func() { every(c.statsEvery, runCtx.Done(), logStats) })
	wg.Wait()
	logStats()
	log.Info("oncewal leader: stopped")
	switch {
	case genErr != nil:
		return fmt.Errorf("generator: %w", genErr)
	case shipErr != nil && !errors.Is(shipErr, context.Canceled):
		return shipErr
	}
	return nil
}

// generate appends a synthetic client workload: each tick, a batch of
// events spread over the live sessions, keyed as clients would (DeriveKey of
// session, SeqNo and op bytes). It syncs every batch (the writer's default
// policy) and nudges the shipper.
func generate(ctx context.Context, w *wal.Writer, c leaderConfig, notify chan<- struct{}, n *atomic.Uint64) error {
	seq := session.NewSequencer()
	ids := make([]session.ID, c.sessions)
	var evs []wal.Event
	var op []byte
	add := func(ev wal.Event) {
		ev.Seq = seq.Next(ev.Session)
		ev.Time = time.Now().UnixNano()
		ev.HasIdemKey = true
		op = ev.AppendOpBytes(op[:0])
		ev.IdemKey = idempotency.DeriveKey(ev.Session, ev.Seq, op)
		evs = append(evs, ev)
	}
	flush := func() error {
		for len(evs) > 0 {
			k := min(len(evs), c.batch)
			if _, err := w.Append(c.epoch, evs[:k]); err != nil {
				return err
			}
			n.Add(uint64(k))
			evs = evs[k:]
		}
		evs = evs[:0]
		select {
		case notify <- struct{}{}:
		default:
		}
		return nil
	}
	for i := range ids {
		ids[i] = session.NewID()
		add(wal.Event{Op: wal.OpOpen, Session: ids[i]})
	}
	if err := flush(); err != nil {
		return err
	}
	const tick = 10 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start, done := time.Now(), uint64(0)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		due := uint64(time.Since(start).Seconds() * float64(c.rate))
		for ; done < due; done++ {
			id := ids[done%uint64(len(ids))]
			key := fmt.Appendf(nil, "k%d", done%16)
			switch done % 10 {
			case 0:
				add(wal.Event{Op: wal.OpDelete, Session: id, Key: key})
			case 1, 2, 3:
				add(wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("counter"), Delta: 1})
			default:
				add(wal.Event{Op: wal.OpPut, Session: id, Key: key, Value: fmt.Appendf(nil, "v%d", done)})
			}
		}
		if err := flush(); err != nil {
			return err
		}
	}
}

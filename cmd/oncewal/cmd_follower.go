package main

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

const followerSynopsis = `follower --dir DIR --leader ADDR --shard N [--tls-ca F --tls-cert F --tls-key F | --insecure]

Replicates shard N from the leader at ADDR (gRPC, mutual TLS unless
--insecure) into the follower store in DIR (created if missing): every
distinct event is applied exactly once, across reconnects and restarts of
either side. Stops cleanly on SIGINT/SIGTERM (the store is flushed and
closed); logs its stats every --stats-interval.`

func runFollower(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("follower", followerSynopsis, stderr)
	dir := fs.String("dir", "", "follower store directory")
	leader := fs.String("leader", "", "leader address host:port (with TLS, the host must be named in the leader's certificate)")
	shard := fs.Uint("shard", 0, "shard replicated")
	tf := addTLSFlags(fs, "follower")
	serverName := fs.String("tls-server-name", "", "name to verify in the leader's certificate (default: the host of --leader)")
	statsEvery := fs.Duration("stats-interval", 10*time.Second, "log stats this often (0: only at exit)")
	noSync := fs.Bool("nosync", false, "commit without fsync (faster; an ack then does not prove durability)")
	lf := addLogFlags(fs)
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	var c flagCheck
	if *dir == "" || *leader == "" {
		c.failf("--dir and --leader are required")
	}
	if *leader != "" {
		hostPort(&c, "leader", *leader, true)
	}
	inRange(&c, "shard", *shard, 0, math.MaxUint32)
	atLeast(&c, "stats-interval", *statsEvery, 0)
	lf.check(&c)
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}
	tlsCfg, msg, err := tf.load(false)
	if msg != "" {
		return usageError(fs, stderr, "%s", msg)
	}
	log := lf.logger(stderr)
	if err != nil {
		log.Error("oncewal follower: TLS", "err", err)
		return exitFailure
	}
	if tlsCfg != nil {
		tlsCfg.ServerName = *serverName
	} else {
		log.Warn("oncewal follower: --insecure: plaintext, unauthenticated; use only on loopback for tests")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serveFollower(ctx, log, followerConfig{
		dir: *dir, leader: *leader, shard: uint32(*shard), tls: tlsCfg, noSync: *noSync, statsEvery: *statsEvery,
	}); err != nil {
		log.Error("oncewal follower: stopped", "err", err)
		return exitFailure
	}
	return exitOK
}

type followerConfig struct {
	dir, leader string
	shard       uint32
	tls         *tls.Config // nil: insecure
	noSync      bool
	statsEvery  time.Duration
	opened      func(*follower.Follower) // tests
}

func serveFollower(ctx context.Context, log *slog.Logger, c followerConfig) (err error) {
	d, err := grpctransport.NewDialer(c.leader, &grpctransport.DialerOptions{TLS: c.tls, Insecure: c.tls == nil, Logger: log})
	if err != nil {
		return err
	}
	defer d.Close()
	f, err := follower.Open(c.dir, &follower.Options{Shard: c.shard, NoSync: c.noSync, Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		// Close waits for Serve, flushes the memtable and closes the store.
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		lsn, epoch := f.Position()
		log.Info("oncewal follower: closed", "applied_lsn", lsn, "epoch", epoch)
	}()
	if c.opened != nil {
		c.opened(f)
	}
	logStats := func() {
		lsn, epoch := f.Position()
		log.Info("oncewal follower: stats", followerStatsAttrs(lsn, epoch, f.Stats(), d.Stats())...)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { every(c.statsEvery, done, logStats) })
	log.Info("oncewal follower: replicating", "leader", c.leader, "dir", c.dir, "shard", c.shard, "mtls", c.tls != nil)
	err = f.Serve(ctx, d)
	close(done)
	wg.Wait()
	logStats()
	return err
}

// followerStatsAttrs is the periodic stats line. Every term of the receiver's
// accounting identity is in it, so the line itself shows that
// events = applied + discarded_* + skipped_closed + skipped_too_old +
// refused_events; the batches refused are broken down by reason.
func followerStatsAttrs(lsn, epoch uint64, s follower.Stats, t grpctransport.DialerStats) []any {
	r := s.Receiver
	return []any{"applied_lsn", lsn, "epoch", epoch,
		"batches", r.Batches, "events", r.Events, "applied", r.Applied,
		"discarded_position", r.DiscardedPosition, "discarded_hwm", r.DiscardedHWM,
		"discarded_window", r.DiscardedWindow, "discarded_in_batch", r.DiscardedInBatch,
		"skipped_closed", r.SkippedClosed, "skipped_too_old", r.SkippedTooOld, "refused_events", r.RefusedEvents,
		"refused_gap", r.SeqGaps + r.OutOfOrder, "refused_stale_epoch", r.StaleEpochs, "refused_wrong_shard", r.WrongShard,
		"refused_corrupt", r.Corrupt, "refused_apply_error", r.ApplyErrors,
		"window", s.WindowLen, "dials", t.Dials, "dial_failures", t.DialFailures, "bytes_received", t.BytesReceived}
}

package testutil

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/wal"
)

// PipelineConfig describes one end-to-end run: a leader writing a generated
// workload to its WAL, a Shipper, an InProcess transport with seeded faults,
// and a follower that is restarted (cleanly or by a crash) along the way.
type PipelineConfig struct {
	Dir      string // leader WAL in Dir/leader, follower store in Dir/follower
	Seed     uint64
	Workload WorkloadConfig // Workload.Seed defaults to Seed
	Faults   replication.FaultConfig
	Restarts int // follower restarts during the run; every second one is a crash
	Shard    uint32
	Epoch    uint64           // leader epoch; default 1
	Follower follower.Options // base options (FS, Logger, …)
	// Shipper tuning for tests: short retransmit timeouts keep runs fast.
	RetransmitTimeout time.Duration // default 20ms
	Progress          func(applied, total uint64)
	Timeout           time.Duration // default 2 minutes
	// Transport, if set, makes the link between shipper and follower: it
	// returns the leader's Listener, the follower's Dialer and a func that
	// closes both (called once at the end). Faults is then ignored and
	// PipelineResult.Transport stays zero. Default: an InProcess transport
	// injecting Faults.
	Transport func() (replication.Listener, replication.Dialer, func() error, error)
}

// PipelineResult is what happened in a run.
type PipelineResult struct {
	Workload  *Workload
	Batches   int    // batches the leader logged
	LastLSN   uint64 // last LSN the leader logged
	Follower  replication.Stats
	Shipper   replication.ShipperStats
	Transport replication.InProcessStats
	Restarts  int // clean restarts
	Crashes   int // abrupt stops (Kill)
	Elapsed   time.Duration
	// Verified is true when the follower's final state equals the oracle and
	// its counters account for every delivered event; VerifyErr says why not.
	Verified  bool
	VerifyErr error
}

// RunPipeline runs cfg to completion: every logged batch applied, then verified.
func RunPipeline(ctx context.Context, cfg PipelineConfig) (*PipelineResult, error) {
	if cfg.Workload.Seed == 0 {
		cfg.Workload.Seed = cfg.Seed
	}
	if cfg.Epoch == 0 {
		cfg.Epoch = 1
	}
	if cfg.RetransmitTimeout == 0 {
		cfg.RetransmitTimeout = 20 * time.Millisecond
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	res := &PipelineResult{Workload: GenerateWorkload(cfg.Workload)}
	start := time.Now()
	w, err := wal.OpenWriter(filepath.Join(cfg.Dir, "leader"), &wal.WriterOptions{Shard: cfg.Shard})
	if err != nil {
		return nil, err
	}
	defer w.Close()

	tr := replication.NewInProcess(cfg.Faults, cfg.Seed)
	defer tr.Close()
	var listener replication.Listener = tr
	var dialer replication.Dialer = tr
	if cfg.Transport != nil {
		l, d, closeFn, err := cfg.Transport()
		if err != nil {
			return nil, fmt.Errorf("transport: %w", err)
		}
		defer closeFn()
		listener, dialer = l, d
	}
	notify := make(chan struct{}, 1)
	ship, err := replication.NewShipper(replication.ShipperOptions{
		WALDir:            filepath.Join(cfg.Dir, "leader"),
		Shard:             cfg.Shard,
		Listener:          listener,
		Epoch:             func() uint64 { return cfg.Epoch },
		Notify:            notify,
		DurableLSN:        w.DurableLSN,
		RetransmitTimeout: cfg.RetransmitTimeout,
		MaxBackoff:        10 * cfg.RetransmitTimeout,
		PollInterval:      time.Millisecond,
	})
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	shipCtx, stopShip := context.WithCancel(ctx)
	defer stopShip()
	wg.Add(1)
	go func() { defer wg.Done(); _ = ship.Run(shipCtx) }()

	// The leader appends while the follower replicates, as in production.
	var lastLSN uint64
	for _, evs := range res.Workload.Batches {
		h, err := w.Append(cfg.Epoch, evs)
		if err != nil {
			return nil, fmt.Errorf("leader append: %w", err)
		}
		lastLSN = h.LastLSN()
		select {
		case notify <- struct{}{}:
		default:
		}
	}
	res.Batches, res.LastLSN = len(res.Workload.Batches), lastLSN

	fopts := cfg.Follower
	fopts.Shard = cfg.Shard
	fdir := filepath.Join(cfg.Dir, "follower")
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7265))
	var total replication.Stats
	for incarnation := 0; ; incarnation++ {
		f, err := follower.Open(fdir, &fopts)
		if err != nil {
			return nil, err
		}
		serveCtx, stopServe := context.WithCancel(ctx)
		served := make(chan struct{})
		var serveErr error
		go func() { serveErr = f.Serve(serveCtx, dialer); close(served) }()

		// Restart when the follower reaches a random point of its share.
		restart := incarnation < cfg.Restarts
		target := lastLSN
		if restart {
			from, _ := f.Position()
			target = from + 1 + rng.Uint64N(max(1, (lastLSN-from)/uint64(cfg.Restarts-incarnation+1)))
		}
		err = waitPosition(ctx, f, target, served, cfg.Progress, lastLSN)
		stopServe()
		<-served
		if err == nil && serveErr != nil {
			err = serveErr
		}
		total = total.Add(f.Stats().Receiver)
		if err != nil || !restart {
			if err == nil {
				res.VerifyErr = res.Workload.Oracle.Verify(f.State())
			}
			if cErr := f.Close(); err == nil {
				err = cErr
			}
			if err != nil {
				return nil, err
			}
			break
		}
		if incarnation%2 == 1 {
			res.Crashes++
			err = f.Kill()
		} else {
			res.Restarts++
			err = f.Close()
		}
		if err != nil {
			return nil, err
		}
	}
	stopShip()
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.Follower = total
	res.Shipper = ship.Stats()
	res.Transport = tr.Stats()
	if res.VerifyErr == nil && total.Events != total.Accounted() {
		res.VerifyErr = fmt.Errorf("counters do not account for every delivered event: %d delivered, %d accounted", total.Events, total.Accounted())
	}
	res.Verified = res.VerifyErr == nil
	return res, nil
}

func waitPosition(ctx context.Context, f *follower.Follower, target uint64, served <-chan struct{}, progress func(uint64, uint64), total uint64) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		lsn, _ := f.Position()
		if progress != nil {
			progress(lsn, total)
		}
		if lsn >= target {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("follower stuck at LSN %d of %d: %w", lsn, target, ctx.Err())
		case <-served:
			return errors.New("follower: Serve returned early")
		case <-tick.C:
		}
	}
}

package testutil

import (
	"context"
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
	Follower follower.Options // base options (FS, Logger, …); redial backoff default 5ms up to 20ms
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

// stopForRestart stops a follower (or node) between incarnations of a run:
// every second restart is a kill, the others a clean Close.
func (res *PipelineResult) stopForRestart(f interface {
	Close() error
	Kill() error
}, incarnation int) error {
	if incarnation%2 == 1 {
		res.Crashes++
		return f.Kill()
	}
	res.Restarts++
	return f.Close()
}

// restartTarget picks the applied position at which an incarnation that
// opened at from is restarted: a random point of its share of what is left
// (left restarts to go), never past last. A follower can open already at
// last: the waiter polls the position, and while it waits to be scheduled the
// previous incarnation keeps applying past its target — on a loaded machine
// to the end of the log. The target is then last itself; from+1 would never
// be reached.
func restartTarget(rng *rand.Rand, from, last uint64, left int) uint64 {
	if from >= last {
		return last
	}
	return from + 1 + rng.Uint64N(max(1, (last-from)/uint64(left+1)))
}

// ensureDefaults fills the zero fields with the defaults their comments name.
func (c *PipelineConfig) ensureDefaults() {
	if c.Workload.Seed == 0 {
		c.Workload.Seed = c.Seed
	}
	if c.Epoch == 0 {
		c.Epoch = 1
	}
	if c.RetransmitTimeout == 0 {
		c.RetransmitTimeout = 20 * time.Millisecond
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	// Redial fast: fault-injecting transports drop links all the time, and
	// the follower's production backoff would make a run mostly waiting.
	if c.Follower.ReconnectBackoff == 0 {
		c.Follower.ReconnectBackoff = 5 * time.Millisecond
	}
	if c.Follower.MaxReconnectBackoff == 0 {
		c.Follower.MaxReconnectBackoff = 20 * time.Millisecond
	}
}

// RunPipeline runs cfg to completion: every logged batch applied, then verified.
func RunPipeline(ctx context.Context, cfg PipelineConfig) (*PipelineResult, error) {
	cfg.ensureDefaults()
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
			target = restartTarget(rng, from, lastLSN, cfg.Restarts-incarnation)
		}
		err = waitUntil(ctx, func() (uint64, bool) { lsn, _ := f.Position(); return lsn, lsn >= target }, served, cfg.Progress, lastLSN)
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
		if err := res.stopForRestart(f, incarnation); err != nil {
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

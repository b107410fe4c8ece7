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
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// ShardedPipelineConfig describes an end-to-end run of a sharded deployment:
// a replication.Leader (one WAL and one Shipper per shard) logging a
// generated workload routed by session, one InProcess transport per shard
// with faults seeded independently per shard, and one follower.Node serving
// every shard, restarted (cleanly or by a kill) along the way.
//
// Fields of PipelineConfig keep their meaning, for the whole node: Dir holds
// the leader WAL (Dir/leader) and the node (Dir/follower); Restarts counts
// node restarts; Follower is the per-shard options template. Shard and
// Transport are ignored.
type ShardedPipelineConfig struct {
	PipelineConfig
	// Shards is the deployment's shard count. Default 1.
	Shards int
	// ShardFaults, if set, gives shard s its own fault config (default
	// Faults for every shard).
	ShardFaults func(shard uint32) replication.FaultConfig
	// Node adjusts the node options (PerShard hooks, ReopenBackoff, …); its
	// Follower template is replaced by PipelineConfig.Follower.
	Node follower.NodeOptions
	// Wrap, if set, wraps shard s's follower-side Dialer (to stall a shard's
	// link in tests).
	Wrap func(shard uint32, d replication.Dialer) replication.Dialer
	// Skip, if set, leaves a shard out of the wait for completion and out of
	// verification (a shard a test deliberately breaks).
	Skip func(shard uint32) bool
}

// ShardResult is one shard's part of a sharded run.
type ShardResult struct {
	Shard     uint32
	Batches   int    // batches the leader logged for the shard
	LastLSN   uint64 // last LSN of the shard's log
	Sessions  int    // sessions routed to the shard
	Follower  replication.Stats
	Shipper   replication.ShipperStats
	Transport replication.InProcessStats
}

// ShardedPipelineResult is what happened in a sharded run. The embedded
// PipelineResult holds totals over shards (Batches, LastLSN and Follower are
// sums; Shipper and Transport are field-wise sums).
type ShardedPipelineResult struct {
	PipelineResult
	Shards []ShardResult
	Node   follower.NodeStats // the final node incarnation's view
}

// ShardSeed derives shard's fault seed from a run's seed, so every shard's
// transport draws an independent fault stream (splitmix64 of seed+shard).
func ShardSeed(seed uint64, shard uint32) uint64 {
	z := seed + (uint64(shard)+1)*0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// RoutedState reads a sharded follower's session state: each session from
// the shard the router assigns it, so a session applied on the wrong shard
// shows up as missing.
type RoutedState struct {
	Router replication.ShardRouter
	Node   *follower.Node
}

// Keys implements StateReader.
func (r RoutedState) Keys(id session.ID) (map[string][]byte, error) {
	var out map[string][]byte
	err := r.Node.Follower(r.Router.Shard(id), func(f *follower.Follower) error {
		var err error
		out, err = f.State().Keys(id)
		return err
	})
	return out, err
}

// skipState verifies only sessions of shards that are not skipped.
type skipState struct {
	RoutedState
	skip func(uint32) bool
	want func(session.ID) map[string][]byte
}

func (s skipState) Keys(id session.ID) (map[string][]byte, error) {
	if s.skip(s.Router.Shard(id)) {
		return s.want(id), nil
	}
	return s.RoutedState.Keys(id)
}

// RunShardedPipeline runs cfg to completion: every shard's log applied on the
// node, then the node's state verified against the oracle session by session
// (through RoutedState) and every shard's counters checked.
func RunShardedPipeline(ctx context.Context, cfg ShardedPipelineConfig) (*ShardedPipelineResult, error) {
	if cfg.Shards <= 0 {
		cfg.Shards = 1
	}
	cfg.PipelineConfig.ensureDefaults()
	if cfg.Skip == nil {
		cfg.Skip = func(uint32) bool { return false }
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	router, err := replication.NewShardRouter(cfg.Shards)
	if err != nil {
		return nil, err
	}
	res := &ShardedPipelineResult{PipelineResult: PipelineResult{Workload: GenerateWorkload(cfg.Workload)}}
	start := time.Now()

	trs := make([]*replication.InProcess, cfg.Shards)
	for s := range trs {
		faults := cfg.Faults
		if cfg.ShardFaults != nil {
			faults = cfg.ShardFaults(uint32(s))
		}
		trs[s] = replication.NewInProcess(faults, ShardSeed(cfg.Seed, uint32(s)))
		defer trs[s].Close()
	}
	leader, err := replication.OpenLeader(replication.LeaderOptions{
		Dir:      filepath.Join(cfg.Dir, "leader"),
		Shards:   cfg.Shards,
		Epoch:    cfg.Epoch,
		Listener: func(s uint32) replication.Listener { return trs[s] },
		Shipper: replication.ShipperOptions{
			RetransmitTimeout: cfg.RetransmitTimeout,
			MaxBackoff:        10 * cfg.RetransmitTimeout,
			PollInterval:      time.Millisecond,
		},
	})
	if err != nil {
		return nil, err
	}
	defer leader.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	shipCtx, stopShip := context.WithCancel(ctx)
	defer stopShip()
	wg.Go(func() { _ = leader.Run(shipCtx) })

	// The leader routes each logged batch's events by session, as an
	// embedder would, and appends one batch per shard that got events.
	res.Shards = make([]ShardResult, cfg.Shards)
	for s := range res.Shards {
		res.Shards[s].Shard = uint32(s)
	}
	for _, id := range res.Workload.Oracle.Sessions() {
		res.Shards[router.Shard(id)].Sessions++
	}
	var split [][]wal.Event
	for _, evs := range res.Workload.Batches {
		split = router.Split(evs, split)
		for s, part := range split {
			if len(part) == 0 {
				continue
			}
			h, err := leader.Append(uint32(s), part)
			if err != nil {
				return nil, fmt.Errorf("leader append shard %d: %w", s, err)
			}
			res.Shards[s].Batches++
			res.Shards[s].LastLSN = h.LastLSN()
		}
	}
	var lastLSN uint64
	for _, sr := range res.Shards {
		res.Batches += sr.Batches
		lastLSN += sr.LastLSN
	}
	res.LastLSN = lastLSN

	nopts := cfg.Node
	nopts.Follower = cfg.Follower
	shards := make([]uint32, cfg.Shards)
	for s := range shards {
		shards[s] = uint32(s)
	}
	dial := func(s uint32) replication.Dialer {
		if cfg.Wrap != nil {
			return cfg.Wrap(s, trs[s])
		}
		return trs[s]
	}
	// applied sums the positions of the shards that must complete.
	applied := func(n *follower.Node) uint64 {
		var sum uint64
		for _, s := range shards {
			if cfg.Skip(s) {
				continue
			}
			lsn, _, _ := n.Position(s)
			sum += lsn
		}
		return sum
	}
	var want uint64
	for _, sr := range res.Shards {
		if !cfg.Skip(sr.Shard) {
			want += sr.LastLSN
		}
	}
	fdir := filepath.Join(cfg.Dir, "follower")
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7265))
	retired := make([]replication.Stats, cfg.Shards)
	for incarnation := 0; ; incarnation++ {
		node, err := follower.OpenNode(fdir, shards, &nopts)
		if err != nil {
			return nil, err
		}
		serveCtx, stopServe := context.WithCancel(ctx)
		served := make(chan struct{})
		go func() { _ = node.Serve(serveCtx, dial); close(served) }()

		restart := incarnation < cfg.Restarts
		target := want
		if restart {
			from := applied(node)
			target = restartTarget(rng, from, want, cfg.Restarts-incarnation)
		}
		err = waitUntil(ctx, func() (uint64, bool) { a := applied(node); return a, a >= target }, served, cfg.Progress, want)
		stopServe()
		<-served
		if err != nil || !restart {
			if err == nil {
				res.Node = node.Stats()
				res.VerifyErr = res.Workload.Oracle.Verify(skipState{
					RoutedState: RoutedState{Router: router, Node: node},
					skip:        cfg.Skip,
					want:        res.Workload.Oracle.Expect,
				})
			}
			if cErr := node.Close(); err == nil && !cfg.anySkipped(shards) {
				err = cErr
			}
			for _, ss := range node.Stats().Shards {
				retired[ss.Shard] = retired[ss.Shard].Add(ss.Receiver)
			}
			if err != nil {
				return nil, err
			}
			break
		}
		err = res.stopForRestart(node, incarnation)
		for _, ss := range node.Stats().Shards {
			retired[ss.Shard] = retired[ss.Shard].Add(ss.Receiver)
		}
		if err != nil {
			return nil, err
		}
	}
	stopShip()
	wg.Wait()
	res.Elapsed = time.Since(start)
	for s := range res.Shards {
		sr := &res.Shards[s]
		sr.Follower = retired[s]
		sr.Shipper, _ = shipperOf(leader, sr.Shard)
		sr.Transport = trs[s].Stats()
		res.Follower = res.Follower.Add(sr.Follower)
		res.Shipper = addShipperStats(res.Shipper, sr.Shipper)
		res.Transport = addInProcessStats(res.Transport, sr.Transport)
		if res.VerifyErr == nil && !cfg.Skip(sr.Shard) && sr.Follower.Events != sr.Follower.Accounted() {
			res.VerifyErr = fmt.Errorf("shard %d: counters do not account for every delivered event: %d delivered, %d accounted",
				sr.Shard, sr.Follower.Events, sr.Follower.Accounted())
		}
	}
	res.Verified = res.VerifyErr == nil
	return res, nil
}

func (c ShardedPipelineConfig) anySkipped(shards []uint32) bool {
	for _, s := range shards {
		if c.Skip(s) {
			return true
		}
	}
	return false
}

func shipperOf(l *replication.Leader, s uint32) (replication.ShipperStats, error) {
	sh, err := l.Shipper(s)
	if err != nil {
		return replication.ShipperStats{}, err
	}
	return sh.Stats(), nil
}

// waitUntil polls done until it reports true, ctx ends or served closes.
// waitUntil polls done (which reports the applied position and whether the
// target is reached) until it is, ctx ends, or Serve returns (served).
func waitUntil(ctx context.Context, done func() (uint64, bool), served <-chan struct{}, progress func(uint64, uint64), total uint64) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		pos, ok := done()
		if progress != nil {
			progress(pos, total)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("follower stuck at applied position %d of %d: %w", pos, total, ctx.Err())
		case <-served:
			return errors.New("follower: Serve returned early")
		case <-tick.C:
		}
	}
}

func addShipperStats(a, b replication.ShipperStats) replication.ShipperStats {
	a.Connections += b.Connections
	a.BadHellos += b.BadHellos
	a.BatchesSent += b.BatchesSent
	a.BatchesResent += b.BatchesResent
	a.BytesSent += b.BytesSent
	a.Acks += b.Acks
	a.Refusals += b.Refusals
	a.Rewinds += b.Rewinds
	a.Timeouts += b.Timeouts
	a.ReaderErrors += b.ReaderErrors
	a.AckedLSN += b.AckedLSN
	a.SentLSN += b.SentLSN
	return a
}

func addInProcessStats(a, b replication.InProcessStats) replication.InProcessStats {
	a.Dials += b.Dials
	a.Accepts += b.Accepts
	a.BatchesSent += b.BatchesSent
	a.BatchesDelivered += b.BatchesDelivered
	a.BatchesDropped += b.BatchesDropped
	a.BatchesDuplicated += b.BatchesDuplicated
	a.BatchesReordered += b.BatchesReordered
	a.BatchesDelayed += b.BatchesDelayed
	a.AcksSent += b.AcksSent
	a.AcksDelivered += b.AcksDelivered
	a.AcksDropped += b.AcksDropped
	a.AcksDelayed += b.AcksDelayed
	a.Disconnects += b.Disconnects
	a.Lost += b.Lost
	return a
}

package follower_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/snapshot"
)

// BenchmarkDonorDuringRebuild measures the leader's replication to a live
// follower (events/s from the first client batch until the follower has
// applied the last) on its own ("idle") and while the leader donates
// snapshots of the same shard back to back to a rebuilding follower
// ("rebuilding", at the donor's default throttle,
// snapshot.DefaultRateLimit; "rebuilding-unthrottled" without one). On the
// OS filesystem, in process.
//
//	go test ./follower -run '^$' -bench DonorDuringRebuild -benchtime 3x
func BenchmarkDonorDuringRebuild(b *testing.B) {
	for _, mode := range []struct {
		name string
		rate int64 // 0: no rebuild
	}{{"idle", 0}, {"rebuilding", snapshot.DefaultRateLimit}, {"rebuilding-unthrottled", -1}} {
		b.Run(mode.name, func(b *testing.B) {
			var events uint64
			var elapsed time.Duration
			for i := range b.N {
				n, d := donorRun(b, i, mode.rate)
				events += n
				elapsed += d
			}
			b.ReportMetric(float64(events)/elapsed.Seconds(), "events/s")
		})
	}
}

func donorRun(b *testing.B, seed int, rate int64) (uint64, time.Duration) {
	dir := b.TempDir()
	w := sim.GenerateWorkload(sim.WorkloadOptions{Seed: uint64(seed) + 1, Sessions: 1000, Requests: 60000, BatchSize: 256})
	clock := sim.NewClock(w.Options.Start)
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	l, err := leader.Open(dir+"/leader", &leader.Options{
		Shards: 1, Followers: []string{"live"}, Wall: clock.Now, Logger: quietLogger,
		Store:    store.Options{Logger: quietLogger},
		Listener: func(uint32) replication.Listener { return tr },
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx) }()
	defer func() { cancel(); <-ran; _ = l.Close() }()
	f, err := follower.Open(dir+"/live", &follower.Options{Store: store.Options{ID: "live", Logger: quietLogger}})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	go func() { _ = f.Serve(ctx, tr) }()
	c := sim.NewClient(w, 1, clock)
	_, _ = c.Send(l) // something to snapshot from the start
	var wg sync.WaitGroup
	rctx, stopRebuild := context.WithCancel(ctx)
	if rate != 0 {
		donor, err := l.Donor(0, &snapshot.DonorOptions{RateLimit: rate})
		if err != nil {
			b.Fatal(err)
		}
		defer donor.Close()
		wg.Go(func() {
			for i := 0; rctx.Err() == nil; i++ {
				_, _, _ = snapshot.Rebuild(rctx, donor, vfs.Default, dir+"/rebuilt-"+strconv.Itoa(i), snapshot.Want{}, &snapshot.Options{RateLimit: -1})
			}
		})
	}
	start := time.Now()
	for !c.Done() {
		if _, err := c.Send(l); err != nil {
			b.Fatal(err)
		}
	}
	last := c.LastLSN(0)
	for {
		if lsn, _ := f.Position(); lsn >= last {
			break
		}
		time.Sleep(time.Millisecond)
	}
	d := time.Since(start)
	stopRebuild()
	wg.Wait()
	return last, d
}

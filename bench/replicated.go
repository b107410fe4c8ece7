package bench

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/leader"
)

// ReplicatedClients is how many clients the replicated rows of oncewal
// bench run: a leader serves many, and with one the leader's local apply
// of each batch sits between its appends (the repl2_1client row).
const ReplicatedClients = 4

// Replicated measures a replicated deployment's write path on the
// client-request workload (Pipeline's, retryPercent retries): a stamping
// leader on disk (WAL synced per batch, its own store applied) and
// followers real followers on disk (each batch synced), all in this
// process over the in-process transport. clients goroutines each append
// 1000-request batches of their own requests through leader.Shard.Append,
// without waiting for acks (group commit shares the leader's fsyncs when
// clients > 1); the clock stops when every client's last batch is
// acknowledged under AckMajority (a majority of the replicas, the leader
// included: with two followers, the leader and one of them). Compared with
// Pipeline, it adds the leader's stamping and store and a second follower,
// every copy fsynced per batch: on two cores the three stores' applies share
// the CPU one follower had to itself. It reports events/s and the process
// CPU per event.
func Replicated(followers, clients, retryPercent int) func(*testing.B) {
	return func(b *testing.B) {
		Release()
		r, err := openLeaderRig(followers)
		if err != nil {
			b.Fatal(err)
		}
		defer r.close()
		ctx := r.serve(b, followers)
		sh, _ := r.l.Shard(0)
		cs := make([]*clientRequests, clients)
		for i := range cs {
			cs[i] = newClientRequests(retryPercent, i, clients)
			cs[i].stamped = true
		}
		var mu sync.Mutex
		var last uint64
		var failed error
		// run has each client append its share of n batches (all of its
		// warm-up if warm), then waits for the majority ack of the last.
		run := func(n int, warm bool) {
			var wg sync.WaitGroup
			for i, c := range cs {
				share := n / clients
				if i < n%clients {
					share++
				}
				wg.Go(func() {
					for j := 0; warm && c.warming() || !warm && j < share; j++ {
						h, err := sh.Append(c.batch()...)
						mu.Lock()
						last = max(last, h.LastLSN())
						if err != nil && failed == nil {
							failed = err
						}
						mu.Unlock()
						if err != nil {
							return
						}
					}
				})
			}
			wg.Wait()
			if failed != nil {
				b.Fatal(failed)
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			if err := sh.WaitAcked(wctx, last, leader.AckMajority); err != nil {
				b.Fatal(err)
			}
		}
		if cs[0].warming() {
			run(0, true)
		}
		b.ReportAllocs()
		cpu0 := cpuNanos()
		b.ResetTimer()
		run(b.N, false)
		b.StopTimer()
		events := float64(b.N) * BatchEvents
		b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
		b.ReportMetric(float64(cpuNanos()-cpu0)/events, "cpu-ns/event")
		// Exactly once on the leader's own store: every distinct request
		// applied, no retry.
		distinct := 0
		for _, c := range cs {
			distinct += c.composed - c.retries
		}
		if got := sh.StoreStats().Receiver.Applied; got != uint64(distinct) {
			b.Fatalf("leader applied %d events, want %d distinct requests", got, distinct)
		}
	}
}

package follower_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// BenchmarkNodeApply measures a node's total apply throughput with 1, 2, 4
// and 8 shards: every shard applies its own stream of 1000-event batches of
// fresh events (puts with idempotency keys, 128 sessions per shard),
// committed with Sync per batch (sync=no: without waiting for fsync, to
// separate CPU from fsync cost), on disk, one goroutine per shard (as
// Node.Serve runs them). One op is one batch; events/s is the node total;
// cpu-ms/s is process CPU time (all threads, Pebble's included) per second
// of wall time, so 2000 means both cores were busy. The stores' files are
// opened through a syncProbe: wal-sync-µs is the mean WAL sync, and
// syncs-in-flight the mean number of syncs in flight while any is (1.0:
// the shards' syncs never overlapped); disk-B/event and disk-MB/s are the
// bytes the process dirtied for storage (/proc/self/io write_bytes: WAL,
// flushes, compactions) per event and per second.
//
//	go test ./follower -run '^$' -bench NodeApply -benchtime 400x -count 3
func BenchmarkNodeApply(b *testing.B) {
	for _, sync := range []bool{true, false} {
		for _, n := range []int{1, 2, 4, 8} {
			name := fmt.Sprintf("sync=yes/shards=%d", n)
			if !sync {
				name = fmt.Sprintf("sync=no/shards=%d", n)
			}
			b.Run(name, func(b *testing.B) { benchNodeApply(b, n, !sync) })
		}
	}
}

func benchNodeApply(b *testing.B, shards int, noSync bool) {
	const batchEvents, sessions = 1000, 128
	router, _ := leader.NewShardRouter(shards)
	ids := make([]uint32, shards)
	for s := range ids {
		ids[s] = uint32(s)
	}
	// Pre-encode every shard's batches so the timed part is apply only.
	perShard := (b.N + shards - 1) / shards
	logs := make([][][]byte, shards)
	value := make([]byte, 16)
	var opBuf []byte
	for s := range shards {
		var sess []session.ID
		for len(sess) < sessions {
			id := session.NewID()
			if router.Shard(id) == uint32(s) {
				sess = append(sess, id)
			}
		}
		seqs := make([]session.SeqNo, sessions)
		lsn := uint64(1)
		evs := make([]wal.Event, batchEvents)
		for range perShard {
			for i := range evs {
				j := i % sessions
				seqs[j]++
				ev := wal.Event{Op: wal.OpPut, Session: sess[j], Seq: seqs[j], Time: int64(lsn) + int64(i),
					Key: []byte{'k', byte(seqs[j] % 8)}, Value: value}
				if seqs[j] == 1 {
					ev = wal.Event{Op: wal.OpOpen, Session: sess[j], Seq: 1, Time: ev.Time}
				}
				ev.HasIdemKey, ev.IdemKey = true, idempotency.DeriveKey(ev.Session, ev.Seq, ev.AppendOpBytes(opBuf[:0]))
				evs[i] = ev
			}
			raw, err := wal.AppendBatch(nil, uint32(s), 1, lsn, evs)
			if err != nil {
				b.Fatal(err)
			}
			logs[s] = append(logs[s], raw)
			lsn += batchEvents
		}
	}
	probe := &syncProbe{FS: vfs.Default}
	node, err := follower.OpenNode(b.TempDir(), ids, &follower.NodeOptions{Follower: follower.Options{Store: store.Options{Logger: quietLogger, NoSync: noSync, FS: probe}}})
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close()

	var wg sync.WaitGroup
	b.ResetTimer()
	sync0 := probe.stats()
	io0 := diskWriteBytes()
	cpu0 := cpuTime()
	start := time.Now()
	left := b.N
	for s := range shards {
		count := min(perShard, left)
		left -= count
		wg.Go(func() {
			for _, raw := range logs[s][:count] {
				res, err := node.Apply(raw)
				if err != nil || res.Applied != batchEvents {
					b.Errorf("shard %d: applied %d, err %v", s, res.Applied, err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N*batchEvents)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(cpu.Milliseconds())/elapsed.Seconds(), "cpu-ms/s")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "batches/s")
	probe.stats().sub(sync0).report(b, elapsed)
	if io1 := diskWriteBytes(); io0 >= 0 && io1 >= 0 {
		b.ReportMetric(float64(io1-io0)/float64(b.N*batchEvents), "disk-B/event")
		b.ReportMetric(float64(io1-io0)/1e6/elapsed.Seconds(), "disk-MB/s")
	}
}

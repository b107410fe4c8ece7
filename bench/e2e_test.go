package bench

import (
	"fmt"
	"testing"
)

// BenchmarkPipeline is leader WAL → shipper → in-process transport →
// follower on the client-request workload (see Pipeline), beside the
// at-least-once reference (PipelineRaw):
//
//	go test ./bench -run '^$' -bench Pipeline -benchtime 2s -count 3
func BenchmarkPipeline(b *testing.B) {
	b.Run("e2e", Pipeline(0, false))
	b.Run("e2e-dup30", Pipeline(30, false))
	b.Run("e2e-dup100", Pipeline(100, false))
	b.Run("e2e-raw", PipelineRaw(0))
	b.Run("e2e-raw-dup30", PipelineRaw(30))
	b.Run("e2e-nosync", Pipeline(0, true))
	b.Run("leader-wal", LeaderWAL())
}

// BenchmarkShards is a node of 4 shards applying fresh events with and
// without fsync (see Shards):
//
//	go test ./bench -run '^$' -bench Shards -benchtime 2s -count 3
func BenchmarkShards(b *testing.B) {
	b.Run("shards4-sync", Shards(4, false))
	b.Run("shards4-nosync", Shards(4, true))
}

// BenchmarkReopen is the open time of a follower whose HWM log is full,
// against one without the log (see Reopen), and of one that was killed
// (ReopenKilled: Pebble's WAL replayed too):
//
//	go test ./bench -run '^$' -bench Reopen -benchtime 5x
func BenchmarkReopen(b *testing.B) {
	b.Run("hwm-log", Reopen(0))
	b.Run("no-log", Reopen(-1))
	b.Run("killed", ReopenKilled())
}

// BenchmarkReplicated is a stamping leader and two followers on the same
// workload, timed to the majority ack (see Replicated), beside
// BenchmarkPipeline's single-follower rows:
//
//	go test ./bench -run '^$' -bench 'Replicated|Pipeline/e2e(-dup30|-dup100)?$' -benchtime 100x
func BenchmarkReplicated(b *testing.B) {
	for _, clients := range []int{1, 2, 4} {
		for _, retries := range []int{0, 30, 100} {
			b.Run(fmt.Sprintf("followers=2/clients=%d/retries=%d", clients, retries), Replicated(2, clients, retries))
		}
	}
}

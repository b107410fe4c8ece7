package bench

import "testing"

// BenchmarkReceiver is the end-to-end suite (see EndToEnd):
//
//	go test ./bench -run '^$' -bench Receiver -count 3
func BenchmarkReceiver(b *testing.B) {
	for _, c := range EndToEnd {
		b.Run(c.Name, c.Run)
	}
}

// BenchmarkReceiverPipelined applies Receiver's workloads the way
// follower.Serve does (4 batches between Start and Wait):
//
//	go test ./bench -run '^$' -bench ReceiverPipelined -count 3
func BenchmarkReceiverPipelined(b *testing.B) {
	b.Run("fresh", ReceiverPipelined(Fresh, 4))
	b.Run("dup100", ReceiverPipelined(Dup, 4))
	b.Run("dup100-window", ReceiverPipelined(Retry, 4))
	b.Run("dup100-ceiling", DupCeiling())
}

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

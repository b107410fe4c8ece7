package bench

import (
	"fmt"
	"testing"
)

func BenchmarkClient(b *testing.B) {
	for _, f := range []int{0, 1, 2} {
		b.Run(fmt.Sprintf("inprocess/followers=%d", f), ClientInProcess(f))
		b.Run(fmt.Sprintf("network/followers=%d", f), ClientNetwork(f))
	}
}

func BenchmarkClientReads(b *testing.B) {
	b.Run("leader", ClientReads(false))
	b.Run("follower", ClientReads(true))
}

// TestClientWorkloadShape: the client benchmarks' requests are what their
// rows say — 16-byte request IDs, 64-byte payloads, 30 % of them retries
// of an earlier request with its payload unchanged.
func TestClientWorkloadShape(t *testing.T) {
	w := newClientWorkload()
	seen := map[string][]byte{}
	retries := 0
	for range 1000 {
		id, payload := w.request()
		if len(id) != 16 || len(payload) != 64 {
			t.Fatalf("request ID of %d bytes, payload of %d: want 16 and 64", len(id), len(payload))
		}
		if p, ok := seen[id]; ok {
			retries++
			if string(p) != string(payload) {
				t.Fatalf("retry of %s with another payload: the node would answer a conflict", id)
			}
		}
		seen[id] = payload
	}
	if retries != 300 {
		t.Fatalf("%d retries in 1000 requests, want 300", retries)
	}
}

package bench

import (
	"fmt"
	"testing"
)

// BenchmarkDeriveKey measures DeriveKey by op size; "ref-sum256" is
// blake3.Sum256 over the same contiguous message (id ‖ seq ‖ op) in a
// reused buffer, the straightforward alternative.
func BenchmarkDeriveKey(b *testing.B) {
	for _, n := range []int{0, 64, 256, 1024, 4096} {
		b.Run(fmt.Sprintf("oncewal/%dB", n), DeriveKey(n))
		b.Run(fmt.Sprintf("ref-sum256/%dB", n), DeriveKeySum256(n))
	}
}

package bench

import (
	"encoding/binary"
	"fmt"
	"testing"

	"lukechampine.com/blake3"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
)

var sinkKey idempotency.Key

// BenchmarkDeriveKey measures DeriveKey by op size; "ref-sum256" is
// blake3.Sum256 over the same contiguous message (id ‖ seq ‖ op) in a
// reused buffer, the straightforward alternative.
func BenchmarkDeriveKey(b *testing.B) {
	id := session.ID{1, 2, 3}
	for _, n := range []int{0, 64, 256, 1024, 4096} {
		op := make([]byte, n)
		for i := range op {
			op[i] = byte(i)
		}
		b.Run(fmt.Sprintf("oncewal/%dB", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(24 + n))
			for i := 0; b.Loop(); i++ {
				sinkKey = idempotency.DeriveKey(id, session.SeqNo(i), op)
			}
		})
		b.Run(fmt.Sprintf("ref-sum256/%dB", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(24 + n))
			msg := make([]byte, 24+n)
			copy(msg, id[:])
			copy(msg[24:], op)
			for i := 0; b.Loop(); i++ {
				binary.LittleEndian.PutUint64(msg[16:], uint64(i))
				sum := blake3.Sum256(msg)
				copy(sinkKey[:], sum[:16])
			}
		})
	}
}

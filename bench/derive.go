package bench

import (
	"encoding/binary"
	"testing"

	"lukechampine.com/blake3"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
)

var sinkKey idempotency.Key

// deriveSetup returns the session and an n-byte op for the DeriveKey
// benchmarks and sets up their reporting.
func deriveSetup(b *testing.B, n int) (session.ID, []byte) {
	Release() // a kept end-to-end store would compact in the background
	op := make([]byte, n)
	for i := range op {
		op[i] = byte(i)
	}
	b.ReportAllocs()
	b.SetBytes(int64(24 + n))
	return session.ID{1, 2, 3}, op
}

// DeriveKey measures idempotency.DeriveKey of an n-byte op.
func DeriveKey(n int) func(b *testing.B) {
	return func(b *testing.B) {
		id, op := deriveSetup(b, n)
		for i := 0; b.Loop(); i++ {
			sinkKey = idempotency.DeriveKey(id, session.SeqNo(i), op)
		}
	}
}

// DeriveKeySum256 is the reference for DeriveKey: blake3.Sum256 over the same
// contiguous message (id ‖ seq ‖ op) in a reused buffer, the straightforward
// alternative.
func DeriveKeySum256(n int) func(b *testing.B) {
	return func(b *testing.B) {
		Release() // a kept end-to-end store would compact in the background
		id, op := deriveSetup(b, n)
		msg := make([]byte, 24+n)
		copy(msg, id[:])
		copy(msg[24:], op)
		for i := 0; b.Loop(); i++ {
			binary.LittleEndian.PutUint64(msg[16:], uint64(i))
			sum := blake3.Sum256(msg)
			copy(sinkKey[:], sum[:16])
		}
	}
}

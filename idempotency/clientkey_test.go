package idempotency

import (
	"testing"

	"lukechampine.com/blake3"

	"github.com/oncewal/oncewal/session"
	"github.com/stretchr/testify/require"
)

func TestClientKey(t *testing.T) {
	a, b := ClientKey([]byte("req-1")), ClientKey([]byte("req-2"))
	require.Equal(t, a, ClientKey([]byte("req-1")), "deterministic")
	require.NotEqual(t, a, b)
	// Golden: pins the derivation, since keys outlive processes (a retry
	// after an upgrade must produce the same key).
	require.Equal(t, "7ac5b747f8f8d930b1e315081932095c", ClientKey([]byte("req-1")).String())
	// A request ID never yields the derived key of the same bytes.
	var id session.ID
	copy(id[:], "0123456789abcdef")
	require.NotEqual(t, DeriveKey(id, 1, nil), ClientKey(append(id[:], 1, 0, 0, 0, 0, 0, 0, 0)))
}

// TestClientKeyMatchesBlake3 checks ClientKey's compression-function path
// against blake3.DeriveKey at every length around the block and chunk
// boundaries (IDs longer than a chunk take blake3.DeriveKey itself), and
// that it does not allocate.
func TestClientKeyMatchesBlake3(t *testing.T) {
	id := make([]byte, 2200)
	for i := range id {
		id[i] = byte(i*7 + 3)
	}
	for _, n := range []int{0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 500, 1023, 1024, 1025, 2048, 2200} {
		var want Key
		blake3.DeriveKey(want[:], clientKeyContext, id[:n])
		require.Equal(t, want, ClientKey(id[:n]), "length %d", n)
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = ClientKey(id[:16]) }); allocs != 0 {
		t.Errorf("ClientKey of a 16-byte ID allocates %v times", allocs)
	}
}

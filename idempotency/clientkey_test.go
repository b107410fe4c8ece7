package idempotency

import (
	"testing"

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

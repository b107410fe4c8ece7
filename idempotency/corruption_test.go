package idempotency_test

import (
	"errors"
	"testing"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/stretchr/testify/require"
)

// TestDecodeErrorsAreCorruption: a record body that does not decode is
// ErrBadRecord and in the corruption class; a record refused before it is
// encoded is ErrBadRecord only — the caller's mistake, not bad data.
func TestDecodeErrorsAreCorruption(t *testing.T) {
	_, err := idempotency.DecodeRecord(idempotency.RecordClaim, 1, []byte{0xff, 1, 2})
	require.ErrorIs(t, err, idempotency.ErrBadRecord)
	require.ErrorIs(t, err, corruption.Err)
	err = idempotency.CheckRecord(idempotency.RecordClaim, nil)
	require.ErrorIs(t, err, idempotency.ErrBadRecord)
	require.ErrorIs(t, err, corruption.Err)

	r := idempotency.Record{Kind: idempotency.RecordRelease, Scope: "s", Key: "k", Expires: 5}
	err = r.Validate()
	require.ErrorIs(t, err, idempotency.ErrBadRecord)
	require.False(t, errors.Is(err, corruption.Err), "a refused record is not corruption: %v", err)
}

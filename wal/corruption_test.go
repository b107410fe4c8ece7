package wal_test

import (
	"errors"
	"testing"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestDecodeErrorsAreCorruption: every way a batch fails to decode matches
// corruption.Err besides its own sentinel; refusing to encode does not.
func TestDecodeErrorsAreCorruption(t *testing.T) {
	ev := wal.Event{Op: wal.OpPut, Session: session.NewID(), Seq: 1, Time: 1, Key: []byte("k"), Value: []byte("v")}
	good, err := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{ev})
	require.NoError(t, err)
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }

	for name, tc := range map[string]struct {
		buf  []byte
		want error
	}{
		"body checksum": {mutate(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), wal.ErrChecksum},
		"header crc":    {mutate(func(b []byte) []byte { b[wal.HeaderSize-1] ^= 1; return b }), wal.ErrChecksum},
		"bad magic":     {mutate(func(b []byte) []byte { b[0] ^= 0xff; return b }), wal.ErrCorrupt},
		"truncated":     {good[:len(good)-1], wal.ErrTruncated},
		"short header":  {good[:wal.HeaderSize-1], wal.ErrTruncated},
		"trailing":      {append(append([]byte(nil), good...), 0), wal.ErrCorrupt},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := wal.DecodeBatch(tc.buf, nil)
			require.ErrorIs(t, err, tc.want)
			require.ErrorIs(t, err, corruption.Err)
		})
	}

	big := ev
	big.Value = make([]byte, wal.MaxPayloadSize+1)
	_, err = wal.AppendBatch(nil, 0, 1, 1, []wal.Event{big})
	require.ErrorIs(t, err, wal.ErrTooLarge)
	require.False(t, errors.Is(err, corruption.Err), "a refused encode is not corruption: %v", err)
}

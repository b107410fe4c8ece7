package kv

import (
	"errors"
	"fmt"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/wal"
)

// Limits of the key space. A request over one is refused before anything
// is logged (ErrInvalidTxn, ErrInvalidPrincipal, ErrResultTooLarge).
const (
	// MaxPrincipal bounds a principal's name in bytes: its length is one
	// byte of every scoped key.
	MaxPrincipal = 255
	// MaxKey bounds a key in bytes (without the principal).
	MaxKey = 4096
	// MaxValue bounds a value in bytes.
	MaxValue = 1 << 20
	// MaxTxnOps bounds each of a transaction's lists: at most MaxTxnOps
	// compares, MaxTxnOps Then ops and MaxTxnOps Else ops.
	MaxTxnOps = 128
	// MaxTxnBytes bounds the key and value bytes of a transaction's
	// compares and ops together. MaxTxnOps puts of MaxValue each would be
	// 128 MiB, twice a WAL batch (wal.MaxBodySize); at 8 MiB a
	// transaction's events, with the request's ledger records beside them,
	// stay far inside one batch.
	MaxTxnBytes = 8 << 20
	// MaxResultBytes bounds the value bytes a transaction's result returns
	// (its Gets' values and its Adds' counters): the result is the
	// request's outcome, which the ledger records beside its effects
	// (idempotency.MaxOutcomeSize, 1 MiB), so it leaves a quarter of that
	// for its framing. Read more with separate Gets or a range.
	MaxResultBytes = 768 << 10
	// MaxRangeLimit bounds the rows one range read returns.
	MaxRangeLimit = 10_000
	// MaxRangeBytes bounds the key and value bytes one range read returns
	// (at least one row, however large): MaxRangeLimit rows of MaxValue
	// would be 10 GiB in memory.
	MaxRangeBytes = 4 << 20
)

// An event of the key space must fit a WAL event: the scoped key and the
// value within wal.MaxPayloadSize. A compile-time check.
const _ = uint(wal.MaxPayloadSize - (1 + MaxPrincipal + MaxKey + MaxValue))

// The whole transaction, every op a write with its scoped key, must fit a
// WAL batch body with room to spare.
const _ = uint(wal.MaxBodySize/2 - (MaxTxnBytes + 2*MaxTxnOps*(1+MaxPrincipal+64)))

var (
	// ErrInvalidTxn: a transaction breaks a rule of its shape (empty or
	// oversized keys and values, too many ops, unknown kinds, no ops at
	// all). The message lists every problem; fix the request, a retry
	// fails the same way.
	ErrInvalidTxn = errors.New("kv: invalid transaction")
	// ErrInvalidPrincipal: a principal's name is empty or longer than
	// MaxPrincipal bytes. It comes from the caller's certificate: issue
	// one whose name fits.
	ErrInvalidPrincipal = errors.New("kv: invalid principal")
	// ErrInvalidRead: a read's key is empty or longer than MaxKey, a
	// range's prefix longer than MaxKey or its limit above MaxRangeLimit.
	ErrInvalidRead = errors.New("kv: invalid read")
	// ErrCrossShard: a transaction's keys lie in different shards, so no
	// single shard can apply it atomically.
	ErrCrossShard = errors.New("kv: keys of one transaction in different shards")
	// ErrNotCounter: an Add met a value that is not a counter (8 bytes,
	// little-endian int64). Nothing was logged; Put a counter first or Add
	// to another key.
	ErrNotCounter = errors.New("kv: value is not a counter")
	// ErrOverflow: an Add would overflow its int64 counter, or a key's
	// version its 2^63-1. Nothing was logged.
	ErrOverflow = errors.New("kv: overflow")
	// ErrResultTooLarge: the values a transaction returns exceed
	// MaxResultBytes. Nothing was logged; read the values with separate
	// requests.
	ErrResultTooLarge = errors.New("kv: transaction result too large")
	// ErrCorrupt: a stored row or scoped key does not decode. It matches
	// corruption.Err: the store needs repair or a rebuild, a retry does
	// not help.
	ErrCorrupt = corruption.Mark(errors.New("kv: corrupt row"))
)

// CheckRead returns nil for a read of key (range: prefix) by principal
// within the limits, else an error wrapping ErrInvalidPrincipal or
// ErrInvalidRead. A range's prefix may be empty (all of principal's keys);
// a Get's key may not (range is false for a Get). limit is a range's
// (0: MaxRangeLimit); a Get passes 0.
func CheckRead(principal string, key []byte, isRange bool, limit int) error {
	if err := CheckPrincipal(principal); err != nil {
		return err
	}
	switch {
	case len(key) > MaxKey:
		return fmt.Errorf("%w: key of %d bytes > %d", ErrInvalidRead, len(key), MaxKey)
	case !isRange && len(key) == 0:
		return fmt.Errorf("%w: empty key", ErrInvalidRead)
	case limit < 0 || limit > MaxRangeLimit:
		return fmt.Errorf("%w: limit %d, want 0 (the maximum) to %d", ErrInvalidRead, limit, MaxRangeLimit)
	}
	return nil
}

// CheckPrincipal returns nil for a principal that can own keys (1 to
// MaxPrincipal bytes), else an error wrapping ErrInvalidPrincipal.
func CheckPrincipal(principal string) error {
	if len(principal) == 0 || len(principal) > MaxPrincipal {
		return fmt.Errorf("%w: %d bytes, want 1 to %d: the principal is the caller's certificate name",
			ErrInvalidPrincipal, len(principal), MaxPrincipal)
	}
	return nil
}

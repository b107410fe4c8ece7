package idempotency

import (
	"encoding/binary"

	"github.com/oncewal/oncewal/internal/ledgerrecord"
)

// The request-ledger record and its codec live in the leaf package
// ledgerrecord (so package wal can carry records without linking Pebble);
// these are their names in this package.

// Limits of a ledger entry's identity and outcome (see ledgerrecord).
const (
	MaxRequestKeyLen = ledgerrecord.MaxRequestKeyLen
	MaxScopeLen      = ledgerrecord.MaxScopeLen
	MaxOutcomeSize   = ledgerrecord.MaxOutcomeSize
	MaxActionLen     = ledgerrecord.MaxActionLen
)

// Ledger record errors (see ledgerrecord).
var (
	ErrInvalidKey      = ledgerrecord.ErrInvalidKey
	ErrOutcomeTooLarge = ledgerrecord.ErrOutcomeTooLarge
	ErrBadRecord       = ledgerrecord.ErrBadRecord
)

type (
	// Record is ledgerrecord.Record.
	Record = ledgerrecord.Record
	// RecordKind is ledgerrecord.Kind.
	RecordKind = ledgerrecord.Kind
	// Token is ledgerrecord.Token.
	Token = ledgerrecord.Token
	// Fingerprint is ledgerrecord.Fingerprint.
	Fingerprint = ledgerrecord.Fingerprint
)

// Record kinds (see ledgerrecord).
const (
	RecordClaim    = ledgerrecord.Claim
	RecordComplete = ledgerrecord.Complete
	RecordRelease  = ledgerrecord.Release
	RecordFail     = ledgerrecord.Fail
	RecordExtend   = ledgerrecord.Extend
)

// NewToken returns a random token (ledgerrecord.NewToken).
func NewToken() Token { return ledgerrecord.NewToken() }

// ValidateRequest checks a (scope, request key) pair
// (ledgerrecord.ValidateRequest). Errors wrap ErrInvalidKey.
func ValidateRequest(scope, key string) error { return ledgerrecord.ValidateRequest(scope, key) }

// DecodeRecord is ledgerrecord.Decode.
func DecodeRecord(kind RecordKind, time int64, body []byte) (Record, error) {
	return ledgerrecord.Decode(kind, time, body)
}

// FingerprintOf returns BLAKE3-256(payload). It allocates nothing and never
// starts goroutines (unlike blake3.Sum256 on inputs over 1 KiB).
func FingerprintOf(payload []byte) Fingerprint {
	w := sum(nil, payload)
	var f Fingerprint
	for i, x := range w {
		binary.LittleEndian.PutUint32(f[4*i:], x)
	}
	return f
}

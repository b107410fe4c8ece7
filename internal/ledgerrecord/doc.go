// Package ledgerrecord is the request ledger's record codec: what one ledger
// decision (claim, complete, release, fail, extend) is as it travels through
// the WAL, and its one canonical body encoding.
//
// It is a leaf (standard library only), so package wal can carry and check
// ledger records without linking Pebble. Package idempotency, which decides
// and applies the records, re-exports these names as aliases
// (idempotency.Record, idempotency.RecordKind, idempotency.RecordClaim, …).
//
// Invariant: a body has exactly one encoding. Decode(kind, t,
// r.AppendBody(nil)) == r for every r that Validate accepts, and Decode and
// Check refuse everything else with ErrBadRecord.
package ledgerrecord

package idempotency

import "github.com/oncewal/oncewal/internal/eventid"

// Key is a 128-bit idempotency key (eventid.Key, the leaf type package wal
// uses too): the first 16 bytes of a BLAKE3-256 digest (see DeriveKey).
type Key = eventid.Key

// ErrBadKey reports a string that is not a 32-character hex Key.
var ErrBadKey = eventid.ErrBadKey

// ParseKey parses 32 hex characters (either case) into a Key
// (eventid.ParseKey). Any other input returns an error wrapping ErrBadKey.
func ParseKey(s string) (Key, error) { return eventid.ParseKey(s) }

// Package eventid holds what identifies an event for exactly-once apply: the
// session it belongs to (SessionID), its place in that session (SeqNo) and its
// 128-bit idempotency Key.
//
// It is a leaf: it imports only the standard library, so package wal (and
// anything that only reads or writes the log) can name these types without
// linking Pebble or the window. Packages session and idempotency re-export
// them under their historical names (session.ID, session.SeqNo,
// idempotency.Key) as type aliases; the types are the same.
package eventid

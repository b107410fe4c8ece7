// Package keyspace is the layout of an oncewal store's Pebble key space: every
// prefix and fixed key any oncewal package writes, named once (keys.go).
//
// The packages that read and write these keys (session, idempotency,
// replication, follower, leader) take their prefixes from here; what each
// value holds is documented beside its codec in the owning package.
//
// Invariants:
//
//  1. No key belongs to two entries of the layout (TestNoOverlap): every row
//     family and fixed key lies in exactly one top-level space, and within a
//     space a fixed key can share a family's prefix only where the family's
//     keys have a fixed length the fixed key does not have (h/clock beside
//     the 18-byte h/<session ID> rows).
//  2. oncewal itself writes only inside Reserved, whatever the Applier. A
//     custom Applier may write any key outside Reserved (and outside State
//     too, if it does not delegate to the default session state machine);
//     a key inside Reserved written by an Applier corrupts the store's
//     metadata, HWMs, window journal or request ledger.
package keyspace

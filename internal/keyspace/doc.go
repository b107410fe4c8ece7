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
//  2. Outside the Applier, oncewal writes only inside Reserved; the default
//     Applier adds State and KV. A custom Applier may write any key outside
//     Reserved (State and KV included, unless it delegates to the default
//     state machine); a batch in which it writes inside Reserved is refused
//     (replication.ErrReservedKey) rather than let it overwrite the store's
//     metadata, HWMs, window journal or request ledger.
package keyspace

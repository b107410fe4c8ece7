// Package kv is oncewal's default key space: keys that belong to a
// principal (the caller's certificate name), not to a session, so every
// client of the principal — in any process, after any restart or
// failover — sees the same keys; and the leader's resolution of a
// conditional transaction into the plain events every replica applies.
// It is pure: no Pebble, no I/O; the store applies and reads the rows
// (package store), the leader resolves (Resolve) against its store with
// the overlay of what it logged but has not applied yet (Pending).
//
// # How a key is stored
//
// A key is logged and stored under its scoped key, Scoped(principal, key) =
// len(principal) u8 ‖ principal ‖ key, so principals never share keys and
// each principal's keys are one contiguous, ordered range
// (ScopedPrefix). Its row lives at keyspace.KV ("k/") + scoped key; the
// row's value is AppendRow's: format byte 1 ‖ version u64 LE ‖ modLSN u64
// LE ‖ value. The version is 1 when the key is created and grows by one
// with every put; a delete removes the row, so a key put again starts at
// 1 (etcd's version). ModLSN is the LSN of the event that wrote the row
// last (etcd's mod_revision): with the applied LSN a read reports, a
// client can tell how fresh what it read is.
//
// # Transactions
//
// A Txn is etcd's: If compares (AND; an empty If holds), Then ops, Else
// ops. The compares read the state as it stands after every batch logged
// before the transaction; the ops of the branch chosen run in order, each
// seeing the effects of the ones before it. A missing key has version 0,
// modLSN 0 and exists 0; a value compare on a missing key is false whatever
// its result (etcd: no operand stands for "no value"; an empty value is a
// value), so test absence with TargetExists or TargetVersion. Put writes
// the value at version prior+1; Delete removes the key (an absent key:
// nothing, Found false); Add treats the value as a counter, 8 bytes of
// little-endian int64, absent = 0 (another length is ErrNotCounter, an
// overflow ErrOverflow); Get reads. Every key of a transaction must lie in
// one shard (Txn.Shard, kvroute: give related keys a common hash tag such
// as {acct:alice}), since one shard's log applies it atomically.
//
// # Why it is exactly once
//
// Resolve turns a transaction into absolute events — wal.OpKVPut of a whole
// value at a stamped version, wal.OpKVDelete — that need no evaluation, so
// a replica that applies the same log prefix holds byte-identical rows,
// whatever it held before and however often a batch is delivered. The
// events are data events of the request's session: the leader stamps them
// with the session's SeqNo and idempotency key like put, add and delete,
// and a follower's two dedup layers (the SeqNo HWM, the idempotency-key
// window) discard a redelivered or duplicated event before it is applied,
// unchanged. A retried request never resolves twice: its ledger entry
// (claim, complete with the Result as outcome) is logged in the same batch
// as its events, so a retry from any process meets the recorded outcome.
//
// # Invariants
//
//   - A scoped key is never empty, its principal 1..MaxPrincipal bytes and
//     its key 1..MaxKey (CheckPrincipal, Txn.Validate); SplitScoped
//     refuses anything else as ErrCorrupt.
//   - A stored row has version ≥ 1 and modLSN ≥ 1 (DecodeRow refuses
//     anything else as ErrCorrupt, marked corruption.Err).
//   - Resolve is deterministic and all or nothing: an error returns no
//     event, and the request is refused with nothing logged.
//   - Event i of a resolution has LSN firstLSN+i; the caller logs them
//     consecutively at those LSNs, so a result's ModLSN is the row's.
//   - Layer(p, store) never shows a write older than the store's: Pending
//     keeps a key's newest logged write until the store has applied it.
package kv

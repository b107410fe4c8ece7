// Package replication moves WAL batches from a leader to a follower and
// applies them there exactly once.
//
//	leader:   wal.Writer ──► Shipper ──► Transport ──►  Receiver  :follower
//	                           ▲                            │
//	                           └──────── Ack(position) ◄────┘
//
// The Transport (Listener/LeaderConn on the leader, Dialer/FollowerConn on the
// follower) carries raw wal batch bytes one way and acks the other, with no
// ordering or delivery guarantee; InProcess is the channel-based
// implementation with seeded fault injection. The Shipper is at-least-once:
// it resends anything unacknowledged and rewinds to whatever position the
// follower states. Duplicates are therefore normal, and the Receiver is where
// they die.
//
// # The Receiver's rules
//
// For each batch, before anything is written: verify it (checksums, version,
// limits); refuse a foreign shard (ErrWrongShard) and an epoch lower than the
// highest committed (ErrStaleEpoch, fencing a deposed leader); discard a batch
// wholly at or below the applied LSN; refuse one that starts past applied+1
// (ErrOutOfOrder). Then per event: the session's SeqNo HWM (session.Tracker)
// discards duplicates, skips closed and too-old sessions, and refuses the
// whole batch on a SeqNo gap (ErrSeqGap); the idempotency-key window
// (idempotency.Store, plus the keys seen earlier in the same batch) discards
// recently seen keys — when such an event's SeqNo was fresh the HWM still
// advances, so the next SeqNo is not a gap. Survivors go to the Applier.
//
// # Shards
//
// A deployment has a fixed number of shards. ShardRouter maps a session to
// its shard with a pure function every node computes alike —
// JumpHash(first 8 bytes of BLAKE3-256(session ID) as u64 LE, shards) — so
// all of a session's events land in one shard and its SeqNos stay contiguous
// in one WAL and one follower HWM (router.go explains the choice; a golden
// test pins it). Leader opens one wal.Writer and one Shipper per shard in
// one directory (segment names carry the shard) and runs the Shippers
// concurrently and independently. On the follower side each shard has its
// own Receiver (see follower.Node); a batch for a shard a receiver or node
// does not serve is refused with ErrWrongShard.
//
// # Invariants
//
//  1. One Pebble batch per shipped batch holds the applied state, the HWM
//     advances, the window journal, the applied LSN and the epoch. It commits
//     (with Sync, unless NoSync) or nothing happens.
//  2. The window, the in-memory HWMs, the position and the epoch change only
//     after that commit. A refused batch, an Applier error or a failed commit
//     leave the follower exactly as it was; the batch may be delivered again.
//  3. Every event of a decodable batch is counted in exactly one Stats
//     counter (see Stats.Accounted).
//  4. Acks carry the durable applied position: the leader never needs to
//     resend anything at or below it, and resending anything is harmless.
package replication

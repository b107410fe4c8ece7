// Package replication moves WAL batches from a leader to its followers and
// applies them there exactly once.
//
//	leader:  wal.Writer ─(Appended)─► cache ─► Fanout: one stream per follower ─► Transport ─► Receiver :follower A
//	                                                   │  (or a Shipper: one)    ─► Transport ─► Receiver :follower B
//	                                                   └──────────── Ack(position) ◄─────────────┘
//
// The Transport (Listener/LeaderConn on the leader, Dialer/FollowerConn on the
// follower) carries raw wal batch bytes one way and acks the other, with no
// ordering or delivery guarantee; InProcess is the channel-based
// implementation with seeded fault injection. Shipping is at-least-once:
// a stream resends anything unacknowledged and rewinds to whatever position
// the follower states. Duplicates are therefore normal, and the Receiver is
// where they die.
//
// # The leader side: Fanout and Shipper
//
// A Fanout ships one shard's WAL to every registered follower of the shard
// over one Listener; a Shipper is the simple case of one anonymous follower
// (it is a Fanout with a single stream, so both run the same code:
// shipper.go describes the stream, fanout.go the routing). Each follower
// names itself in its hello (Ack.FollowerID, follower.Options.ID) and has its
// own stream — connection, position, window, timers, counters — so a
// reconnect replaces only that follower's stream and a slow or refused
// follower holds up no other. Followers are registered by
// FanoutOptions.Followers and Register/Unregister; unknown and anonymous IDs
// are refused (ErrUnknownFollower) unless AutoRegister is set.
//
// Before anything is shipped on a connection its hello is checked: shard
// (ErrBadHello), registration, fencing (ErrFenced ends Run), the epoch's
// first LSN, and VerifyHello — CheckHello (checkhello.go) compares the
// follower's last applied batch (Ack.LastBatch: epoch and header CRC, which
// the Receiver persists with its position) with the leader's log, as Raft
// checks prevLogIndex/prevLogTerm, and refuses a diverged follower
// (ErrDiverged) or one the log no longer serves (ErrBehindRetention).
//
// The leader hands each synced batch to Appended; the Fanout keeps recent
// batches in a bounded cache (cache.go) that every stream reads first, so
// followers near the tail share one copy and the WAL is read only by
// followers that fell behind it. WaitAcked(lsn, AckOne|AckMajority|AckAll)
// waits for one, a majority or all of the registered followers (the leader
// not counted); Stats gives per follower its acknowledged LSN, lag in events
// and bytes, connection state and refusals by reason, and OnAcked reports
// every acknowledged position as it moves (for retention slots).
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
//  2. Memory follows the store, never leads it. Receiver.Apply is decide →
//     stage → publish (decide states the order of decisions; publish is the
//     only step that changes memory), and the receiver pipelines it
//     (Receiver.Start, Pending.Wait): a batch is handed to Pebble with Sync
//     without waiting for its WAL sync (DB.ApplyNoSyncWait), so the next
//     batch is decided and staged while that sync is in flight. Two
//     positions follow the store, each its own layer of it: the window, the
//     in-memory HWMs and the position decide starts from change once the
//     batch is in Pebble's memtable (visible to every reader of the store);
//     the position Position and Hello report, and every ack, change only
//     once the batch and every batch before it are synced (Wait, in Start
//     order). A refused batch or an Applier error leaves the follower
//     exactly as it was. A failed commit or WAL sync fails the store: that
//     batch and every later one — also those already in the memtable — are
//     refused (ErrStoreFailed), nothing more is acknowledged, and the
//     embedder reopens, which rebuilds memory from the synced prefix. A
//     crash loses at most batches that were never acknowledged.
//  3. Every event of a decodable batch is counted in exactly one Stats
//     counter (see Stats.Accounted).
//  4. Acks carry the durable applied position (synced, unless NoSync): the
//     leader never needs to resend anything at or below it, and resending
//     anything is harmless. An ack never precedes its batch's WAL sync.
//  5. The position and the identity of the batch ending there (m/last_batch)
//     commit together, so a hello never names a batch the follower did not
//     apply last.
//  6. A connection serves only the follower its hello names: it replaces
//     that follower's previous connection and no other follower's.
//  7. Nothing is shipped on a connection before its hello passed every check;
//     a refused connection is closed, counted by reason and logged. Nothing
//     beyond DurableLSN (when set) is shipped.
//  8. A stream reads a batch from the cache when the cache holds it, and the
//     cache holds only batches handed to Appended, contiguous in LSN, never
//     modified, within CacheBytes.
//  9. WaitAcked(lsn, policy) returns nil only once policy's share of the
//     followers registered at that moment have acknowledged lsn.
package replication

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
// # The Transport contract
//
// One leader and one follower of a shard talk over a Transport. The follower
// connects to the leader (as PostgreSQL standbys and Kafka followers do): it
// dials with a hello Ack that states its shard, the highest leader epoch it has
// committed and its durable applied LSN. The leader accepts the connection,
// reads where the follower stands from the hello, and streams WAL batches — the
// raw bytes wal.AppendBatch produced, unchanged — from AppliedLSN+1. The
// follower answers each batch it processed with an Ack carrying its applied
// position after that batch; Refused asks for a resend from AppliedLSN+1.
//
// The contract is deliberately small so that a network transport (gRPC over
// mutual TLS, one bidirectional stream per connection) can implement it 1:1:
//
//   - Delivery: at most once per Send, in any order. A Transport may drop,
//     duplicate, reorder or delay batches and acks; nothing above it assumes
//     otherwise. Reliability comes from the Shipper (retransmit, rewind) and
//     exactly-once from the follower's Receiver (position, HWM, window).
//   - Acks are cumulative: AppliedLSN is the follower's durable position, so a
//     lost ack is repaired by any later one.
//   - Buffers: Send must not retain the slice after it returns (it copies or
//     writes it out); the caller may reuse it at once. Recv returns a slice
//     the caller owns; the transport never touches it again.
//   - Concurrency: per connection, one goroutine may Send while another
//     Recv's (the shape of a gRPC stream); concurrent Sends or concurrent
//     Recvs on one connection are not allowed. Close may be called from any
//     goroutine, any number of times, and unblocks both.
//   - Errors: ErrDisconnected when the link is gone (peer closed, network
//     fault); the connection is dead and the follower dials again with a fresh
//     hello, the leader Accepts again. ErrClosed after this side closed the
//     connection or the whole transport. Errors are wrapped; test them with
//     errors.Is.
//   - Cancellation: a cancelled ctx makes a blocked call return ctx.Err()
//     promptly. After a Send returned ctx.Err() the batch may or may not have
//     gone out, and a stream transport may have had to end the stream to
//     unblock it, so callers treat that connection as dead (the Shipper
//     closes it). The in-process transport keeps the connection usable.
//   - Backpressure: Send may block while the link's buffer is full; ctx bounds
//     the wait. The Shipper bounds unacknowledged batches itself
//     (ShipperOptions.MaxInFlight), so a transport's buffer only smooths bursts.
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
// # Shipping: the per-follower stream
//
// A Shipper (one follower) and a Fanout (every registered follower of a
// shard) run the same per-follower stream loop, shipLoop. It is
// at-least-once by design; exactly-once is the Receiver's job.
//
//   - Position: the follower's hello says where it stands (AppliedLSN); the
//     stream reads the WAL from AppliedLSN+1 and ships from there, keeping
//     at most MaxInFlight batches unacknowledged.
//   - Acks are cumulative. An ack above the known position acknowledges every
//     batch up to it. An ack below it on the same connection is stale
//     (reordered or delayed in transit) and ignored: a live follower's
//     position never moves back. A follower that restarted with less than it
//     had acknowledged (NoSync, lost disk) says so in the hello of its new
//     connection, and the stream starts over from there.
//   - Go-back-N: the stream never keeps copies of sent batches; it rewinds
//     its read position to AppliedLSN+1 and resends from there when the
//     follower refuses a batch, when nothing was acknowledged for a
//     retransmit timeout, or when a new connection starts behind the send
//     position. A refusal at the position it already rewound to is not
//     acted on again (the other batches of the old window are refused the
//     same way); the retransmit timer covers a lost resend. The timeout
//     doubles after every expiry without progress, up to MaxBackoff, and
//     resets on progress.
//   - Live tail: io.EOF from the reader means "caught up"; the stream waits
//     for PollInterval or a Notify signal and reads on.
//   - Connections: one per follower at a time. A newly accepted connection
//     of a follower replaces that follower's current one unless the current
//     one is known to be alive (invariant 11; see "One process per
//     follower ID"): a restarted follower may reconnect before the old link
//     is known to be dead. The Shipper's one follower is whoever dials; a
//     Fanout routes each connection by its hello's FollowerID to that
//     follower's stream, so followers never replace each other's
//     connections.
//   - Heartbeats: on a connection whose transport carries them
//     (HeartbeatConn with a non-zero interval), the stream sends a
//     Heartbeat — the end of the log it knows and the leader's WAL clock —
//     every interval whether or not batches flow. The follower bounds the
//     leader's silence with them (follower.Options.LeaderTimeout,
//     ErrLeaderSilent) and answers each, which tells the leader the
//     connection is alive (PeerConn.LastHeard).
//   - Hello checks, before anything is shipped: the shard (ErrBadHello),
//     the follower (Fanout: ErrUnknownFollower), fencing, EpochStartLSN
//     (ErrDiverged) and VerifyHello. A refused connection is closed, counted
//     by reason (HelloRefusals) and logged; a refusal of a follower's
//     reconnect also ends its previous connection, which the accept already
//     preempted.
//   - Fencing: a hello or ack whose Epoch is above the leader's own epoch
//     (ShipperOptions.Epoch) means a newer leader exists; Run returns
//     ErrFenced.
//
// # Fanout registration
//
// Registration: FanoutOptions.Followers at start, Register/Unregister at run
// time. A hello with an unknown ID (or none) is refused with
// ErrUnknownFollower unless AutoRegister is set. Refusing is the default
// because a registered follower counts towards WaitAcked's Majority and All
// (and, for the leader, pins WAL retention): a mistyped ID or a stray
// process must not change what "all followers" means, or fill the disk.
// An anonymous follower (empty ID) is refused even then: two of them could
// not be told apart, which is the stream stealing this type exists to end.
// A refused connection ends with RefusingConn.Refuse where the transport
// has it (grpctransport does), so the follower learns the reason; else
// with Close.
//
// # One process per follower ID
//
// Two processes started with the same follower ID used to take the stream
// from each other in turn, silently, each reconnect replacing the other's
// connection (84 connections and 990 resent batches in 8 s). A second
// connection of an ID is now refused with ErrDuplicateFollower — its
// refusal names the address already connected and says to give each
// follower its own ID — while the connection in service is alive: its
// follower answered within 3 heartbeat intervals (3 s with grpctransport's
// default). Otherwise the new connection replaces it, as before: a
// follower killed and restarted gets its stream back at once when the
// leader saw the old connection end (the usual case: the kernel closes a
// killed process's sockets), and within 3 heartbeat intervals when it did
// not (a host that died); the leader logs a Warn naming both addresses and
// ends the old connection with an ErrDuplicateFollower refusal saying by
// whom it was replaced. A transport without heartbeats (in-process, a
// follower of an earlier version) cannot show a connection alive, so its
// connections are replaced as before. The follower counts the refusal
// (reason duplicate_follower) and retries it, even with
// StopOnPermanentRefusal: it passes by itself when the other connection
// turns out dead.
//
// # Hello verification
//
// Before a leader ships to a follower it checks that the follower's history
// is a prefix of its own log, as Raft checks prevLogIndex/prevLogTerm before
// appending: the hello names the follower's applied position and the batch
// that ends there (epoch and header CRC, wal.BatchRef), and the leader looks up
// the batch ending at that LSN in its log. Equal identities mean the same
// batch, hence — each side having applied its log in order from the same
// start — the same history up to there; anything else means the follower
// holds entries this leader does not (ErrDiverged) and must be rebuilt, never
// patched. The CRC catches what an epoch alone cannot: two histories written
// under the same epoch (a deposed leader that kept writing, a log generated
// elsewhere), including when the new history starts exactly after the
// follower's position, where no batch overlaps anything the follower applied.
//
// # The batch cache
//
// Followers near the tail read the WAL once, from memory: the leader hands
// each batch it appended (synced, in log order) to Appended, which copies it
// into a cache of recent batches shared by every follower's stream. A stream
// looks in the cache first; at the cache's end (the next LSN not yet
// appended) it waits instead of reading the disk; below the cache's first
// batch (a follower that fell behind, or batches appended before the cache
// was fed) it reads with its own WAL reader, and rejoins the cache as soon as
// its position is in it. The cache holds whole batches, contiguous in LSN,
// and evicts the oldest beyond CacheBytes. A batch handed over out of order
// (an Appended call was missed) restarts the cache from that batch: streams
// below it read the disk, so a missed call costs reads, never a batch.
//
// Why Appended and not one shared tail reader: the leader already holds the
// encoded, checksummed batch when its append returns, so the cache costs one
// copy per batch; a tail reader would add its own WAL reads (a stat and two
// preads, ~1.7 µs per batch measured here) and re-verify CRCs the leader
// just computed, plus a goroutine. A leader that does not call Appended
// still ships correctly: every stream then reads the WAL itself.
//
// Cached batches are never modified or reused after they were added, so a
// stream sends them without copying them out under a lock (Send copies).
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
// What a batch costs. Before deciding, the receiver touches every event's
// HWM cache slot and window lines (session.TrackerTx.Prefetch,
// idempotency.Store.Prefetch) so the batch's cache misses overlap instead
// of stalling each check. The Applier gets an indexed batch (its read view)
// unless it implements BatchReader and says it does not read this one: the
// default SessionApplier reads only for an Add, so a batch without Adds is
// written through a plain batch and Pebble indexes nothing. What one batch
// of n fresh events of distinct sessions writes, in one Pebble batch: n
// state rows; one HWM delta of ~21 B per session changed or carried
// forward (session/doc.go, "Amortised HWM persistence"), rarely an HWM row;
// one window journal value of 16 B per keyed event; the position, the last
// batch's identity and the clocks. Measured with the default options, 100K
// uniform sessions, 1000-event batches (bench Receiver/fresh): 187 WAL
// bytes and ~1.02 Pebble keys per event, against 203 and ~1.28 before the
// log carried old sessions forward in compact entries; the state rows alone
// are 127 bytes (Receiver/raw-ingest). A batch of client retries writes no
// state row: 59 WAL bytes per event (was 74).
//
// # Shards
//
// A deployment has a fixed number of shards. ShardRouter maps a session to
// its shard with a pure function every node computes alike —
// JumpHash(first 8 bytes of BLAKE3-256(session ID) as u64 LE, shards) — so
// all of a session's events land in one shard and its SeqNos stay contiguous
// in one WAL and one follower HWM (see Routing below; a golden test pins
// it). Leader opens one wal.Writer and one Shipper per shard in
// one directory (segment names carry the shard) and runs the Shippers
// concurrently and independently. On the follower side each shard has its
// own Receiver (see follower.Node); a batch for a shard a receiver or node
// does not serve is refused with ErrWrongShard.
//
// # Routing: why hash, why jump hash
//
// A session's events must all go to one shard, so that its SeqNos stay
// contiguous in one WAL and one follower's HWM sees all of them. The leader
// routes by session ID with a pure function that every node, every process
// and every version computes the same way:
//
//	h     = first 8 bytes of BLAKE3-256(session ID's 16 bytes), little-endian u64
//	shard = JumpHash(h, shardCount)      (Lamping & Veach, arXiv:1406.2294)
//
// Why hash first: session IDs are random when session.NewID makes them, but
// embedders may bring their own (UUIDv7, ULID, snowflake-style), whose
// leading bytes are a timestamp; routing on raw ID bytes would then put every
// session of the same second on the same shard. BLAKE3 (already oncewal's
// hash, see idempotency.DeriveKey) makes the 64-bit key uniform whatever the
// ID's structure, for one BLAKE3 compression (0.1–0.3 µs) per routing decision.
//
// Why jump hash: no table to store or agree on, uniform over shards, and if a
// deployment is ever re-sharded from n to n+1 shards, only 1/(n+1) of the
// sessions move (a modulo would move almost all of them). oncewal itself does
// not re-shard: the shard count is fixed per deployment, because moving a live
// session to another shard would split its SeqNo stream across two WALs and
// two follower HWMs. Changing the count means draining (closing every
// session) first.
//
// The golden-value test (router_test.go) pins the function; it must never
// change. A different function would be a new, explicitly versioned router.
//
// # The Applier contract
//
// An Applier (applier.go) is the embedder's state machine. The leader runs
// it on its own store and every follower on its own, each over the same
// log, so the replicas agree only if it keeps this contract (invariant 10):
//
//   - Deterministic: the same store state and the same events make the same
//     writes, on every replica and every run. Time is the event's WAL time
//     (Event.Time), never the wall clock; no randomness, no map order, no
//     reads but through b, no state outside the store.
//   - A business-rule rejection (an overdraft, a name taken) is a result,
//     never an error. Two ways, one example each:
//     (a) Before it is logged: the Applier also implements Validator. The
//     leader (LedgerLog) runs Validate after stamping an append and before
//     writing it; a refusal returns ErrRejected wrapping the reason to the
//     caller and logs nothing — no WAL bytes, no SeqNo consumed, no HWM
//     advanced: the session's next append gets the same SeqNo (package
//     follower's Example_rejectedBeforeLogging; leader's
//     TestValidatorRejects). Validate judges the store
//     as it stands after every batch logged before this one, exactly: the
//     store lags the log by the batches between their WAL write and their
//     local apply, so a log whose Applier is a Validator appends one batch
//     at a time (stamp, validate, write, sync, apply) and gives up group
//     commit — every append waits for one fdatasync of its own (8
//     goroutines of one-event appends, on disk here: 1.7–2.0K appends/s,
//     against 3.3–4.9K without a Validator). Judging
//     against the applied state alone would let two concurrent
//     withdrawals pass against the same balance; a speculative view of the
//     batches in flight would need each one's writes kept and dropped in
//     LSN order beside the store, a second receive path. An embedder that
//     needs the throughput puts more events in each append or uses (b). A
//     Commit refused this way leaves the claim with the caller: Fail it
//     (the rejection replays to retries) or Release it. Followers never
//     run Validate: Apply must accept what Validate accepted on the same
//     state.
//     (b) After it is logged: Apply writes its own record of the rejection
//     (in the Applier's key space) and returns nil; every replica records
//     the same rejection, and clients read the outcome from the store
//     (package follower's Example_rejectionRecorded).
//   - An error from Apply is a failure, not an answer — a read of b that
//     failed, a bug — and a panic is recovered at the call and counts as
//     one (ErrApplierPanic). Either refuses the batch with ErrApply and
//     commits nothing. Deterministic, the Applier would fail the same batch
//     again, so the shard stops instead of retrying: a LedgerLog fails
//     (ErrLogFailed wrapping ErrApply; every later append too), a
//     follower's Serve returns ErrApply (logged once at Error, counted in
//     Stats.ApplyErrors) and a follower.Node keeps that shard down. The
//     way back is the same everywhere: fix the Applier and reopen. The
//     failed batch is in the leader's synced WAL, so reopening the leader
//     (OpenLedgerLog, leader.Open) re-applies it and serves, and a
//     restarted follower gets it again from its durable position; with
//     the Applier still broken, the reopen refuses with the same ErrApply
//     and commits nothing of the failed batch (leader's
//     TestApplierFailsThenFixed, TestValidatePanics; follower's
//     TestNodeApplierFailure).
//
// # LedgerLog: the leader with a request ledger
//
// A LedgerLog is the leader side of request-level idempotency for one shard:
// a wal.Writer, the node's own Pebble store kept current by applying every
// appended batch locally through a Receiver (the same code a follower runs),
// and an idempotency.Ledger whose decisions are logged as WAL events.
//
//   - Every Ledger decision (claim, complete, release, fail) is a ledger
//     event appended to the WAL (synced) and applied to the local store
//     before the Ledger answers. Commit puts an operation's data events and
//     its complete record in ONE batch: on the leader and on every follower
//     the outcome commits atomically with the effect.
//   - Group commit. An append is stamped and written to the WAL under the
//     log's lock, so SeqNo order is LSN order, and encoded once: the bytes
//     written are the bytes applied locally and handed to OnAppend. Then,
//     without the lock, it waits for a WAL fdatasync covering it
//     (wal.Writer.SyncTo: concurrent appenders share one), and then it is
//     applied locally and handed to OnAppend one batch at a time, in LSN
//     order. Nothing of a batch is applied, shipped or answered before the
//     sync that covers it; a failed sync or local apply fails that batch and
//     every later one (ErrLogFailed: reopen). While a batch is written but
//     not applied, stamping judges its sessions (next SeqNo, closed,
//     expired) by that batch, which the store does not show yet.
//   - The local store is a materialisation of the WAL. Its receiver commits
//     without fsync (the WAL is already synced); after a crash OpenLedgerLog
//     re-applies the WAL beyond the store's position (crash images of
//     concurrent appends at their filesystem operations:
//     TestLedgerLogGroupCommitCrashImages).
//   - A promoted follower is the same thing: OpenLedgerLog over the
//     follower's store with a higher epoch. The new log starts at the
//     store's applied LSN + 1 (wal.WriterOptions.FirstLSN), the higher epoch
//     is persisted before anything else (so the deposed leader's batches are
//     refused from then on: ErrStaleEpoch, and its Shipper gets ErrFenced
//     from any follower that has seen the new epoch), and the Ledger answers
//     from the replicated ledger table.
//   - The WAL clock continues: Now is the wall clock kept strictly increasing
//     and never below the largest time the store has applied, so leases and
//     TTLs granted by the old leader run out on the new one as they would
//     have on the old.
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
//     refused (store.ErrFailed), nothing more is acknowledged, and the
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
//  10. An Applier is deterministic; a rejection is a result, never a wedge
//     (the Applier contract above): Validate refuses before anything is
//     logged, or Apply records the rejection; an Apply error or panic
//     commits nothing, stops the shard with ErrApply, and reopening with a
//     fixed Applier continues.
//  11. A follower ID is served on one connection at a time, and a
//     connection known to be alive (it answered within 3 heartbeat
//     intervals) is never replaced by another of its ID: the newcomer is
//     refused with ErrDuplicateFollower.
//  12. Epochs never wrap and a leader never serves below its own log: every
//     epoch is at most MaxEpoch (math.MaxInt64, the range of the etcd
//     revisions the coordinator will hand out; ErrEpochExhausted above it),
//     a promotion takes NextEpoch(highest seen), which refuses rather than
//     wrap, and a LedgerLog's epoch is at least both its store's committed
//     epoch and the epoch of its WAL's last batch (LeaderEpoch: the WAL is
//     the authority — a store rebuilt from the log knows no epoch until it
//     re-applies it). OpenLedgerLog brings the store up to the WAL's end
//     before it persists a raised epoch, so the new epoch starts at the
//     log's end and never fences the log's own batches; a store rebuilt
//     from the log records where the log's last epoch starts (a batch whose
//     epoch is above its predecessor's starts one). Design invariant 5.
package replication

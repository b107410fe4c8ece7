// Package leader is the leader side of an oncewal deployment on one node: for
// every shard it owns, the WAL writer, the stamping of every event, the
// session-expiry decision, the request ledger, and the shipping of the log to
// the shard's followers.
//
//	l, err := leader.Open(dir, &leader.Options{Shards: 4})
//	h, err := l.Append(wal.Event{Op: wal.OpPut, Session: id, Key: k, Value: v})
//	sh := l.For(id)                     // the session's shard: Ledger, Commit, WaitAcked
//	l.Close()
//
// # Layout
//
// dir/shard-NNNN is shard N's local store (a store.Store, as a follower
// keeps) and dir/wal holds every shard's WAL segments
// (segment names carry the shard); dir/SHARDS records the shard count. Open
// refuses a directory holding a store or segments of a shard outside
// 0..Shards-1 (ErrForeignShard), a log it cannot read (wal.ErrCorrupt,
// wal.ErrNotWAL and friends), everything "Where a leader opens" lists — all
// checked read-only before anything is created, so a refusal changes
// nothing — and a directory another Leader holds (wal.ErrLocked on
// dir/LEADER.lock, at once); a torn tail is repaired as package wal
// describes.
//
// # One stamping path
//
// Every event reaches the log through Shard.Append or Shard.Commit (the
// request ledger's records through the shard's Ledger), which stamp it:
//
//   - SeqNo: the session's next, from a sequencer seeded from the shard's
//     local store. The store applies every appended batch before Append
//     returns, with the same receiver a follower runs, and Open re-applies
//     whatever the WAL holds beyond it, so a restarted leader continues every
//     session where its log left it and never reuses a SeqNo. Concurrent
//     appends to a shard share the WAL's fdatasyncs (group commit; the rule
//     is LedgerLog's, below).
//   - Idempotency key: derived from (session, SeqNo, operation bytes)
//     (idempotency.DeriveKey), unless the caller supplies a client's key for a
//     retry (idempotency.ClientKey turns a request ID into one). A retry
//     logged under a fresh SeqNo with the same client key dies in the
//     followers' window.
//   - Time: the WAL clock, below.
//
// Before any of that, an append on a disk with less free space than the
// stores keep (Options.Store.MinFreeBytes, default 64 MiB) is refused with
// store.ErrDiskFull: nothing is logged and no SeqNo is taken, the
// shard keeps serving its followers, and appends go on once there is room —
// the WAL writer, which fails for good at its first short write, and the
// store's Pebble never meet a full disk.
//
// # The Applier
//
// A shard's store applies its log with Options.Store.Applier, which keeps
// the store's Applier contract (store invariant 9). An Applier that is a
// store.Validator judges every append before it is logged: a refusal
// is store.ErrRejected wrapping its reason, nothing is logged and no
// SeqNo is taken; the shard then appends one batch at a time, so each is
// judged by every batch before it. An Apply error or panic on the leader's
// own store fails the shard's log (ErrLogFailed wrapping
// store.ErrApply): every later append fails. The batch is in the
// synced WAL, so Close, fix the Applier and Open again: Open re-applies it
// and the shard serves; with the Applier still broken Open refuses with
// the same ErrApply.
//
// # The WAL clock
//
// Each shard's WAL clock is the wall clock (Options.Wall) made strictly
// increasing: the next event's time is max(previous + 1 ns, wall), and the
// previous time is restored from the store at Open, so the clock continues
// across restarts and promotions. It therefore never goes back, whatever the
// wall clock does: after a backward step the clock advances by 1 ns per
// stamp until the wall clock catches up, and no event is ever older than one
// logged before it — a follower never skips an event as too old.
//
// Session expiry is decided on the WAL clock by exactly the rule the
// followers apply (session.Tracker.Expired): a session idle for longer than
// the retention horizon is forgotten by every follower, so its next SeqNo
// could never apply there. The leader checks the rule before logging and
// refuses such an event with ErrSessionExpired (and an event of a
// closed session with session.ErrSessionClosed): a forward step of the
// wall clock may expire idle sessions, and their clients get a typed error
// and open new sessions, instead of the log carrying events that every
// follower would treat as a gap (a wedge) or skip. Shard.Claim applies the
// same rule (the same code, LedgerLog's admitSession) at the door of a
// request, before anything is claimed: a claim on a session that can no
// longer log is refused with the same errors, whose text says to open a new
// session and retry with the same request ID, and leaves no in-flight
// entry behind.
//
// # Epochs
//
// Options.Epoch above the epoch a shard's store has committed is a promotion:
// the new epoch and the LSN its history starts at are persisted in the store
// before anything is appended, so the store refuses the deposed leader's
// batches from then on, and followers are checked against the new history
// when they connect. Epoch 0 keeps the higher of the store's epoch and the
// epoch of the shard's WAL's last batch: the WAL is the authority, so a
// leader whose store was lost rebuilds it from the log and serves at the
// log's epoch, never below it (LeaderEpoch; the rules are
// invariant 6 below). Every epoch is at most replication.MaxEpoch.
//
// # Where a leader opens
//
// Open decides from what dir holds, read-only and before it creates
// anything — the directory, the lock file, an empty store — whether it may
// serve it (design invariants 9 and 10): a refusal leaves dir as it was.
//
//   - Layout: an absent or empty directory, or a leader directory (its
//     LEADER.lock, or a wal/ holding segments). A single store or a WAL
//     directory is a *store.LayoutError.
//   - Shard count: recorded in dir/SHARDS when the directory is created
//     (store.RecordShardCount: a synced file renamed into place); a
//     directory from before the record takes it once from the stores and
//     segments it holds. Another --shards is *store.ShardCountError
//     (store.ErrShardCount), a store or log of a shard beyond it
//     ErrForeignShard.
//   - Each shard's log: readable (wal.InspectFS), its epochs never going
//     back. A log that goes back — written by a leader that served below its
//     own log's epoch — is ErrEpochRegression, naming the LSN, both epochs
//     and the command that cuts it (oncewal waldump --cut-epoch-regression,
//     wal.CutEpochRegression: nothing cut was acknowledged, package wal says
//     why).
//   - Each shard's store (store.PeekStore): a leader opens only on a
//     leader's store — one a leader raised the epoch of (the m/leader mark,
//     keyspace.MetaLeader, written with every raised epoch; leader-only, so
//     a store rebuilt from a snapshot never has it), one whose shard's log
//     this leader directory already holds (directories from before the
//     mark), or one with nothing in it. Anything else — a follower's node
//     directory, a store never promoted — is ErrNotLeaderStore naming
//     oncewal promote: served as it is, it would take its old leader's
//     epoch without fencing it, bypassing promote's most-advanced check.
//     Options.Promote (oncewal promote, sim's failovers) takes such stores
//     over, raising each to Options.Epoch or, by default, the highest epoch
//     it and its log have seen + 1.
//   - A store behind the first LSN its log retains (a lost store, a log cut
//     by retention) cannot be caught up: wal.ErrCompacted.
//   - The epoch (LeaderEpoch): not below the store's or the
//     log's, not above replication.MaxEpoch, and not below an epoch the
//     store promised to a fencing leader (CheckPromise: a store that
//     promised E during a failover is promoted at E or above).
//
// Open logs one line for what it did ("oncewal leader opened" or
// "promoted", with each shard's epoch); opening its stores logs nothing.
//
// # Promotion
//
// Which store to promote and at what epoch is one policy, Rank over
// Candidates (each a store's position, held by a directory or a node), a
// pure function that oncewal promote, oncewal inspect and sim's failovers
// call, and that the automatic failover is to call on the positions it
// hears:
//
//   - Per shard, stores are ordered by store.ComparePositions: the
//     epoch of the last batch applied, then the applied LSN. A store no other
//     of its shard is ahead of is most advanced; level stores are all most
//     advanced, and the first given is the shard's Best. Level stores that
//     name different last batches (both known) are Diverged: incomparable,
//     reported, not broken by the order.
//   - A holder leads when it is most advanced on every shard any candidate
//     holds (the first such is Leader); otherwise the first holder of every
//     shard that leads the most shards is the one to Promote after copies
//     of the other shards' Best stores. A store whose position could not be
//     read names nobody: it might be ahead.
//   - The epoch (PromotionEpoch) is above every epoch a candidate holds,
//     committed or of its last batch: by default the highest + 1, never
//     above replication.MaxEpoch (replication.ErrEpochExhausted); an asked
//     epoch at or below the highest is replication.ErrStaleEpoch.
//
// # Closing
//
// Close is safe while anything else runs: it stops every Run (which then
// returns nil) and every WaitAcked (ErrClosed), waits for Run's streams and
// for the retention pass, slot write or snapshot cut in progress, and only
// then closes the logs and stores. Every later call returns a typed error —
// ErrClosed (Run, Retain, Register, Unregister, WaitAcked, Donor, a donor's
// Begin, Append — which wraps wal.ErrClosed too), idempotency.ErrClosed
// (Commit and the ledger) — never a panic on a closed store; a donor's
// snapshots already cut stay readable until they are ended.
//
// # The leader side: Fanout and Shipper
//
// A Fanout ships one shard's WAL to every registered follower of the shard
// over one Listener; a Shipper is the simple case of one anonymous follower
// (it is a Fanout with a single stream, so both run the same code:
// shipper.go describes the stream, fanout.go the routing). Each follower
// names itself in its hello (Ack.FollowerID, store.Options.ID) and has its
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
// waits for one follower, a majority of the replicas (the leader counted:
// (n+1)/2 of n followers) or all followers, for at most
// Options.AckTimeout (then ErrAckTimeout, naming how many acknowledged and
// are connected: a write never hangs on absent followers); Quorum says
// whether enough followers are connected to meet a policy (else
// ErrQuorumLost, which oncewal leader's /readyz reports); Stats gives per follower its acknowledged LSN, lag in events
// and bytes, connection state and refusals by reason, and OnAcked reports
// every acknowledged position as it moves (for retention slots).
//
// # Shipping: the per-follower stream
//
// A Shipper (one follower) and a Fanout (every registered follower of a
// shard) run the same per-follower stream loop, shipLoop. It is
// at-least-once by design; exactly-once is the store's Receiver's job.
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
//     one is known to be alive (invariant 5; see "One process per
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
// own store (see follower.Node); a batch for a shard a receiver or node
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
// # LedgerLog: the leader with a request ledger
//
// A LedgerLog is the leader side of request-level idempotency for one shard:
// a wal.Writer, the node's own Pebble store kept current by applying every
// appended batch locally through a store.Receiver (the same code a follower runs),
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
//     handed to OnAppend (shipped) and applied locally, one batch at a
//     time, in LSN order: the followers apply it while the local store
//     does. Nothing of a batch is applied, shipped or answered before the
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
//  1. A connection serves only the follower its hello names: it replaces
//     that follower's previous connection and no other follower's.
//  2. Nothing is shipped on a connection before its hello passed every check;
//     a refused connection is closed, counted by reason and logged. Nothing
//     beyond DurableLSN (when set) is shipped.
//  3. A stream reads a batch from the cache when the cache holds it, and the
//     cache holds only batches handed to Appended, contiguous in LSN, never
//     modified, within CacheBytes.
//  4. WaitAcked(lsn, policy) returns nil only once policy's share of the
//     followers registered at that moment have acknowledged lsn; any
//     other end (ErrAckTimeout, the caller's context, Close) leaves the
//     batch logged with its outcome unknown, never undone.
//  5. A follower ID is served on one connection at a time, and a
//     connection known to be alive (it answered within 3 heartbeat
//     intervals) is never replaced by another of its ID: the newcomer is
//     refused with replication.ErrDuplicateFollower.
//  6. Epochs never wrap and a leader never serves below its own log: every
//     epoch is at most replication.MaxEpoch (math.MaxInt64, the range of the
//     etcd revisions the coordinator will hand out; ErrEpochExhausted above
//     it), a promotion takes the epoch the promotion policy gives
//     (PromotionEpoch: the highest seen + 1, refusing rather than wrap), and
//     a LedgerLog's epoch is at least its store's committed epoch, the
//     epoch its store promised to a fencing leader (CheckPromise) and
//     the epoch of its WAL's last batch (LeaderEpoch: the WAL is
//     the authority — a store rebuilt from the log knows no epoch until it
//     re-applies it). OpenLedgerLog brings the store up to the WAL's end
//     before it persists a raised epoch (store.Receiver.RaiseEpoch), so the
//     new epoch starts at the log's end and never fences the log's own
//     batches; a store rebuilt from the log records where the log's last
//     epoch starts (a batch whose epoch is above its predecessor's starts
//     one). Design invariant 5.
package leader

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
// dir/shard-NNNN is shard N's local store (the same Pebble store a follower
// keeps, see package follower) and dir/wal holds every shard's WAL segments
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
//     is replication's LedgerLog).
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
// replication's Applier contract (invariant 10 there). An Applier that is a
// store.Validator judges every append before it is logged: a refusal
// is store.ErrRejected wrapping its reason, nothing is logged and no
// SeqNo is taken; the shard then appends one batch at a time, so each is
// judged by every batch before it. An Apply error or panic on the leader's
// own store fails the shard's log (replication.ErrLogFailed wrapping
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
// refuses such an event with replication.ErrSessionExpired (and an event of a
// closed session with session.ErrSessionClosed): a forward step of the
// wall clock may expire idle sessions, and their clients get a typed error
// and open new sessions, instead of the log carrying events that every
// follower would treat as a gap (a wedge) or skip.
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
// log's epoch, never below it (replication.LeaderEpoch; the rules are
// replication's invariant 12). Every epoch is at most replication.MaxEpoch.
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
//     store.KeyLeader, written with every raised epoch; leader-only, so
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
//   - The epoch (replication.LeaderEpoch): not below the store's or the
//     log's, not above replication.MaxEpoch.
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
package leader

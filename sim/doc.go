// Package sim is oncewal's simulation: the client workload generator, the
// oracle, and the end-to-end runs that the demo (oncewal demo) and the tests
// drive. It is product code — the demo is how a user sees the guarantee
// checked — and it uses only the public API of the other packages.
//
// # The client and the one stamping path
//
// GenerateWorkload produces client requests, not log entries: sessions open,
// put/add/delete keys, retry requests whose answers they lost (the same
// request ID, so the same idempotency.ClientKey), close, and now and then
// write late to a session they closed. A Client sends them to a leader
// (package leader), which stamps every event — SeqNo, idempotency key, WAL
// clock — exactly as it does in production; the Client records what the
// leader accepted (a late write is refused with session.ErrSessionClosed
// and has no effect). Nothing in this package assigns a SeqNo, except
// Log.Hostile (below). Record runs a workload through a leader and returns
// the log it wrote, for tests that feed followers batch by batch.
//
// # The oracle
//
// An Oracle is the state every follower must reach, computed without any of
// the followers' machinery: each distinct operation once — a request and its
// retries take effect once — and nothing in a session after its close
// (Oracle.Once). The Client builds it from the accepted requests in LSN
// order (Client.Oracle); Log builds it from the log itself (Oracle.Logged,
// by idempotency key); for a recorded log the two agree.
//
// # Run: the invariant
//
// Run drives a deployment: a leader of Options.Shards shards and
// Options.Followers follower nodes (each serves every shard, so N followers
// per shard), every follower on its own link per shard (an InProcess
// transport with its own fault seed; the leader accepts from all of them),
// the client's batches, and between them the faults the seed schedules:
// follower restarts (clean, killed, or a power failure: the node's links
// are cut, its in-memory filesystem is cloned as a crash would leave it
// (vfs.MemFS.CrashClone), then it is killed and reopened on the clone), leader
// restarts on the same directory (clean or a power failure likewise), answers
// (the client waits for WaitAcked(AckMajority) on every shard) and a
// promotion. What an outsider can check, after every follower that can has
// caught up (its store ends with the final leader's last batch: the same
// LSN, epoch and CRC — a position alone does not tell a diverged store, whose
// deposed entries may end at or beyond the new history's end, from a caught
// up one):
//
//  1. Every follower's state, shard by shard, equals the oracle of the
//     history: each distinct request the leaders accepted, once — the
//     requests of a deposed leader only up to the promoted store's position.
//     So does each shard's store of the final leader.
//  2. Every follower's receiver counters account for every event delivered
//     (store.ReceiverStats.Accounted), over all its incarnations.
//  3. An answer the client saw after WaitAcked(AckMajority) survives the
//     leader's death and the promotion: its LSN is within the promoted
//     history.
//  4. A restarted leader's log ends exactly where the client's accepted
//     history does (nothing acknowledged lost, nothing invented).
//  5. No follower is refused by the leader, except after a promotion a
//     follower it cannot continue: one behind the promoted store (the new
//     log does not hold what it needs: replication.ErrBehindRetention) or
//     one that applied the deposed leader's entries beyond it
//     (replication.ErrDiverged); and a late joiner (Options.LateJoiners)
//     for a shard whose log no longer starts at LSN 1 (behind retention).
//     Those (follower, shard) pairs are predicted from the positions at the
//     promotion and from the logs' starts at the join, checked to be
//     refused for exactly that reason and counted in Result.Refusals. With
//     Options.Rebuild each must then have rebuilt its store from a snapshot
//     of the current leader's (follower.RebuildAuto, the leader as donor)
//     and is held to point 1 like every other follower; without it, the
//     pair must have applied nothing of the new epoch and is left out of
//     point 1 for that reason only.
//
// A promotion is decided as a failover controller would: the leader stops,
// the followers are paused (their positions are final), and per shard the
// most advanced store is chosen, by leader.Rank (the promotion policy of
// oncewal promote: the last batch's epoch, then the applied LSN). The
// promoted node is the one that is most advanced on the most shards; for a shard where another follower got
// further, the promoted node's store is first rebuilt from a snapshot of
// that follower's (follower.Rebuild, the follower as donor) so that every
// shard's new history continues its most advanced store
// (Result.Transplants counts these). The new leader opens on the promoted
// node's directory with the next epoch and ships to the others. In a third
// of the promotions the deposed leader is a zombie: after the decision it
// logs one more client batch and ships it to one of the other followers,
// which must then be refused as diverged (and, with Options.Rebuild, is
// rebuilt).
//
// A run is seeded: the workload, every link's faults and every scheduled
// event (its moment, its kind, the share of unsynced writes a crash image
// keeps) come from Options.Seed. Goroutine timing is not: which batches a
// follower has applied when a fault strikes varies, so a seed replays the
// same faults, not the same interleaving.
//
// # Hostile logs: fault injection for followers
//
// Log.Hostile adds to a recorded log what no correct leader writes —
// verbatim re-appends of logged events (same SeqNo and key) and writes to
// closed sessions — to test that followers apply such logs exactly once
// too. It is the only code here that writes SeqNos, and it exists for
// follower tests only; the leader never produces these shapes.
//
// # The request-level failover
//
// RunFailover (failover.go) is the request-level scenario: client requests
// under idempotency keys against leader A, A killed at a random point of a
// request, follower B promoted, the client retrying against B; every request
// takes effect once and every retry gets the original answer.
package sim

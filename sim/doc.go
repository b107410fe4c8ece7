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
// # Elections: automatic failover (RunElections)
//
// RunElections (elections_run_test.go: test code, because package node
// imports replication/grpctransport, whose internal tests import this
// package — an import cycle in their test build) runs a cluster of
// ElectionOptions.Members members of package node (default 3), each on its
// own in-memory filesystem (vfs.NewCrashableMem), on one coord.Memory with a short lease
// (default 60 ms; the test uses 100 ms) and one node.MemoryNet whose links
// inject faults. Each member sees the coordinator through a view the
// nemesis controls (electview_test.go): paused (a stopped process: its calls
// wait, it hears nothing, its terms' Done stays open and Deadline ahead),
// cut (every call fails with coord.ErrUnavailable) or dead. Memory renews
// leases by itself, so what a member cut off or stopped would lose — its
// lease — the nemesis takes with Memory.Expire, and a campaign won while it
// cannot renew is expired at once.
//
// The client sends the workload's batches (GenerateWorkload), every request
// under its client key (its request ID), through whichever member leads
// (node.Node.Leader, the highest epoch; a paused member only on purpose):
// each shard's part is appended, then awaited under the cluster's policy
// (WaitAcked, AckMajority: the leader and a majority's remainder of its
// followers). A batch not acknowledged on every shard is sent again, with
// the same request IDs, to whoever leads next, until it is; a sixth of the
// batches (none that opens or closes a session or writes late) are given
// up after a failed attempt instead, and the workload's later retries of
// their IDs are not sent. A retry refused because its own earlier attempt
// closed one of its sessions waits until the shard's log is acknowledged.
//
// Between batches the seeded nemesis kills the leader (its Run stopped
// without a resign: its terms expire, its filesystem is cloned as a power
// failure leaves it — CrashClone keeping a drawn share of unsynced writes —
// and it restarts on the clone), pauses the leader past its lease (once a
// successor leads at a later epoch the zombie is given the next batch,
// which it must not have acknowledged, then it runs again; if no successor
// can fence without it, it runs again), cuts a member from the coordinator
// or from its peers (MemoryNet.Cut of every shard; a leader is cut by
// cutting the others' dials) until the fault heals — at the next event,
// after the second failed attempt of a batch, or when nobody leads — or
// kills a follower. At the end every fault heals, every member catches up
// with the final leader (AckAll on every shard), every member stops, and
// its stores are read. The invariants, checked per seed:
//
//  1. Every request acknowledged under the policy is present, exactly
//     once, on every replica: each replica's state equals the oracle that
//     applies, in the order the client sent them, each distinct request
//     that was acknowledged, or unacknowledged (given up, or settled by a
//     close) and present in the final leader's store — an unacknowledged
//     request may be there once or not at all, never twice; and every
//     replica's window holds exactly the request keys the final leader's
//     does (the window is sized to hold the whole workload).
//  2. None applies twice: the oracle applies each request once, so a
//     second application of an add or a put shows in the state; and a
//     zombie's write is never acknowledged.
//  3. At most one member acknowledges writes per epoch: every
//     acknowledgement's (epoch, member) is recorded, and the epochs the
//     client saw acknowledged never fall.
//  4. Epochs only grow: every term record the coordinator published has a
//     higher epoch than the term before it.
//
// The schedule (each event's moment, kind, member and crash share) and the
// workload come from the seed; goroutine timing does not, so a seed replays
// the same faults, not the same interleaving.
//
// # The request-level failover
//
// RunFailover (failover.go) is the request-level scenario: client requests
// under idempotency keys against leader A, A killed at a random point of a
// request, follower B promoted, the client retrying against B; every request
// takes effect once and every retry gets the original answer.
package sim

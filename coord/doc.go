// Package coord is the coordination seam of automatic failover (issue 27):
// a node campaigns for its cluster's leadership, observes who leads, resigns,
// makes every leadership-dependent write conditional on still leading, and
// knows until when it may act as leader without asking etcd (Deadline). A
// cluster's data keys (the published leader record, the fencing record,
// members, followers' reports) are written by a leader's Guarded or by
// anyone's Update, and followed with Watch.
// It is the boundary between oncewal and the engine that elects, as
// raft.Storage is raft's: Coordinator and Leadership are small so that a
// node, the simulation and the tests drive the same contract.
//
// Two implementations keep the same invariants, and one test suite runs
// against both: Etcd, on go.etcd.io/etcd/client/v3 (concurrency.Session and
// Election: the election key lives on the session's lease), and Memory, in
// process, for unit tests and the simulation (Memory.Expire plays a lease
// ending). The library links the etcd client only; tests start a real etcd
// with internal/etcdtest.
//
// Layout in etcd, under EtcdOptions.Prefix (default "/oncewal"):
// PREFIX/CLUSTER/leader/LEASE is a candidate's election key (its value the
// Candidate in JSON), PREFIX/CLUSTER/data/KEY the keys Guarded and Update
// write.
//
// # Invariants
//
//  1. Epochs only grow: a leadership's Epoch is its election key's create
//     revision, which etcd never hands out twice and only raises, so every
//     later term of a cluster has a higher epoch than every earlier one.
//  2. At most one Leadership of a cluster can write at a time: a candidate
//     leads only once every key created before its own is gone, and Guarded
//     writes only if its own key still exists with its create revision (an
//     etcd transaction compared on CreateRevision). A deposed leader's write
//     fails with ErrLostLeadership, whatever it believes.
//  3. Campaign reports leadership only after confirming it with a guarded,
//     empty transaction, and gives up when its session ends while waiting:
//     etcd's Election.Campaign can return nil after the session's lease is
//     gone (the key deleted with the lease, and the older keys gone too), so
//     its return alone proves nothing.
//  4. Done closes when leadership may be lost: the session's lease was
//     revoked or expired, the client could not renew it in time (etcd
//     unreachable: Done closes when Deadline passes, invariant 7), a
//     guarded write found the election key gone, the leader resigned, or
//     the coordinator closed. A Done that has not closed is no proof of
//     leadership; a successful Guarded is, at its commit. A Deadline still
//     ahead of time.Now() proves that no one else holds the key
//     (invariant 7).
//  5. Observe reports the leader of a cluster as it changes: the candidate
//     whose key has the lowest create revision, with that revision as its
//     epoch, or the zero Leader when none holds the key. Consecutive reports
//     differ; a slow reader sees the latest state, not every step.
//  6. Bad input (an empty or '/'-holding cluster name, an empty candidate
//     ID or data key, a nil Update function) is refused with ErrBadInput
//     before anything is written; after Close every call answers
//     ErrClosed.
//  7. Until Deadline, no other candidate can have been granted the
//     election key: etcd expires a lease no sooner than its TTL after the
//     last renewal it answered, and that renewal happened after this
//     process sent it. So the etcd Leadership renews the lease itself
//     (KeepAliveOnce every TTL/3, beside the session's keep-alive, which
//     times its own deadline from the answer's arrival, too late to be a
//     bound) and sets Deadline to the send time of the last renewal etcd
//     answered plus the granted TTL, minus a margin of TTL/10 for the two
//     clocks' rates (deadlineMargin says why that is ample); at the win it
//     is that of the last renewal while campaigning, or of the grant. It is
//     a reading of the monotonic clock: it assumes this process's clock
//     runs while the machine does (a host suspended in sleep must not
//     lead). Deadline only moves forward while renewals are answered; Done
//     closes when it passes, and when the term ends otherwise (as
//     invariant 4 lists) Deadline is pulled back to that moment: once Done
//     has closed, Deadline is not after the moment it closed, and once
//     Deadline has passed, Done has closed or closes as soon as a timer
//     set for it fires. Resign ends the term before deleting the key, and
//     a term that ends otherwise gives up its lease (revoked, best effort),
//     so that no term keeps its key alive once it has stopped leading.
//     Memory renews every TTL/3 with Deadline its last renewal plus the
//     TTL (one clock, no margin; Memory.SetTTL), and Memory.Expire ends
//     the term at once.
//     LeaseTTL is the lease a coordinator's terms run on: a dead leader is
//     succeeded about one LeaseTTL after its last renewal.
//  8. Watch reports a cluster's data keys under a prefix, with their
//     values, first as they are, then at each change, as Observe reports
//     the leader (invariant 5): consecutive reports differ, and a slow
//     reader sees the latest state, not every step. On etcd it reads the
//     keys, watches from the revision after that read and applies each
//     event; a watch that breaks (compacted past while the client was
//     away, cancelled by etcd, or by a member that lost etcd's leader) is
//     not resumed but replaced: the keys are read again and a new watch
//     starts there, so a watch never stops in silence while its context
//     lives. The channel closes only when ctx ends or the coordinator
//     closes.
//  9. Update is a compare-and-swap on the key's last write (its
//     ModRevision; CreateRevision 0 when absent), retried with fn on the
//     newer value when another write came between its read and its write.
//     Update and Guarded are both just writes of the key: either one that
//     lands between an Update's read and its write makes it retry; neither
//     waits for or fences out the other. Data that a deposed leader must
//     not change goes through Guarded only.
//
// What an etcd outage does: a leader keeps its Leadership while renewals
// are answered; once they are not, its Deadline stays where the last
// answered one put it (at most TTL − TTL/10 after that renewal was sent),
// Done closes when it passes, and its Guarded writes fail (ErrUnavailable
// while etcd is unreachable, ErrLostLeadership once it answers and the key
// is gone). A leader that stops acting as one at its Deadline has stopped
// before etcd could expire its lease and grant the key to another, whether
// the outage cut the leader from etcd (the others may then elect a new
// leader, after the lease expires) or cut etcd's quorum (no one wins, since
// winning needs etcd too): the cluster refuses leadership-dependent writes
// rather than risk two leaders. Watch and Observe go quiet while etcd is
// unreachable and report the latest state when it answers again.
package coord

// Package coord is the coordination seam of automatic failover (issue 27):
// a node campaigns for its cluster's leadership, observes who leads, resigns,
// and makes every leadership-dependent write conditional on still leading.
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
// Candidate in JSON), PREFIX/CLUSTER/data/KEY the keys Guarded writes.
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
//     revoked or expired, the client could not renew it within its TTL
//     (etcd unreachable), the leader resigned, or the coordinator closed.
//     A Done that has not closed is no proof of leadership; a successful
//     Guarded is, at its commit.
//  5. Observe reports the leader of a cluster as it changes: the candidate
//     whose key has the lowest create revision, with that revision as its
//     epoch, or the zero Leader when none holds the key. Consecutive reports
//     differ; a slow reader sees the latest state, not every step.
//  6. Bad input (an empty or '/'-holding cluster name, an empty candidate
//     ID or data key) is refused with ErrBadInput before anything is
//     written; after Close every call answers ErrClosed.
//
// What an etcd outage does: a leader keeps its Leadership until the client
// cannot renew the lease within its TTL; then Done closes, and its Guarded
// writes fail (ErrUnavailable while etcd is unreachable, ErrLostLeadership
// once it answers and the key is gone). No one else can win meanwhile,
// since winning needs etcd too: the cluster refuses leadership-dependent
// writes rather than risk two leaders.
package coord

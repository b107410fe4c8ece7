// Package node runs one replica of an oncewal cluster with automatic
// failover (issue 27): one process per machine, the same configuration on
// every one, holding every shard's store. It follows whoever leads; when the
// leader's lease ends the nodes campaign (package coord), and the winner
// fences the followers, promotes the most advanced replica and publishes
// itself, without an operator.
//
//	n, err := node.Open(&node.Options{Coordinator: c, Cluster: "prod", ID: "a",
//		Dir: dir, Shards: 4, Addr: "10.0.0.1:7400", Transport: t})
//	err = n.Run(ctx)
//
// # The records in the coordinator (the cluster's data space)
//
//   - members: the replica set (Members). Only members campaign, report or
//     follow; a node that is not one is refused (ErrNotMember).
//   - epoch_base: the offset that turns an election's term (its key's create
//     revision, coord invariant 1) into an epoch above everything the stores
//     hold: epoch = max(base + term, highest epoch seen + 1), and the winner
//     raises base to epoch − term in the same guarded write that starts its
//     fencing (invariant 1).
//   - term: the current term as its winner wrote it (guarded): its epoch, the
//     winner's ID and address, and its state — fencing, leading, or handoff
//     to a more advanced member.
//   - report/ID: what member ID promised a fencing term, and its stores'
//     final positions under older epochs.
//
// # A term, step by step
//
//  1. Campaign: every member keeps a campaign pending; the coordinator
//     grants the election key to one at a time.
//  2. Fence: the winner writes term (state fencing, its epoch) and stops
//     applying anything. Every member that sees it stops following the old
//     leader, promises the epoch in each of its stores (follower.Node.Promise:
//     persisted; from then on every batch of an older epoch is refused) and
//     writes its report: the final positions, and its address. The winner
//     waits until, for every shard, it has heard Need stores (its own
//     counted): with F = members − 1 followers of the deposed leader and an
//     ack policy that needs A of them, F − A + 1 — Patroni's quorum rule —
//     so that every set the policy could have acknowledged meets the set it
//     heard (invariant 2). A store that could not promise (being rebuilt) is
//     not heard. It gives up after Options.FenceTimeout and resigns.
//  3. Choose: the promotion policy (leader.Rank: by the last batch's epoch,
//     then LSN, per shard) over what it heard. If the winner is the most
//     advanced on every shard it promotes itself. If another member is, it
//     writes term state handoff naming it and resigns; the other members hold
//     their campaigns back so that member wins next. If nobody is, the
//     member most advanced on the most shards leads: the winner, when that
//     is itself, first copies each shard it is behind on from the member
//     ahead (a snapshot of that member's store, served while it follows:
//     follower.Rebuild, verified and installed atomically); else it hands
//     over. Two stores level at one position with different last batches —
//     two histories at one epoch — stop the term with an alert.
//  4. Promote and publish: leader.Open on its stores at the term's epoch,
//     then term state leading with its address, guarded.
//  5. Lead: the leader ships to every other member (members added or
//     removed are registered or dropped at once), serves clients under
//     Options.Ack (clientapi MinAck), and steps down the moment its
//     leadership may be lost (coord invariants 4 and 7): its client service
//     answers nothing once the leadership's deadline passes (invariant 3).
//  6. Follow: the others point their stores at the published address.
//     A store that cannot continue (diverged, behind, a deposed leader's
//     stores) is rebuilt from the leader's snapshot, as a follower's is; a
//     node whose replica is a leader's (it led a term and lost it) moves
//     it to DeposedDirName first — kept for an operator, replaced by the
//     next — and rebuilds. A deposed leader's stores still report while
//     fencing (read-only), so a cluster whose most advanced replica is the
//     old leader's (a clean restart of everything) promotes it again. A
//     shard whose store refuses the leader's batches as older than its
//     promise is rebuilt from the leader too: a leader re-elected after
//     losing its lease (to an etcd outage every member saw) ships its own
//     log's tail of its earlier epoch, which no promised store may take.
//
// # Invariants
//
//  1. Epochs only grow: each term's epoch is above every epoch a previous
//     term published or fenced with (base only rises, terms only grow),
//     and above every epoch the winner's stores and the reports it heard
//     hold; a winner that hears of a higher epoch raises base past it and
//     resigns instead of leading.
//  2. A write acknowledged under Options.Ack survives every failover: the
//     winner hears Need members' final positions after they promised its
//     epoch — so no deposed leader can reach its ack policy any more — and
//     promotes only the most advanced of them.
//  3. At most one node acknowledges writes per epoch: an epoch is one
//     term's, a term has one winner, and a leader answers clients only
//     while coord's Leadership may still be held (Deadline, Done).
//  4. Every leadership-dependent write to the coordinator (base, term) is
//     guarded by the term's election key (coord invariant 2).
//  5. A node's directory belongs to one cluster and member (the NODE file):
//     another cluster or ID is refused (ErrForeignDir) before anything is
//     written, and one process at a time holds it (ErrLocked).
//
// # Requests in flight at a failover
//
// Every request ID is claimed by the leader's client service, in the
// leader's process, and its effects are logged with its outcome in one
// batch. A claim still in flight when a member starts to lead was taken by
// a leader that is dead, or deposed and fenced: it can never complete, so
// the new leader frees it at once (idempotency.LedgerOptions
// FreeOrphanedClaims) and the client's retry runs the request afresh —
// once, since nothing of it was logged — instead of waiting out the claim
// lease.
//
// # When etcd is unreachable
//
// A leader whose lease cannot be renewed loses it after the TTL (coord
// invariant 4) and steps down; nobody can win meanwhile, since winning needs
// etcd, so the cluster refuses writes until etcd answers again — never two
// leaders. Followers keep their stores and their connection to a leader that
// still serves; they learn of a new term when etcd answers again.
package node

// Package lifegate orders an owner's work against its Close: the one gate
// the leader (leader.Leader), the follower (follower.Follower) and the
// follower node (follower.Node) close with.
//
// Two kinds of work pass the gate. A hold (Hold) is a short use of what
// Close closes — an Apply, a retention pass, a slot write, a snapshot cut:
// Close waits for it to end. A run (Enter) is a long call — Serve, Run —
// that Close stops: its context ends at Close, and Close waits for it to
// return. After Close both are refused, so the owner can close its stores
// once Close returns.
//
// # Invariants
//
//  1. Close returns only after every hold taken and every run entered
//     before it has ended, and none is let in after it began.
//  2. A run's context ends when Close begins or its parent ends.
//  3. Holds do not nest: a Close waiting between two holds of one
//     goroutine would deadlock it.
package lifegate

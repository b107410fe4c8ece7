// Package replication is oncewal's wire contract between a shard's leader and
// its followers: what travels (raw WAL batches one way, acks and hellos the
// other), the refusal reasons a follower or a leader gives, the epochs that
// fence a deposed leader, and the Transport interfaces a network
// implements. It holds no store and no shipping logic: the leader's side is
// package leader (Fanout, Shipper, LedgerLog), the follower's is package
// store (Receiver) served by package follower, and the transports are
// beside it: replication/inprocess (channels, seeded faults) and
// replication/grpctransport (gRPC over mutual TLS).
//
//	leader:  wal.Writer ─► leader.Fanout: one stream per follower ─► Transport ─► store.Receiver :follower A
//	                       (or a leader.Shipper: one)            ─► Transport ─► store.Receiver :follower B
//	                                   └──────────── Ack(position) ◄─────────────┘
//
// The Transport (Listener/LeaderConn on the leader, Dialer/FollowerConn on the
// follower) carries raw wal batch bytes one way and acks the other, with no
// ordering or delivery guarantee. Shipping is at-least-once: a stream
// resends anything unacknowledged and rewinds to whatever position the
// follower states. Duplicates are therefore normal, and the follower's
// store is where they die.
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
//     otherwise. Reliability comes from the leader's stream (retransmit, rewind) and
//     exactly-once from the follower's store.Receiver (position, HWM, window).
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
//     unblock it, so callers treat that connection as dead (the leader's stream
//     closes it). The in-process transport keeps the connection usable.
//   - Backpressure: Send may block while the link's buffer is full; ctx bounds
//     the wait. The leader's stream bounds unacknowledged batches itself
//     (leader.ShipperOptions.MaxInFlight), so a transport's buffer only smooths bursts.
//
// # Refusal reasons and identities
//
// Every refusal is a sentinel of this package that survives the wire
// (errors.Is works on what a Dial or Recv returns, wrapped in ErrRefused):
// a store's refusal of a batch (ErrWrongShard, ErrStaleEpoch, ErrSeqGap,
// ErrOutOfOrder, ErrDiverged: refusal.go), a leader's refusal of a hello
// (ErrBadHello, ErrFenced, ErrDiverged, ErrBehindRetention,
// ErrUnknownFollower, ErrDuplicateFollower, ErrBadFollowerID) and a
// transport's (ErrAuthFailed, ErrIdentityMismatch, ErrDisconnected,
// ErrClosed). A follower names itself in every hello (Ack.FollowerID:
// 1..MaxFollowerIDLen bytes, ValidFollowerID); shards are numbered
// 0..MaxShards-1. A transport that authenticates its peers binds that name
// to the peer's identity (the network transport: the certificate's) and
// refuses a hello claiming another follower's ID with ErrIdentityMismatch.
//
// # Epochs
//
// Every batch carries the epoch of the leader that wrote it, and every
// hello and ack the highest epoch the follower has committed. Epochs only
// grow and never wrap (DESIGN invariant 5): every epoch is at most MaxEpoch
// (math.MaxInt64, the range of the etcd revisions a coordinator hands out;
// ErrEpochExhausted above it, CheckEpoch), and the next one is NextEpoch of
// the highest seen, which refuses rather than wrap. A leader whose epoch is
// below a follower's has been deposed (ErrFenced); a batch below a store's
// epoch is refused (ErrStaleEpoch).
package replication

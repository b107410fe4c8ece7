// Package grpctransport is the network implementation of the replication
// Transport (replication.Listener/LeaderConn on the leader,
// replication.Dialer/FollowerConn on the follower) over gRPC, with mutual TLS
// by default.
//
// # Shape
//
// The leader runs a gRPC server (Server, from Listen or NewServer) with one
// bidirectional streaming method, /oncewal.replication.v1.Replication/Stream.
// A follower (Dialer) opens one stream per connection: its first message is
// the hello (shard, follower ID, highest committed epoch, durable applied LSN
// and the identity of the batch that ends there); the leader
// answers with response headers once its Listener's Accept has taken the
// stream (that is when Dial returns), then streams batches; the follower's
// acks flow back on the same stream. Each Dial makes a fresh TCP connection
// and TLS handshake, so the follower's own backoff paces reconnects and a
// rotated certificate is picked up at the next one.
//
// # Several shards, several followers per shard
//
// A Server accepts any number of streams and hands each to a Listener's
// Accept with the follower's hello, once its certificate may claim the
// hello's follower ID (Identities); it does not route by the ID. It
// serves one shard (the Server is the Listener) or every shard of a leader
// node: Server.Listener(shard) returns a Listener per shard and the server
// routes each stream by its hello's shard, so one address and one TLS
// identity serve them all; a routed server refuses a stream for a shard no
// Listener serves at once (replication.ErrWrongShard). Routing streams to
// followers is leader.Fanout's job: put one Fanout per shard on the
// shard's Listener and every registered follower gets its own stream, each
// follower's reconnect replacing only its own. The ID is bound to the
// follower's certificate (see Identities below).
//
// # Other services on the port, and identities
//
// ServerOptions.Services adds services of unary methods (UnaryService:
// bytes in, bytes out, under the same TLS and raw codec) to the server; the
// client service is one, and CallUnary is how a client calls them. A
// certificate names its holder's Identity (a role and a name) with one URI
// SAN, oncewal://ROLE/NAME; a handler reads its caller's with PeerIdentity.
// ListenServices serves such services alone (a ServiceServer: no
// replication, no snapshots), for a node that does not lead but answers the
// client service (a follower, which says "not leader").
//
// # Identities
//
// The server binds a stream's hello to its certificate before the stream
// reaches a Listener (services.go, mayFollow): a certificate of role
// follower or node may follow only under its own name (an anonymous
// hello claims no ID: only a Shipper serves it), one of role client, or
// one that names no identity, may not follow at all. Anything else is
// refused with replication.ErrIdentityMismatch (wire kind
// identity-mismatch), which the follower's Dial returns like any refusal
// and the leader logs at Warn and counts (ServerStats.RefusedIdentity).
// So only the holder of a follower's certificate can ack as that follower,
// and a quorum of acks (leader.AckMajority) cannot be forged by another
// replica. The Snapshot method likewise serves only a node or a follower:
// a client must not download a store (PermissionDenied, which a
// SnapshotClient returns as replication.ErrIdentityMismatch). With
// Insecure there are no certificates and IDs are taken on trust: tests
// and loopback only.
//
// # Refusals
//
// A leader that will not serve a follower (a Fanout's refusals: an unknown
// ID, a diverged or behind-retention follower, a bad hello) ends its stream
// with Refuse (replication.RefusingConn): the stream's status carries the
// refusal's kind and text, and the follower's Recv (or Dial) returns an
// error wrapping ErrRefused, replication.ErrDisconnected and the refusal's
// own sentinel (replication.ErrWrongShard, ErrFenced, ErrStaleEpoch,
// ErrDiverged, ErrBehindRetention, ErrUnknownFollower, ErrIdentityMismatch,
// ErrDuplicateFollower, ErrBadFollowerID, ErrBadHello — the most specific
// one a refusal wraps), so the follower's
// redial loop knows that retrying alone will not fix it, logs why and
// counts it by reason. ErrRefused is replication.ErrRefused, which the
// in-process transport returns too.
//
// # Wire format
//
// No generated code: a raw codec (forced per server/call, never registered
// globally) carries frames of one type byte and a payload. Batches are the
// wal batch bytes unchanged (0x03 | header | body); an ack (0x02) is a fixed
// 22-byte record (type, flags, shard u32, epoch u64, applied LSN u64,
// little-endian); a hello (0x01) is the same record with the protocol
// version in place of the flags, followed by the last batch's epoch u64 and
// header CRC u32 and the length-prefixed follower ID (35 bytes + the ID).
// ProtocolVersion is 2; a leader refuses a hello of any other version (the
// 22-byte version-1 hello included) and a version-1 leader refuses version 2,
// so a leader and its followers are upgraded together. See frame.go.
//
// Heartbeats (0x04: the leader's last LSN u64 and WAL time i64) and the
// follower's answer to each (0x05, one byte) are negotiated per stream
// outside the hello: the follower asks with request metadata
// oncewal-heartbeat: 1, and a leader that sends them promises its interval
// (ServerOptions.HeartbeatInterval, default 1s) in the accept header
// oncewal-heartbeat-interval. A peer of the previous release neither asks
// nor promises and never receives either frame, so the hello stays at
// version 2 and a leader or a follower can be upgraded first.
//
// # Limits and bad input
//
// The follower accepts messages up to MaxBatchFrame (1 + wal.HeaderSize +
// wal.MaxBodySize); the leader accepts only control-frame-sized messages.
// gRPC refuses a longer message before buffering it, up to the server's
// limit, which is the largest any of its methods takes (a service of
// ServerOptions.Services may take more); each method then refuses a
// message over its own limit itself. A frame of the wrong
// type or length, a batch whose header does not decode or whose length
// disagrees with its header, a second hello, or a hello of another protocol
// version ends the stream with a log line and an error wrapping ErrBadFrame
// (or ErrFrameTooLarge) and replication.ErrDisconnected; nothing reaches the
// receiver, so nothing changes, and the follower reconnects. The body
// checksum is left to the receiver, which refuses a corrupt batch with an
// ack like any other refusal.
//
// # Transport contract
//
//   - Errors: a broken stream (peer closed, network fault, keepalive timeout,
//     server stop) is replication.ErrDisconnected; a local Close of the
//     connection, Server or Dialer is replication.ErrClosed.
//   - Buffers: LeaderConn.Send copies the batch into a fresh frame before it
//     returns; FollowerConn.Recv returns a slice the caller owns.
//   - Concurrency: one Send and one Recv may run concurrently per
//     connection; Close from anywhere, any number of times. On the leader
//     only the stream's handler goroutine calls SendMsg (Send queues to it),
//     so no send can race the handler's return.
//   - Cancellation: a cancelled ctx returns ctx.Err() promptly. The leader's
//     Send and both Recvs leave the connection usable; the follower's ack
//     Send ends the stream if it has to abort a blocked SendMsg.
//   - Backpressure: the Shipper's MaxInFlight bounds unacknowledged batches;
//     below it, gRPC/HTTP2 flow control blocks the leader's stream, its send
//     queue (ServerOptions.SendBuffer batches) fills, and Send blocks.
//   - Liveness: HTTP/2 keepalive pings both ways (ServerOptions and
//     DialerOptions KeepaliveTime/KeepaliveTimeout; the server's enforcement
//     policy permits client pings every 5s) drop a dead peer; the follower
//     redials, the Shipper accepts the new stream and resumes from the hello.
//     Keepalives take 30–40 s and are answered by gRPC itself, so on top of
//     them the leader's stream sends heartbeats (replication.HeartbeatConn)
//     that the follower bounds (follower.Options.LeaderTimeout: a stopped
//     leader is noticed in seconds) and answers (replication.PeerConn: the
//     leader tells a live connection of a follower ID from a dead one).
//
// # Security
//
// Mutual TLS is the default and the only mode unless Insecure is set (for
// tests on loopback only: nothing is authenticated, and follower IDs are
// taken on trust): the
// leader requires and verifies a client certificate against its CA pool
// (tls.RequireAndVerifyClientCert), the follower verifies the leader's
// certificate and name against its CA pool, both at TLS 1.3 or later
// (ServerTLSConfig, ClientTLSConfig, LoadServerTLS, LoadClientTLS). A
// handshake that fails on the leader (certificate from another CA, expired,
// missing, or a plaintext client) is logged with its reason at Warn and the
// connection is closed before any stream exists, so no batch is read or
// sent. The follower's Dial returns an error wrapping
// replication.ErrAuthFailed and the TLS or x509 error whichever side
// refused the certificate (authprobe.go: in TLS 1.3 the leader's refusal of
// the follower's certificate arrives as an alert after the client's
// handshake, so the Dial reads the leader's first byte before it returns),
// which the follower's redial loop counts as permanent; it also logs its
// failed dials at Warn, once per distinct reason per 30 s. Insecure
// (plaintext) exists for tests and loopback experiments only.
//
// For trying this locally, oncewal gencerts makes a throwaway CA and one
// certificate per identity; production brings its own PKI, issuing the
// same URI SANs.
//
// # Tests
//
// Everything runs on 127.0.0.1. The exactly-once pipeline test runs the
// replication issue's invariant over this transport through a seeded
// fault-injecting TCP proxy (connection resets, drops, stalls, refused
// connections) with follower restarts and kills; another test restarts the
// leader process (WAL writer, server, shipper) on the same WAL and address;
// another runs two named followers of one shard through a Fanout, one of them
// restarting. BenchmarkFanoutLeaderCPU measures the leader's CPU per event
// with one and with three followers (followers in a child process).
// ONCEWAL_LONG=1 runs more seeds and larger workloads. TLS refusal tests
// (wrong CA either way, no client certificate, plaintext client, expired
// certificates) and identity tests (another follower's certificate, a
// client's, as follower and for a snapshot) assert that nothing is applied
// and that a log line says why. Tests check that no goroutine of gRPC or this package outlives Close.
package grpctransport

// Package clientwire is the wire contract of the client service,
// oncewal.client.v1.Client: the messages a client (package client) and a
// node (package clientapi) exchange over the node's gRPC server, on the port
// and under the mutual TLS of the replication service, with the same raw
// codec (no generated code).
//
// # Methods
//
// Three unary methods, each one request frame and one reply frame:
//
//   - Submit: run a request once. A SubmitRequest names the client's
//     session, the client's request ID, what the request does (Action, for
//     a conflict's message), the ack policy to wait for, and the payload the
//     node's handler maps to events. The reply says what happened (Code), the
//     LSN and epoch of the batch that logged it, and the recorded outcome.
//   - Status: what the node's ledger knows of a request ID, in the shard
//     of the session the request was submitted in (the ledger is per shard).
//   - OpenSession: a new session for the client, in the shard of Near if
//     set (so that a request retried under a renewed session meets its own
//     ledger), with the retention horizon the client must renew within.
//
// # Invariants
//
//  1. Every frame starts with Version and its message type; a decoder
//     refuses another version or type, a truncated frame and trailing bytes
//     with an error wrapping ErrMalformed, and never panics (fuzzed).
//  2. Integers are little-endian (fixed width) or unsigned varints (lengths);
//     every length is bounded before anything is allocated, by the limits
//     below, which match the ledger's (idempotency.MaxRequestKeyLen,
//     MaxActionLen, MaxOutcomeSize) so that a frame that decodes is never
//     refused by the ledger for its size.
//  3. The scope of a request is never on the wire: the node takes it from
//     the caller's authenticated identity, so one client can neither replay
//     nor collide with another client's request IDs.
//  4. Codes are append-only: a code keeps its number and meaning across
//     versions; a decoder that meets a code it does not know reports it as
//     is, and the client treats it as a refusal.
package clientwire

// Package client is the Go client of an oncewal cluster's client service
// (oncewal.client.v1.Client): it sends requests to whichever node leads,
// retries each under the caller's request ID until it has an answer or its
// budget is spent, and keeps the session the requests are logged in, so
// that a caller deals only in request IDs and payloads.
//
// A Client is made with New from Options naming one or several nodes (any
// of them: the client finds the leader), the mutual-TLS configuration whose
// certificate names the caller (oncewal://client/NAME; the node scopes
// request IDs by it), the ack policy and the retry budget. It is safe for
// concurrent use; one Client per process and principal is the intended
// shape.
//
// Txn runs a conditional transaction on the principal's keys once, and
// Get and Range read them (linearizable on the leader, or read-your-writes
// from any replica at a MinLSN: FromReplica sends such a read to a
// follower first, and on BEHIND it ends at the leader); Submit runs a request through the node's
// handler once and answers its Result; Status asks what the leader's
// ledger knows of a request ID. Ops builds the default payload
// (put/add/delete operations) that a node without its own handler maps to
// events.
//
// # Errors
//
// Every error a call returns is one of these (errors.Is), and says what to
// do: ErrConflict (the ID was used for another request: use a new one),
// ErrRefused (the request is invalid or the node will not run it: fix it),
// ErrDenied (the certificate names no client: fix the deployment),
// ErrOutcomeUnknown (it may have run: retry with the same ID),
// ErrUnavailable (it did not run: retry later), ErrClosed, or the
// caller's context error (with ErrOutcomeUnknown if it may have run).
//
// # Invariants
//
//  1. Every attempt of a Submit carries the caller's request ID, payload
//     and action unchanged: a retry is the same request, so the node runs
//     it at most once and answers a retry with the recorded outcome.
//  2. A Submit that returns no error got OK or Replay from the node that
//     leads, under the ack policy asked for; the Result is that answer.
//  3. ErrOutcomeUnknown is returned only when the budget (Attempts,
//     RetryTimeout, the caller's context or Close) ends after an attempt
//     that may have run: one whose request reached a node (gRPC had a
//     transport for it) and got no answer, or got Unavailable or InFlight.
//     RetryTimeout does not cut the attempt in flight (its AttemptTimeout
//     does), so whether a call ends unknown does not depend on where in
//     an attempt the budget happened to end; the caller's context and
//     Close do cut it.
//     The request may have taken effect or not; retrying with the same ID
//     tells which and never runs it twice. A call none of whose attempts
//     could have run ends with ErrUnavailable: it did not run.
//  4. Conflict, Refused and a refused identity are final: the client does
//     not retry them (ErrConflict, ErrRefused, ErrDenied); retrying the
//     same request will not change the answer.
//  5. NotLeader, SessionExpired, InFlight, Unavailable and transport
//     errors are retried inside the budget. A NotLeader naming the leader
//     sends the next attempt there (the address joins the known ones)
//     unless it is stale (invariant 9); one naming none or a stale one, an
//     Unavailable and a transport error send it to the next known address. An attempt waits a jittered exponential backoff
//     (Options.Backoff, gRPC's backoff.Config) before it goes back to an
//     address already tried since the last wait, and before it retries
//     InFlight, so that the client never spins. Options.Attempts counts
//     the attempts that reached a node able to take the request; looking
//     for the leader (NotLeader answers, nodes not reached) is bounded by
//     RetryTimeout alone, so a call rides out a failover shorter than it.
//  6. One session per Client, opened on first use (OpenSession) and
//     renewed with OpenSession{Near: current} — which places the new
//     session in the current one's shard, so a request retried under the
//     renewed session meets its own ledger entry — when a node answers
//     SessionExpired (nothing was claimed; the attempt is retried with the
//     same request ID) and before the horizon the node gave: when the
//     session has been idle for more than half of it. Concurrent calls
//     share one renewal. The caller never sees a session.
//  7. After Close every call returns ErrClosed; calls in progress end with
//     ErrClosed, and with ErrOutcomeUnknown too when invariant 3 says so.
//  8. Every Client of one principal opens its Submit session in the same
//     shard: its OpenSession names as Near a fixed ID derived from the
//     principal's name (Options.Principal, or the certificate's
//     oncewal://client/NAME). A node's ledger is per shard, and a Submit's
//     shard is its session's; so a Submit retried by another process of
//     the same principal — after a crash or a restart, with the same
//     request ID — meets its own ledger entry and does not run twice. The
//     price: one principal's Submits are logged in one shard. Its Txns are
//     not: each goes to its keys' shard (invariant 10), which is where a
//     retry from any process looks, so they spread over every shard.
//  9. The client remembers the highest leader epoch an answer carried (an
//     OK, a Replay, a Status, a session opened, a NotLeader). A NotLeader
//     naming a leader at a lower epoch comes from a node that has not yet
//     heard of the newer leader: its redirect is neither followed nor
//     remembered, and the attempt goes to the next known address instead.
//     A NotLeader from the node calls start at makes the client forget it;
//     with no leader known, calls start at the first address of
//     Options.Addrs and go round the known ones. Client.Leader reports the
//     node calls start at and that epoch. Epochs only grow, so a stale
//     redirect can only lead back to a deposed leader.
//  10. Keys belong to the principal, not to a session (Txn, Get, Range):
//     a transaction goes to the session of its keys' shard — the shard
//     kvroute computes from the shard count the node's OpenSession
//     reply gave — one per shard the Client uses, opened with
//     OpenSession{shard} on first use and renewed as invariant 6 says.
//     A WRONG_SHARD answer (nothing ran) teaches the count anew and the
//     attempt is retried in the right shard.
package client

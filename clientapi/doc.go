// Package clientapi is the server side of the client service,
// oncewal.client.v1.Client (the wire contract is proto/oncewal/client/v1/
// client.proto, and its generated Go code package clientv1): a
// Service runs a client's request once on a *leader.Leader and answers it;
// for a node that does not lead, Replica serves reads at a MinLSN from its
// own stores and answers the rest NOT_LEADER, and NotLeader answers every
// call NOT_LEADER.
//
//	svc, err := clientapi.New(l, nil)
//	srv, err := grpctransport.Listen(addr, &grpctransport.ServerOptions{TLS: t,
//		Services: []grpctransport.Service{svc.GRPC()}})
//
// # Who is asking: the scope
//
// A request's ledger scope is its caller's authenticated identity, the
// name of the client certificate's oncewal://client/NAME URI SAN
// (grpctransport.PeerIdentity): two clients may use the same request IDs
// and never replay or collide with each other's (nothing on the wire names the scope).
// A certificate of another role (a follower's, a node's) is refused with
// the gRPC status PermissionDenied, and a caller without an identity with
// Unauthenticated, before the request is looked at: these are faults of
// the caller's deployment, not answers about a request, and a client must
// not retry them as it retries Unavailable, nor take them for Refused (the
// request is bad). A replica's certificate is refused so that a node can
// never write as a client. Options.Insecure (a plaintext server: loopback
// tests only) takes the name from the gRPC metadata oncewal-principal
// (PrincipalMetadata) when the caller has no certificate.
//
// # Submit
//
// The request's shard is its session's (leader.Leader.For). The service
// claims the request ID at the shard's door (leader.Shard.Claim, waiting
// while another attempt of the same ID runs, for as long as the call's
// context lasts), then:
//
//   - Fresh: the handler (Options.Handler; DefaultHandler maps the default
//     payload, a clientv1.Ops message, to one event per op in the request's
//     session) gives the events and the outcome — while it runs, the claim
//     is extended every Options.Heartbeat, so a slow handler keeps its
//     request ID; Shard.Commit logs them with the ledger's complete record
//     in one batch; the service waits for the ack policy and answers OK
//     with the batch's LSN, the epoch and the outcome. A handler error, or
//     events of a session of another shard, releases the claim and answers
//     Refused with the error's text.
//   - Replay: the service waits for the ack policy up to the shard's
//     applied LSN at that moment, which covers the original's batch (the
//     ledger shows an outcome only once its batch is applied), and answers
//     Replay with the recorded outcome; that LSN is the reply's.
//   - Conflict, SessionExpired, Refused, Unavailable: from the claim's or
//     the commit's error (Decide, a pure function of it).
//
// A request the node cannot decode, or whose session ID is not 16 bytes,
// is the gRPC status InvalidArgument.
//
// # Txn: the principal's key space
//
// Txn runs a conditional transaction (package kv: If compares, Then ops,
// Else ops — the wire's success and failure) on the caller's keys, which
// belong to the principal, not to a session: every client of the
// principal, in any process, after any restart or failover, reads and
// writes the same keys. Its keys must share one shard (kv.Txn.Shard:
// kvroute, with hash tags), and its session must be of that shard, else
// WRONG_SHARD with the keys' shard, before anything is claimed (a client
// keeps one session per shard it uses: OpenSession with shard). It is
// claimed and answered as Submit; the commit resolves the transaction
// (kv.Resolve, under leader.Shard.CommitResolved) against the state after
// every batch logged before it, and logs the resolved puts and deletes
// with the complete record, whose outcome is the clientv1.TxnResult (which
// branch ran, what each op read or wrote) a retry replays.
//
// # Rejections
//
// A business rule's refusal is a result, recorded: a Handler's
// *RejectedError (or a Validator's, under store.ErrRejected), and the key
// space's own (an add to a key that is no counter, an overflow) are logged
// as the request's ledger failure (idempotency.Ledger.Fail, for the
// ledger's replay window), answered REJECTED with the code and detail,
// answered the same to every retry of the ID without running anything,
// and reported by Status. A RejectedError with Transient, or any other
// handler error, is refused as before: nothing recorded, a retry runs
// again.
//
// # Reads
//
// Get and Range read the caller's keys on the leader. Each shard's read
// is one Pebble snapshot of the leader's store at its applied LSN, taken
// once the shard has applied the request's MinLSN (else BEHIND after
// Options.ReadWait, saying how far behind); the answer waits until that
// LSN is acknowledged under Options.MinAck and is given only while
// Options.Leading says this node leads. A write is acknowledged only after
// the leader applied it, so a read sees every write acknowledged before
// it began and nothing a failover could undo: a read of one shard is
// linearizable. A Range whose prefix holds a complete hash tag reads its
// one shard; any other reads every shard, each at its own LSN (reported
// per shard), and is linearizable shard by shard, not as a whole.
//
// # Replica reads
//
// A replica that does not lead (Replica: a node while it follows, oncewal
// follower --client-listen) serves a Get whose min_lsn is set, and a
// Range with a min_lsn for every shard it reads, from its own store of
// each shard: once the shard's applied position (the synced one,
// store.Store.Position) reaches min_lsn — waiting up to
// ReplicaOptions.ReadWait (default DefaultReadWait, the leader's) — it
// reads one snapshot (store.KVRead) and answers OK with the LSN read at,
// at or past min_lsn, and the snapshot's epoch. A shard still behind
// after the wait answers BEHIND with its applied LSN, and a message naming
// the applied LSN, the minimum and the difference, and the leader's
// address: the client moves on to another replica or the leader. A read
// without min_lsn (for a Range: for any shard it reads) is linearizable,
// which only the leader can serve: NOT_LEADER with the leader's address,
// as is every Txn, Submit, Status and OpenSession. The caller is named as
// on the leader (a client certificate; Insecure metadata for tests).
//
// What a replica read guarantees: read-your-writes, and monotonic reads
// as far as the client carries its MinLSN forward — every answer reflects
// every write of the key's shard up to min_lsn (the LSN a Submit or Txn
// answered), and the lsn it reports; it is not linearizable: writes
// acknowledged after min_lsn may be missing, so a read on a replica may
// be older than one on the leader that began before it.
//
// A follower's store is pipelined: a batch is committed to Pebble before
// its sync, so a snapshot may hold rows of batches not yet synced on the
// replica (the read's lsn may be past its synced position; min_lsn is
// waited for on the synced position). That does not weaken
// read-your-writes: followers receive only batches already synced in the
// leader's WAL, and a replica that crashes before its own sync receives
// them again. Those rows, like every row past min_lsn, may however be of
// writes not yet acknowledged under the cluster's ack policy: a replica
// read may show another client's write that a failover later undoes
// (never one acknowledged under the policy the election's fencing
// covers). A client that needs only acknowledged state reads on the
// leader.
//
// Terms: an LSN alone does not name a history. A replica of an older
// term that holds a tail the new leader does not (diverged, not rebuilt
// yet) may have applied past a min_lsn of the new term without holding
// the write. So a replica whose snapshot's epoch is below the leader
// epoch it knows (Replica's where) answers BEHIND, and a reply's epoch is
// its snapshot's: a client must not take an answer whose epoch is below
// that of the write whose LSN it gave (the Go client moves on when it is
// below the highest epoch it has seen).
//
// # Leadership: MinAck and Leading
//
// A node that is elected (package node) runs a Service while it leads and
// NotLeader while it follows. Two options make that sound.
//
// Options.MinAck is the cluster's ack policy as the service's floor: a
// request asking for a weaker one waits for MinAck all the same (its OK
// or Replay then says so in its Ack and its Message). The fencing after an
// election hears back from enough followers that every set the policy
// could have acknowledged meets the set it heard; a write acknowledged
// under a weaker policy could escape it.
//
// Options.Leading says whether the node's leadership may have ended (its
// lease's deadline passed): a deposed leader must not acknowledge. The
// service asks it before a Submit claims anything, and again after the
// ack wait, the last thing before OK or Replay — a window the lease's
// margin must cover remains between that check and the reply's arrival.
// When it says no:
//
//   - Before anything ran (a Submit before its claim, a Status, an
//     OpenSession): NotLeader, the leader unknown. The wire's NotLeader
//     means "nothing ran"; the client moves on with the same request ID
//     and, if its budget ends, reports that the request did not run.
//   - After the commit (or a replay's wait): Unavailable, the outcome
//     unknown, saying to retry with the same request ID at the current
//     leader. It is not NotLeader, though this node no longer leads,
//     because the request ran here: NotLeader would tell the client it did
//     not, and a client whose budget then ended would report a request
//     that may survive as one that never ran. Whether it survives is the
//     new leader's to say: its ledger replays it, or it runs the retry.
//
// # Status and OpenSession
//
// Status looks the request ID up in the ledger of the shard of the session
// the StatusRequest names, as the leader holds it now (not waiting for any
// ack policy). OpenSession logs an OpOpen event for a new random session
// and answers it with the retention horizon and the epoch; with Near, the
// new session is drawn in Near's shard, so that a request retried under a
// renewed session meets its own ledger entry.
//
// # Invariants
//
//  1. The scope of every ledger call is the caller's authenticated client
//     name; nothing on the wire names it.
//  2. OK and Replay are answered only once the answer's batch is durable
//     under the request's ack policy or Options.MinAck, whichever is
//     stronger: in the leader's WAL (AckLeader), and acknowledged by the
//     followers the policy asks for; and only while Options.Leading says
//     this node leads, asked after that wait.
//  3. A request's effects and its outcome are logged in one batch
//     (Shard.Commit); a request that answers anything but OK logged no
//     effect of its own, except Unavailable after the commit (the ack wait
//     ended), whose message says the outcome is unknown and to retry with
//     the same request ID.
//  4. A claim on a session that can no longer log is refused before
//     anything is claimed (SessionExpired); a handler's or a commit's
//     failure releases the claim, so a retry runs again — but for a
//     rejection, which is recorded instead (invariant 9).
//  5. A session opened with Near routes to Near's shard; without, to the
//     shard asked for.
//  6. A node that does not lead (NotLeader, Replica) runs nothing: it
//     answers every call NotLeader, with the leader's address and epoch
//     when it knows them — but for Replica's reads at a MinLSN
//     (invariant 10).
//  7. A Service whose Options.Leading reports an error answers as a node
//     that does not lead: NotLeader (leader unknown) where nothing ran,
//     Unavailable with the outcome unknown where the request ran; it claims
//     nothing new meanwhile.
//  8. A read answers only what its shard applied at or past the read's
//     MinLSN and is acknowledged under Options.MinAck, while
//     Options.Leading says this node leads.
//  9. A rejection is recorded before it is answered, and a recorded
//     rejection is answered to every retry of its request ID; a request
//     rejected logged no effect of its own.
//  10. A replica answers a read OK only from one snapshot of its own store
//     of each shard read, at an applied LSN at or past the read's MinLSN
//     for that shard and at an epoch at least the leader's as it knows
//     it; else BEHIND (after at most ReadWait) or NOT_LEADER (no MinLSN).
package clientapi

// Package follower is the embeddable oncewal follower node for one shard: it
// opens a Pebble v2 store, wires the session HWM tracker, the idempotency-key
// window and the segment receiver, serves a transport, and recovers after a
// restart or a crash.
//
//	f, err := follower.Open(dir, &follower.Options{Shard: 3})
//	go f.Serve(ctx, dialer)      // redials, resumes from the durable position
//	...
//	f.Close()                    // stops Serve, flushes, closes the store
//
// # Recovery
//
// Everything the receiver decides commits in one Pebble batch per shipped
// batch: the applied state, the HWM advances, the window journal, the applied
// LSN and the leader epoch. Reopening the directory therefore resumes from a
// consistent cut: the position and epoch come from the m/ keys, HWMs are read
// through from h/ on demand, and the window is rebuilt from the journal (w/j/),
// after a clean Close and after a crash alike. No snapshot is needed: the
// journal is written with each batch, so the window a follower restarts with
// is exactly the window it had at its last commit.
//
// # Store failure
//
// Pebble v2 treats a failed WAL write or sync as fatal and reports it through
// Logger.Fatalf, whose default implementation exits the process. The follower
// installs replication.FatalLogger, which panics with *replication.FatalError
// on the committing goroutine; the receiver recovers it, returns
// replication.ErrStoreFailed, and refuses every later batch. Serve returns that
// error. The embedder must Close the follower and Open it again: the reopened
// store holds either the whole failed batch or none of it, and the leader
// resends from the position the follower reports in its handshake.
//
// # Pebble key layout
//
// One store per follower shard. Every value begins with a one-byte format
// version (currently 1).
//
//	h/<session ID:16>              session HWM record (package session)
//	h/...                          the tracker's WAL clock (package session)
//	s/<session ID:16><user key>    session state rows (package session)
//	m/position                     applied LSN, u64 LE
//	m/epoch                        highest committed leader epoch, u64 LE
//	m/format                       store format (1); marks an oncewal store
//	w/j/<last LSN:8 BE>            window journal: the batch's recorded keys
//	l/r/<len u8><scope><key>       request-ledger entry (package idempotency)
//	l/x/<expires:8 BE><len><scope><key>  ledger expiry index, for the sweep
//	l/clock, l/sweep, l/probe      ledger WAL clock, last sweep time, probe
//
// # Request ledger and promotion
//
// The default applier also applies the request-ledger records a leader logs
// (wal ops claim, complete, release, fail) into the l/ table, in the same
// Pebble batch as the effects they travel with. Promote turns a follower into
// its shard's leader (replication.LedgerLog) with a higher epoch: its log
// continues at the applied LSN + 1, the new epoch is persisted first (the old
// leader's batches are refused from then on), and its Ledger answers from the
// replicated table — requests completed on the old leader replay, claims it
// left in flight free themselves when their leases end on the WAL clock. A
// request the old leader completed but never shipped is lost with it, effect
// included, so its retry executes once on the new leader; with asynchronous
// replication the client may have seen the lost answer (the replay window of
// request-level idempotency is therefore bounded by what was replicated, and
// by the ledger's TTL). TestFailoverRequestsExactlyOnce proves this over 120
// seeds; ONCEWAL_LONG=1 runs 2000, ONCEWAL_FAILOVER_SEEDS=n runs n,
// ONCEWAL_FAILOVER_SEED=n replays one.
//
// # Many shards in one process: Node
//
//	n, err := follower.OpenNode(dir, []uint32{0, 1, 2, 3}, &follower.NodeOptions{})
//	go n.Serve(ctx, func(shard uint32) replication.Dialer { return dialer })
//	n.Apply(batch)   // routed by the batch header's shard
//	n.Stats()        // per shard and totals
//	n.Close()
//
// A Node runs one Follower per shard, each in its own store directory
// dir/shard-NNNN (ShardDir) with its own applied position, epoch, HWMs and
// window; the Follower code, key layout and guarantees above hold per shard
// unchanged. Node.Apply reads the shard from the batch header and refuses a
// shard the node does not serve with replication.ErrWrongShard before any
// store is touched. Node.Serve runs every shard's Serve loop on its own
// goroutine, so shards apply in parallel and a stalled link holds up only its
// shard. A shard whose store fails (replication.ErrStoreFailed) is closed and
// reopened from disk on its own, with backoff, while the others keep
// applying. The window bound (Options.WindowCapacity) holds per shard: the
// node holds at most shards × capacity keys, and NodeStats reports the
// total, including WindowBytes, the memory the windows hold.
//
// # Store layout: one Pebble store per shard
//
// The alternative was one shared store with a shard prefix on every key
// (h/, s/, m/, w/ per shard). Measured on this machine (2 cores, virtio disk,
// on disk in t.TempDir, Sync per batch; raw Pebble, no oncewal code; median
// of 10 runs, taken while other jobs loaded the machine, so single runs vary
// ±50%):
//
//	go test ./follower -run '^$' -bench StoreLayout -benchtime 300x -count 5
//
//	synced 1000-key batches, N goroutines   1 store (shared)   N stores
//	N=1                                        207k keys/s     265k keys/s
//	N=2                                        230k keys/s     304k keys/s
//	N=4                                        257k keys/s     428k keys/s
//	N=8                                        295k keys/s     506k keys/s
//
// (At N=1 both layouts are the same single store; the difference there is
// noise, and it bounds what the other rows can claim.) The shared store
// serialises every shard's commits through one WAL and one commit pipeline,
// so concurrent shards queue behind each other's write and fsync; group
// commit recovers only a little of it (+40% from 1 to 8 writers). Separate
// stores write and fsync their WALs independently, so the device overlaps
// them (+90% from 1 to 8). Beyond speed, a store per shard is what lets a
// failing shard fail alone: Pebble wedges a whole store on a WAL error, so a
// shared store would take every shard down with it, and one shard's
// compaction debt or corruption would be every shard's. It also reuses the
// single-shard Follower as it is — no shard prefix threaded through the
// session and replication key spaces — and a shard can be moved to another
// node by moving its directory. The cost is per-store overhead: a memtable
// (4 MiB default), a block cache and background goroutines per shard, which
// is why a node should serve tens of shards, not thousands.
//
// # Throughput with many shards
//
//	go test ./follower -run '^$' -bench NodeApply -benchtime 300x -count 5
//
//	fresh 1000-event batches, Sync per batch, on disk, one goroutine per shard
//	shards=1   251k events/s      shards=4   220k events/s
//	shards=2   272k events/s      shards=8   272k events/s
//	(median of 10 runs; sync=no: 292k, 247k, 243k, 291k)
//
// Throughput does not grow with shards on this machine, and the benchmark's
// cpu-ms/s metric says why: applying costs about 2 µs of CPU per event
// (decode, HWM and window checks, the state rows, Pebble's memtable insert,
// WAL write and background flushes), and the process got about half a core
// throughout (cpu-ms/s ≈ 430–590 at every shard count, with other jobs
// running). With fsync waits not the limit (sync=no is no faster), extra
// shards can only add parallelism the CPU cannot supply. What shards do buy
// is overlap: a single shard alternates CPU work with its fsync wait, while
// with two or more each shard's fsync hides behind another shard's CPU work,
// so on an otherwise idle 2-core machine one would expect at most ~2× from 1
// to 2 shards (not measured here: the machine was never idle) and nothing
// beyond the core count. Scaling further needs cores (or more nodes), not
// shards.
//
// # Invariants
//
//  1. An event is applied at most once: after its batch commits, its SeqNo is
//     at or below its session's HWM, its LSN at or below the applied position,
//     and its key in the journal; none of them moves backwards.
//  2. No event is skipped: batches apply in LSN order (a batch beyond
//     position+1 is refused) and a SeqNo gap refuses the whole batch.
//  3. State, HWMs, journal, position and epoch change in one Pebble batch.
//  4. In-memory HWMs, window, position and epoch change only after that batch
//     committed.
//  5. A batch from an epoch below the highest committed one is refused before
//     it touches anything.
//  6. (Node) A shard's batches touch only that shard's store; a batch for a
//     shard the node does not serve touches none.
package follower

// Package store is one shard's oncewal store: a Pebble v2 store with its
// recorded identity, the session HWM tracker, the idempotency-key window, the
// session state and the request-ledger table, wired to the Receiver that
// applies shipped WAL batches to them exactly once. Both roles stand on it: a
// follower serves a Store from its leader (package follower), a leader
// applies its own log to the Store of each shard it leads (package leader).
//
//	st, err := store.Open(dir, &store.Options{Shard: 3})
//	res, err := st.Apply(batch)  // the raw bytes wal.AppendBatch made; res.Ack goes back
//	st.Close()                   // flushes, closes the store
//
// The Store is the seam both roles use: Open with identity, layout, the
// free-space guard and recovery; Apply and Start (pipelined) of shipped
// batches; Position and Hello (what a follower states when it connects);
// Promise (a fencing leader's epoch, refused below from then on); the
// read API of what it holds (State, LedgerTable, Tracker; the principal
// key space: KVGet, KVRange, KVRead at one snapshot with its applied LSN,
// KVReader for the leader's kv.Resolve; kv.go); Stats; Close.
//
// # The Receiver's rules
//
// For each batch, before anything is written: verify it (checksums, version,
// limits); refuse a foreign shard (ErrWrongShard) and an epoch lower than the
// highest committed or the one promised to a fencing leader (ErrStaleEpoch,
// fencing a deposed leader; Promise, promise.go); discard a batch
// wholly at or below the applied LSN; refuse one that starts past applied+1
// (ErrOutOfOrder). Then per event: the session's SeqNo HWM (session.Tracker)
// discards duplicates, skips closed and too-old sessions, and refuses the
// whole batch on a SeqNo gap (ErrSeqGap); the idempotency-key window
// (idempotency.Store, plus the keys seen earlier in the same batch) discards
// recently seen keys — when such an event's SeqNo was fresh the HWM still
// advances, so the next SeqNo is not a gap. Survivors go to the Applier.
//
// What a batch costs. Before deciding, the receiver touches every event's
// HWM cache slot and window lines (session.TrackerTx.Prefetch,
// idempotency.Store.Prefetch) so the batch's cache misses overlap instead
// of stalling each check. The Applier gets an indexed batch (its read view)
// unless it implements BatchReader and says it does not read this one: the
// default SessionApplier reads only for an Add, so a batch without Adds is
// written through a plain batch and Pebble indexes nothing. What one batch
// of n fresh events of distinct sessions writes, in one Pebble batch: n
// state rows; one HWM delta of ~21 B per session changed or carried
// forward (session/doc.go, "Amortised HWM persistence"), rarely an HWM row;
// one window journal value of 16 B per keyed event; the position, the last
// batch's identity and the clocks. Measured with the default options, 100K
// uniform sessions, 1000-event batches (bench Receiver/fresh): 187 WAL
// bytes and ~1.02 Pebble keys per event, against 203 and ~1.28 before the
// log carried old sessions forward in compact entries; the state rows alone
// are 127 bytes (Receiver/raw-ingest). A batch of client retries writes no
// state row: 59 WAL bytes per event (was 74).
//
// # Recovery
//
// Everything the receiver decides commits in one Pebble batch per shipped
// batch: the applied state, the HWM advances, the window journal, the applied
// LSN and the leader epoch. Reopening the directory therefore resumes from a
// consistent cut: the position and epoch come from the m/ keys, HWMs are read
// through from h/ on demand after the HWM log (hd/) is replayed (its sessions
// pinned in memory), and the window is rebuilt from the journal (w/j/),
// after a clean Close and after a crash alike. The journal is written with
// each batch and compacted into a snapshot of the window every ~2× capacity
// keys, so the window a follower restarts with is exactly the window it had
// at its last commit (journal.go explains why the replay is
// exact).
//
// # Store identity and opening
//
// A store records its kind, shard and the options that change what it
// decides (window capacity, retention horizon) when it is created; Open
// refuses a store recorded otherwise (*MismatchError, like Pebble's OPTIONS
// check), a directory that is not a store (*LayoutError: a node, leader or
// WAL directory, unrelated files) and a Pebble store that is not oncewal's
// (store.ErrNotStore) — all before anything on disk changes. SetRecordedOptions
// changes a recorded option where that is safe (identity.go says which and
// why).
//
// # Opening a store that cannot be opened
//
// Open never hangs on a store it cannot open. Pebble's Open replays the WAL
// into memtables and waits for them to be flushed; when the flush fails
// (disk full, I/O errors) Pebble reports a background error and retries the
// flush at once, for ever, and Open waits for ever — burning a core and
// ignoring the embedder. So pebble.Open runs on its own goroutine, and the
// store's EventListener counts every background error, logs it (once, then
// at most every 30s), and sleeps a doubling backoff (10ms to 1s, reset by a
// flush or compaction that succeeds) before Pebble retries, so a failing
// disk is retried slowly instead of in a hot loop. OpenContext returns
// store.ErrUnavailable, wrapping the error (errors.Is(err, syscall.ENOSPC)
// works), after openGiveUp background errors in a row during the open (a
// retry can succeed: a failed flush's partial file is deleted, freeing its
// space), and ctx.Err() when ctx ends first.
//
// An open that was given up keeps retrying in the background (Pebble offers
// no way to stop it) and holds the store's lock meanwhile. A later Open of
// the same directory, on the same vfs.FS, in this process joins it instead
// of failing on the lock: it gets the store if a retry succeeds, else the
// error again after openGiveUp more failed retries (a few seconds at the
// 1s backoff cap). An open that succeeds with nobody waiting closes the store
// again, so a freed disk leaves no store open behind anyone's back. When
// Pebble declares the open fatal instead (storeLogger), the open is dead:
// every later Open in this process gets store.ErrUnavailable at once.
//
// Before any of that, Open decides from the directory's entries what it
// holds (DirLayout) and, for an existing store, reads its identity through a
// read-only Pebble open on a filesystem that refuses every write, so a
// refusal — a node or WAL directory, a directory of unrelated files, a
// store of another shard or with other options — changes nothing on disk:
// no LOCK file, no new WAL, no flush. A new store that fails to open is
// removed again (the directory if Open created it, else what Pebble wrote in
// the empty directory).
//
// # Writing on a full disk
//
// Pebble has no graceful answer to a full disk, so a store stops before
// it: below Options.MinFreeBytes of free space (default 64 MiB; the
// internal/diskguard reading, at most every 100 ms) no batch is applied —
// Apply and Start refuse it with ErrDiskFull, a follower's Serve holds
// it and waits for room (Stats.DiskFull, metric store_disk_full, /readyz
// fails) — and it goes on by itself when there is room (TestMinFreeBytes).
//
// If the disk fills anyway (the guard off, another process writing), the
// failing flush comes while the store serves: Pebble then holds
// the next commit that needs room in its memtables (a write stall), and
// Flush and Close wait for the flush too — all without a deadline, for as
// long as the disk stays full. A follower stays responsive
// (TestServeOnFullDisk): Serve starts each batch on its own goroutine and
// stops waiting for it when its context ends (the stuck batch is finished
// in the background, in pipeline order, and holds back every later batch);
// Close flushes and closes on its own goroutine and, after a few background
// errors in a row, returns ErrStalled wrapping the disk's error — the
// store then closes itself if the disk recovers, else it stays open until
// the process exits. Nothing acknowledged is lost: every acknowledged
// position is synced in Pebble's WAL, and an abandoned store is recovered
// at the next Open like a crashed one. Stats.WriteStalled (metric store_write_stalled)
// shows the stall; with background errors /readyz fails and the first
// stall is logged at Error.
//
// # Store failure
//
// Pebble v2 treats a failed WAL write or sync as fatal and reports it through
// Logger.Fatalf, whose default implementation exits the process. Every store
// installs FatalLogger, which panics with *FatalError
// on the committing goroutine; the receiver recovers it, returns
// ErrFailed, and refuses every later batch. A failed WAL
// sync of a pipelined batch (below) comes back from its Pending.Wait, with
// the same outcome, for it and every batch started after it. A follower's Serve
// returns that error. The embedder must Close the store and Open it again: the reopened
// store holds either the whole failed batch or none of it, and the leader
// resends from the position the store reports in its hello.
//
// # The Applier contract
//
// An Applier (applier.go) is the embedder's state machine. The leader runs
// it on its own store and every follower on its own, each over the same
// log, so the replicas agree only if it keeps this contract (invariant 9):
//
//   - Deterministic: the same store state and the same events make the same
//     writes, on every replica and every run. Time is the event's WAL time
//     (Event.Time), never the wall clock; no randomness, no map order, no
//     reads but through b, no state outside the store.
//   - A business-rule rejection (an overdraft, a name taken) is a result,
//     never an error. Two ways, one example each:
//     (a) Before it is logged: the Applier also implements Validator. The
//     leader (LedgerLog) runs Validate after stamping an append and before
//     writing it; a refusal returns ErrRejected wrapping the reason to the
//     caller and logs nothing — no WAL bytes, no SeqNo consumed, no HWM
//     advanced: the session's next append gets the same SeqNo (package
//     follower's Example_rejectedBeforeLogging; leader's
//     TestValidatorRejects). Validate judges the store
//     as it stands after every batch logged before this one, exactly: the
//     store lags the log by the batches between their WAL write and their
//     local apply, so a log whose Applier is a Validator appends one batch
//     at a time (stamp, validate, write, sync, apply) and gives up group
//     commit — every append waits for one fdatasync of its own (8
//     goroutines of one-event appends, on disk here: 1.7–2.0K appends/s,
//     against 3.3–4.9K without a Validator). Judging
//     against the applied state alone would let two concurrent
//     withdrawals pass against the same balance; a speculative view of the
//     batches in flight would need each one's writes kept and dropped in
//     LSN order beside the store, a second receive path. An embedder that
//     needs the throughput puts more events in each append or uses (b). A
//     Commit refused this way leaves the claim with the caller: Fail it
//     (the rejection replays to retries) or Release it. Followers never
//     run Validate: Apply must accept what Validate accepted on the same
//     state.
//     (b) After it is logged: Apply writes its own record of the rejection
//     (in the Applier's key space) and returns nil; every replica records
//     the same rejection, and clients read the outcome from the store
//     (package follower's Example_rejectionRecorded).
//   - An error from Apply is a failure, not an answer — a read of b that
//     failed, a bug — and a panic is recovered at the call and counts as
//     one (ErrApplierPanic). Either refuses the batch with ErrApply and
//     commits nothing. Deterministic, the Applier would fail the same batch
//     again, so the shard stops instead of retrying: a LedgerLog fails
//     (ErrLogFailed wrapping ErrApply; every later append too), a
//     follower's Serve returns ErrApply (logged once at Error, counted in
//     Stats.ApplyErrors) and a follower.Node keeps that shard down. The
//     way back is the same everywhere: fix the Applier and reopen. The
//     failed batch is in the leader's synced WAL, so reopening the leader
//     (OpenLedgerLog, leader.Open) re-applies it and serves, and a
//     restarted follower gets it again from its durable position; with
//     the Applier still broken, the reopen refuses with the same ErrApply
//     and commits nothing of the failed batch (leader's
//     TestApplierFailsThenFixed, TestValidatePanics; follower's
//     TestNodeApplierFailure).
//
// # Pebble key layout
//
// One store per follower shard. Every value begins with a one-byte format
// version (currently 1). The prefixes are named once, in internal/keyspace;
// a custom Applier may write anything for which IsReserved is false (h/,
// hd/, m/, w/, l/ are reserved; s/ and k/ are the default Applier's).
//
//	h/<session ID:16>              session HWM record (package session)
//	h/...                          the tracker's WAL clock (package session)
//	hd/<seq:8 BE>                  HWM log: one batch's HWM changes (package session)
//	s/<session ID:16><user key>    session state rows (package session)
//	k/<len u8><principal><key>     principal key-space rows (package kv): format 1,
//	                               version u64 LE, modLSN u64 LE, value
//	m/position                     applied LSN, u64 LE
//	m/epoch                        highest committed leader epoch, u64 LE
//	m/format                       store format (1); marks an oncewal store
//	m/identity                     kind, shard, window capacity, retention horizon
//	                               (keyspace.MetaIdentity; written when the store is created)
//	m/epoch_start                  first LSN of the epoch this store leads (after Promote)
//	m/epoch_prev                   the batch ending just before m/epoch_start (as m/last_batch)
//	m/slot/<follower ID>           a leader's replication slot for that follower (package leader;
//	                               leader-only: deleted when a new epoch starts, never
//	                               inherited by a rebuilt store — keyspace.LeaderOnly)
//	m/leader                       the epoch at which a leader raised this store's epoch: the
//	                               mark that it is a leader's store (leader.Open refuses a
//	                               store without it; leader-only, like m/slot/)
//	m/promise                      the highest epoch promised to a fencing leader, u64 LE
//	                               (Promise; replicated: a rebuild keeps the higher of
//	                               its own and the snapshot's)
//	m/last_batch                   the batch ending at m/position: that LSN u64 LE, its
//	                               epoch u64 LE and header CRC u32 LE (wal.BatchRef,
//	                               sent in the hello; absent or for another LSN = unknown)
//	w/j/<last LSN:8 BE>            window journal: the batch's recorded keys, in
//	                               recording order (a compacted entry starts with
//	                               the whole window)
//	l/r/<len u8><scope><key>       request-ledger entry (package idempotency)
//	l/x/<expires:8 BE><len><scope><key>  ledger expiry index, for the sweep
//	l/clock, l/sweep, l/probe      ledger WAL clock, last sweep time, probe
//
// # Store layout: one Pebble store per shard
//
// The alternative was one shared store with a shard prefix on every key
// (h/, s/, m/, w/ per shard). Measured on this machine (2 cores, virtio disk,
// ext4, in t.TempDir, Sync per batch; raw Pebble, no oncewal code; median
// of 3 runs while the machine was quiet, load ≈ 3):
//
//	go test ./follower -run '^$' -bench StoreLayout -benchtime 300x -count 3
//
//	synced 1000-key batches, N goroutines   1 store (shared)   N stores
//	N=1                                        835k keys/s     815k keys/s
//	N=2                                        910k keys/s     923k keys/s
//	N=4                                        755k keys/s    1169k keys/s
//	N=8                                        911k keys/s    1250k keys/s
//
// (At N=1 both layouts are the same single store; the gap there is noise.
// Earlier runs under load ≈ 8 gave the same ranking: 207k/230k/257k/295k
// shared vs 265k/304k/428k/506k per shard, median of 10.) The shared store
// funnels every shard's commits through one WAL and one commit pipeline, so
// writers queue behind each other; separate stores write and sync their WALs
// independently (+37–55% at 4–8 shards). Beyond speed, a store per shard is
// what lets a failing shard fail alone: Pebble wedges a whole store on a WAL
// error, so a shared store would take every shard down with it, and one
// shard's compaction debt or corruption would be every shard's. It also
// reuses the single-shard Follower as it is — no shard prefix threaded
// through the session and replication key spaces — and a shard moves to
// another node by moving its directory. The cost is per-store overhead:
// memtables (below), caches and background goroutines per shard, so a node
// should serve tens of shards, not thousands.
//
// # Memory per shard: the memtable
//
// Options.MemTableSize (default 32 MiB; --memtable-size) sizes each store's
// memtable. A shard that writes holds about two of them — the one being
// filled and the one being flushed, or kept by Pebble for reuse — so 64 MiB
// per writing shard at the default (Pebble starts at 256 KiB and doubles
// per memtable up to the size, so an idle shard holds little), and up to
// MemTableStopWritesThreshold (2) queued memtables plus the one being
// filled while flushes fall behind. A node of 30 writing shards: ~2 GiB;
// set it lower for more shards (16 MiB halves the memory and keeps about
// half of the CPU saved on fresh events, four fifths on retries; below).
// Pebble counts memtables against its block cache, so the store's
// CacheSize is 8 MiB of blocks on top of two memtables (72 MiB at the
// default) unless PebbleOptions sets Cache or CacheSize: with Pebble's
// 8 MiB, two memtables of 4 MiB or more left no block cache at all.
//
// Why not Pebble's 4 MiB: the follower's short-lived rows — the HWM log's
// deltas, kept HWMLogBatches (256) batches (package session), and the
// window journal, whose entries live about WindowCapacity keys
// (journal.go) — outlived a 4 MiB memtable (about 20 fresh
// 1000-event batches), so they were flushed and compacted although they are
// deleted soon after; compactions were ~41% of the process's CPU on fresh
// apply. Shortening their lifetime instead was not measured, and looks
// dearer: the journal must hold at least the whole window (1.6 MB at
// 100,000 keys), and a shorter HWM log carries or checkpoints more
// sessions (100,000 uniform sessions are touched once per ~100 batches; a
// checkpoint is a Pebble row of its own). A larger memtable lets most of
// them die in it; it costs a deeper skiplist (each insert a little dearer)
// and a longer WAL replay after a crash; Close flushes, so a clean restart
// replays nothing. go test ./bench -run '^$' -bench Reopen -benchtime 3x
// (100,000 sessions, 200 batches after the preload; two rounds each, load
// 3–5): a killed follower opens in 300/337 ms at 4 MiB, 353/371 ms at
// 32 MiB; a closed one in 211/173 ms at 4 MiB, 75/110 ms at 32 MiB (fewer
// tables and tombstones under the HWM log it replays).
//
// Measured with one binary, only the memtable changed (4 MiB is main's),
// on the follower and the raw references alike (the benchmarks' openPebble),
// CPU ns per event, two interleaved rounds, load 1–2 (go test ./bench
// -run '^$' -bench 'Receiver/(fresh|dup100-window|raw-ingest)$' -benchtime
// 1500x, 2026-11-23):
//
//	memtable               4 MiB        16 MiB       32 MiB       64 MiB
//	raw-ingest             2943 3450    2581 2729    2337 2974    2473 2444
//	fresh                  5363 6370    4516 5137    3989 4063    4391 3686
//	  sstable B/event      969 1032     650 680      472 446      292 285
//	dup100-window (retry)  1296 1515    985 1022     920 907      861 905
//	  sstable B/event      136          46           26           18
//
// 32 MiB takes most of the saving (fresh −30%, retries −35%); 64 MiB adds
// little for twice the memory. End to end against main (go test ./bench
// -run '^$' -bench 'Pipeline/(e2e|e2e-raw|e2e-dup30|e2e-raw-dup30)$'
// -benchtime 500x, three interleaved rounds, load ~2.8): e2e 3844–4575 →
// 3279–3857, e2e-dup30 3267–3868 → 2108–3216 cpu-ns/event; the
// at-least-once references gain as much or more (e2e-raw 2808–3101 →
// 2144–2301), since every random-key workload compacts less with larger
// flushes.
//
// # Invariants
//
//  1. An event is applied at most once: after its batch commits, its SeqNo is
//     at or below its session's HWM, its LSN at or below the applied position,
//     and its key in the journal; none of them moves backwards.
//  2. No event is skipped: batches apply in LSN order (a batch beyond
//     position+1 is refused: replication.ErrOutOfOrder) and a SeqNo gap
//     refuses the whole batch (replication.ErrSeqGap).
//  3. One Pebble batch per shipped batch holds the applied state, the HWM
//     advances, the window journal, the applied LSN and the epoch. It commits
//     (with Sync, unless NoSync or it changed only the position, see
//     invariant 7) or nothing happens.
//  4. Memory follows the store, never leads it. Receiver.Apply is decide →
//     stage → publish (decide states the order of decisions; publish is the
//     only step that changes memory), and the receiver pipelines it
//     (Receiver.Start, Pending.Wait): a batch is handed to Pebble with Sync
//     without waiting for its WAL sync (DB.ApplyNoSyncWait), so the next
//     batch is decided and staged while that sync is in flight; a batch
//     that changed only the position is handed to Pebble without a sync,
//     and the next synced commit covers it (invariant 7). Two
//     positions follow the store, each its own layer of it: the window, the
//     in-memory HWMs and the position decide starts from change once the
//     batch is in Pebble's memtable (visible to every reader of the store);
//     the position Position and Hello report, and every ack, change only
//     once the batch and every batch before it are synced (Wait, in Start
//     order). A refused batch or an Applier error leaves the store exactly
//     as it was. A failed commit or WAL sync fails the store: that batch and
//     every later one — also those already in the memtable — are refused
//     (ErrFailed), nothing more is acknowledged, and the embedder reopens,
//     which rebuilds memory from the synced prefix. A crash loses at most
//     batches past every acknowledged position.
//  5. A batch from an epoch below the highest committed one, or below the
//     highest promised to a fencing leader (Promise), is refused
//     (replication.ErrStaleEpoch) before it touches anything; a batch of a
//     newer epoch that overlaps LSNs applied under an older one is refused as
//     diverged (replication.ErrDiverged). A promise is persisted (synced)
//     before Promise returns, and the position it returns is final for every
//     older epoch: no batch of one is decided after the promise, and those
//     decided before it are durable when it returns.
//  6. Every event of a decodable batch is counted in exactly one
//     ReceiverStats counter (see ReceiverStats.Accounted).
//  7. Acks carry the durable applied position (synced, unless NoSync): the
//     leader never needs to resend anything at or below it, and resending
//     anything is harmless. No ack reports a position before the WAL sync
//     that makes it durable. A batch that changed anything besides the
//     position is synced, as its own commit, before its ack. One that
//     changed only the position (its events all discarded or skipped:
//     stage wrote nothing but the position and batch identity, the epoch
//     unchanged) is committed without a sync: a crash that loses it loses nothing a
//     re-delivery does not decide the same way again. Its ack carries the
//     last synced position until a later synced commit covers it: Pebble's
//     WAL is one ordered log, so a sync makes every earlier commit durable
//     (across a WAL switch too: Pebble syncs the old file as it closes it).
//     No ack lags for long: every ReceiverOptions.PositionSyncEvery-th
//     position-only batch in a row is synced, so is one started with no
//     earlier batch in flight (every Apply), and Wait syncs the WAL itself
//     when no batch was started after its own (the stream paused), so the
//     last batch of a burst is acknowledged at its own position.
//  8. The position and the identity of the batch ending there (m/last_batch)
//     commit together, so a hello never names a batch the store did not
//     apply last.
//  9. An Applier is deterministic; a rejection is a result, never a wedge
//     (the Applier contract above): Validate refuses before anything is
//     logged, or Apply records the rejection; an Apply error or panic
//     commits nothing, stops the shard with ErrApply, and reopening with a
//     fixed Applier continues.
//  10. A damaged store never panics (DESIGN invariant 10): a block failing
//     Pebble's checksum is an error of the read (Pebble's DataCorruption
//     hook logs instead of calling Fatalf, NonFatalCorruption, on every
//     store opened), typed ErrCorrupt at the store boundary (CorruptError:
//     Open, Describe, a node's shards, oncewal inspect and promote). It
//     changes nothing on disk; a node keeps its other shards serving and
//     rebuilds the damaged one with Rebuild auto and a RebuildFrom.
//  11. A store knows what it is (DESIGN invariant 9): its kind, shard and
//     the options that change its decisions are recorded when it is created,
//     and opening it as anything else — or opening anything else as a store —
//     is refused before anything on disk changes.
package store

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
// through from h/ on demand after the HWM log (hd/) is replayed (its sessions
// pinned in memory), and the window is rebuilt from the journal (w/j/),
// after a clean Close and after a crash alike. The journal is written with
// each batch and compacted into a snapshot of the window every ~2× capacity
// keys, so the window a follower restarts with is exactly the window it had
// at its last commit (replication/journal.go explains why the replay is
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
// Pebble has no graceful answer to a full disk, so a follower stops before
// it: below Options.MinFreeBytes of free space (default 64 MiB; the
// internal/diskguard reading, at most every 100 ms) no batch is applied —
// Apply and Start refuse it with replication.ErrDiskFull, Serve holds it
// and waits for room (Stats.DiskFull, metric store_disk_full, /readyz
// fails) — and it goes on by itself when there is room (TestMinFreeBytes).
//
// If the disk fills anyway (the guard off, another process writing), the
// failing flush comes while the store serves: Pebble then holds
// the next commit that needs room in its memtables (a write stall), and
// Flush and Close wait for the flush too — all without a deadline, for as
// long as the disk stays full. The follower stays responsive
// (TestServeOnFullDisk): Serve starts each batch on its own goroutine and
// stops waiting for it when its context ends (the stuck batch is finished
// in the background, in pipeline order, and holds back every later batch);
// Close flushes and closes on its own goroutine and, after a few background
// errors in a row, returns store.ErrStalled wrapping the disk's error — the
// store then closes itself if the disk recovers, else it stays open until
// the process exits. Nothing acknowledged is lost: every acked batch is
// synced in Pebble's WAL, and an abandoned store is recovered at the next
// Open like a crashed one. Stats.WriteStalled (metric store_write_stalled)
// shows the stall; with background errors /readyz fails and the first
// stall is logged at Error.
//
// # Redialling
//
// Serve redials whenever its link drops. An attempt fails when the dial
// fails or the connection ends before it delivers a batch (a leader that
// refuses the hello closes the stream at once, after a dial that
// succeeded); each failure doubles the wait from Options.ReconnectBackoff
// (100ms) up to MaxReconnectBackoff (5s), and a working connection resets
// it. Every wait is jittered (±ReconnectJitter, 50%) so that followers that
// lost a leader together do not redial it in step. A run of failures is
// logged once at Warn as it starts, once at Error when it reaches the cap,
// at Info when it ends, and otherwise at Debug. A leader's refusal reaches
// Serve typed (replication.ErrRefused wrapping the reason: wrong shard,
// fenced, diverged, behind retention, unknown, duplicate or malformed
// follower ID), and a certificate either side refuses as
// replication.ErrAuthFailed; Stats().Link counts them by reason
// (PermanentReasons). A refusal is logged at Error once per reason — when
// it first comes and when the reason changes, not at every retry — saying
// what Serve does next ("retrying in 1.6s, then at most every 5s until the
// leader accepts it", "rebuilding the store from a snapshot of the leader",
// "stopping: StopOnPermanentRefusal is set") and, as remedy, what the
// operator does (refusalReasons). Serve keeps redialling at the capped
// backoff, so an operator's fix on the leader takes effect without a
// restart, unless Options.StopOnPermanentRefusal makes it return
// ErrPermanentRefusal; Run and Node with Rebuild auto (the default) and a
// RebuildFrom get that error at a refusal only a rebuild fixes
// (NeedsRebuild) and rebuild. A duplicate
// follower ID (replication.ErrDuplicateFollower: another live process is
// connected with this ID) is retried even then: it passes by itself when
// the other connection turns out dead.
//
// # The leader's liveness
//
// A leader that promised heartbeats (replication.LivenessConn; the gRPC
// transport's leader sends one per second) and sends nothing — no batch, no
// heartbeat — for Options.LeaderTimeout (default 5s) while Serve waits for
// a batch is stopped, hung or cut off: Serve drops the connection
// (replication.ErrLeaderSilent, logged at Warn) and redials, so
// Stats().Link.Connected, the connected metric and /readyz follow the
// leader's liveness rather than the TCP connection's, which a frozen
// process keeps open. Time the follower spends applying does not count: the
// transport holds messages back meanwhile. Link.LastError says why the
// last connection ended; readiness quotes it.
//
// # Store failure
//
// Pebble v2 treats a failed WAL write or sync as fatal and reports it through
// Logger.Fatalf, whose default implementation exits the process. The follower
// installs replication.FatalLogger, which panics with *replication.FatalError
// on the committing goroutine; the receiver recovers it, returns
// store.ErrFailed, and refuses every later batch. A failed WAL
// sync of a pipelined batch (below) comes back from its Pending.Wait, with
// the same outcome, for it and every batch started after it. Serve returns that
// error. The embedder must Close the follower and Open it again: the reopened
// store holds either the whole failed batch or none of it, and the leader
// resends from the position the follower reports in its handshake.
//
// # Applier failure
//
// A custom Applier (Options.Applier) keeps replication's Applier contract
// (invariant 10 there): deterministic, a rejection recorded as a result
// (Example_rejectionRecorded), never an error. An error or a panic
// (recovered) refuses the batch with replication.ErrApply and commits
// nothing; the same Applier would fail the resent batch again, so Serve
// stops at once — one refusal, counted in Stats.ApplyErrors (metric
// batches_refused_total{reason="apply_error"}), one Error log line —
// instead of having it resent, and a Node keeps that shard down
// (ShardStats.Err). Reopened with a fixed Applier, the follower goes on
// from its durable position.
//
// # Pebble key layout
//
// One store per follower shard. Every value begins with a one-byte format
// version (currently 1). The prefixes are named once, in package keyspace;
// a custom Applier may write anything outside keyspace.Reserved (h/, hd/,
// m/, w/, l/).
//
//	h/<session ID:16>              session HWM record (package session)
//	h/...                          the tracker's WAL clock (package session)
//	hd/<seq:8 BE>                  HWM log: one batch's HWM changes (package session)
//	s/<session ID:16><user key>    session state rows (package session)
//	m/position                     applied LSN, u64 LE
//	m/epoch                        highest committed leader epoch, u64 LE
//	m/format                       store format (1); marks an oncewal store
//	m/identity                     kind, shard, window capacity, retention horizon
//	                               (KeyIdentity; written when the store is created)
//	m/epoch_start                  first LSN of the epoch this store leads (after Promote)
//	m/epoch_prev                   the batch ending just before m/epoch_start (as m/last_batch)
//	m/slot/<follower ID>           a leader's replication slot for that follower (package leader;
//	                               leader-only: deleted when a new epoch starts, never
//	                               inherited by a rebuilt store — keyspace.LeaderOnly)
//	m/leader                       the epoch at which a leader raised this store's epoch: the
//	                               mark that it is a leader's store (leader.Open refuses a
//	                               store without it; leader-only, like m/slot/)
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
// # Request ledger and promotion
//
// The default applier also applies the request-ledger records a leader logs
// (wal ops claim, complete, release, fail, extend) into the l/ table, in the same
// Pebble batch as the effects they travel with. Promote turns a follower into
// its shard's leader (replication.LedgerLog) with a higher epoch: its log
// continues at the applied LSN + 1, the new epoch is persisted first (the old
// leader's batches are refused from then on), and its Ledger answers from the
// replicated table — requests completed on the old leader replay, claims it
// left in flight free themselves when their leases (as last extended) end
// on the WAL clock, and waiting claims on the new leader wait for that. A
// request the old leader completed but never shipped is lost with it, effect
// included, so its retry executes once on the new leader; with asynchronous
// replication the client may have seen the lost answer (the replay window of
// request-level idempotency is therefore bounded by what was replicated, and
// by the ledger's TTL). TestFailoverRequestsExactlyOnce proves this over 120
// seeds, with slow owners extending their leases and waiting duplicates,
// and checks every seed's client history with the porcupine
// linearizability checker; ONCEWAL_LONG=1 runs 2000, ONCEWAL_FAILOVER_SEEDS=n
// runs n, ONCEWAL_FAILOVER_SEED=n replays one.
//
// # Many shards in one process: Node
//
//	n, err := follower.OpenNode(dir, []uint32{0, 1, 2, 3}, &follower.NodeOptions{})
//	go n.Serve(ctx, func(shard uint32) replication.Dialer { return dialer })
//	n.Apply(batch)   // routed by the batch header's shard
//	n.Stats()        // per shard and totals
//	n.Close()
//
// With NodeOptions.ShardCount (oncewal follower --shards N) the node
// directory records the deployment's shard count in dir/SHARDS when it is
// created (a synced file renamed into place; a directory from before the
// record takes it once from the stores it holds) and OpenNode refuses
// another count with *ShardCountError (ErrShardCount) before it creates
// anything: sessions route by the count, so a node of another count would
// hold stores no leader ships to. A refused OpenNode removes the stores it
// created for the shards that did open.
//
// A Node runs one Follower per shard, each in its own store directory
// dir/shard-NNNN (ShardDir) with its own applied position, epoch, HWMs and
// window; the Follower code, key layout and guarantees above hold per shard
// unchanged. Node.Apply reads the shard from the batch header and refuses a
// shard the node does not serve with replication.ErrWrongShard before any
// store is touched. Node.Serve runs every shard's Serve loop on its own
// goroutine, so shards apply in parallel and a stalled link holds up only its
// shard. A shard whose store fails (store.ErrFailed) is closed and
// reopened from disk on its own, with backoff, while the others keep
// applying. The window bound (Options.WindowCapacity) holds per shard: the
// node holds at most shards × capacity keys, and NodeStats reports the
// total, including WindowBytes, the memory the windows hold.
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
// (replication/journal.go) — outlived a 4 MiB memtable (about 20 fresh
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
// # Throughput with many shards
//
//	go test ./follower -run '^$' -bench NodeApply -benchtime 300x -count 3
//
//	fresh 1000-event batches, one goroutine per shard, on disk, total events/s
//	(median of 3, load ≈ 3; cpu = process CPU per wall second, 2000 = both cores)
//	shards   Sync per batch        NoSync
//	1        660k  (cpu 1140)      481k  (cpu  970)
//	2        541k  (cpu 1050)      882k  (cpu 1710)
//	4        514k  (cpu 1030)      818k  (cpu 1860)
//	8        559k  (cpu 1110)      991k  (cpu 1820)
//
// Applying costs about 1.7–2 µs of CPU per event (decode, HWM and window
// checks, the state rows, Pebble's memtable insert, WAL write and background
// flushes), so two cores bound a node at roughly 1M events/s whatever the
// shard count. Without Sync, shards get there: one shard keeps about one core
// busy (its apply goroutine plus Pebble's background work), two or more use
// both cores, and throughput roughly doubles from 1 to 2 shards and stays
// there. With Sync per batch the total stays at 0.5–0.66M events/s and the
// process at about one core for every shard count.
//
// Why synced shards do not scale here (issue 13, point 5). It is not our
// code, nor Pebble's or Go's handling of the waits: the stores' syncs are
// issued concurrently, and they complete one after another in the
// filesystem. BenchmarkNodeApply times every sync through a wrapping FS
// (syncProbe). On tmpfs, where a sync costs nothing, Sync per batch runs as
// fast as NoSync and 2+ shards use both cores: 1.08M / 1.81M / 1.57M
// events/s at 1 / 2 / 4 shards (NoSync 1.10M / 1.76M / 1.44M; cpu 1970 ms/s
// at 2 shards). On the ext4 disk in the same minute: 0.82M / 0.70M / 0.73M
// at about one core, while the mean WAL sync grows 0.29 → 1.09 → 3.34 ms
// with 1.07 → 1.36 → 2.9 syncs in flight on average — concurrent syncs
// taking proportionally longer, i.e. served one at a time; at 4 shards a
// sync is in flight 98–99.7% of the time. The mutex and block profiles show
// no lock of ours; the apply goroutines wait only in Pebble's commit
// publish, for their own WAL sync.
//
// The device allows more, but not for this kind of sync. BenchmarkSyncOverlap
// is the raw ceiling without Pebble: each goroutine burns 1 ms of CPU (a
// batch's apply), writes 128 KiB (its WAL bytes) to a file of its own and
// fdatasyncs it. Overwriting a preallocated file in place scales with both
// cores: 814 / 1318 / 1346 ops/s at 1 / 2 / 4 files (cpu 1600 ms/s, syncs
// 0.18–1.6 ms), also beside a 4 MiB-file bulk writer standing in for
// flushes and compactions (498 / 872 / 1171). Appending — the file grows,
// so fdatasync must commit ext4's journal, one commit at a time per
// filesystem — reproduces the node's plateau: 629 / 676 / 767 ops/s at
// about one core, sync 0.45 → 1.2 → 3.2 ms. Pebble's WAL is appended to
// (its preallocation keeps the file size, so every synced append changes
// it), hence every synced batch of every store waits for its own journal
// commit, serialised filesystem-wide. (Measured at load 0.3–3, 2026-11-23:
// go test ./follower -run '^$' -bench 'NodeApply|SyncOverlap' -benchtime
// 400x, with TMPDIR=/dev/shm for tmpfs.)
//
// So the lever is fewer syncs, not more shards: one sync for several
// batches of a store (the receiver pipeline: Pebble syncs every record
// queued on its WAL in one fdatasync), or shards on separate filesystems.
// In short: on 2 cores with one ext4 filesystem, shards buy fault isolation
// and ordering independence, and up to ~2× throughput only when commits are
// not synced per batch.
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
//     reached the store; the reported position and the acks only after it is
//     synced (replication's invariant 2 states this for the pipeline).
//  5. A batch from an epoch below the highest committed one is refused before
//     it touches anything.
//  6. (Node) A shard's batches touch only that shard's store; a batch for a
//     shard the node does not serve touches none.
//  7. A damaged store never panics (DESIGN invariant 10): a block failing
//     Pebble's checksum is an error of the read (Pebble's DataCorruption
//     hook logs instead of calling Fatalf, replication.NonFatalCorruption,
//     on every store opened), typed store.ErrCorrupt at the store boundary
//     (CorruptStoreError: Open, Describe, a node's shards, oncewal inspect
//     and promote). It changes nothing on disk; a node keeps its other
//     shards serving and rebuilds the damaged one with Rebuild auto and a
//     RebuildFrom.
//
// # Pipeline
//
// Serve pipelines the receiver: its receive loop starts each batch
// (Receiver.Start: decided, staged and in Pebble's memtable, its WAL sync in
// flight) and an acknowledger waits for them in order (Pending.Wait) and
// sends their acks, up to 4 batches between the two. The shipper keeps more
// than that in flight (ShipperOptions.MaxInFlight, default 32), so the pipe
// stays full; Pebble syncs every record queued on the WAL with one
// fdatasync. Embedders with their own transport get the same through
// Follower.Start. TestCrashSweepPipelined crashes at every WAL write and sync
// with batches in every stage and checks that recovery keeps every
// acknowledged LSN and ends in the oracle's state.
package follower

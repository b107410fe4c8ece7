// Package session owns what a follower knows about client sessions: their IDs,
// the follower-side high-water-mark Tracker, and the default session state
// machine (State). The leader numbers events when it stamps them
// (leader.LedgerLog), continuing each session from its Tracker.
//
// # Job
//
// Every session event carries (ID, SeqNo, leader timestamp). The leader
// numbers a session's events 1, 2, 3, …. A follower's Tracker keeps,
// per session, the highest SeqNo applied (HWM) and decides for each redelivered
// or new event: Apply (seq == HWM+1), Duplicate (seq <= HWM), Gap (seq > HWM+1:
// refuse the batch, never apply past a hole), Closed (session closed, seq >
// HWM), TooOld (unknown session, timestamp older than WAL clock − horizon).
// SeqNo 0 means "no seqno": such events bypass the Tracker (Check/Advance
// return ErrZeroSeq).
//
// # Transactions
//
// The Tracker and State write into the caller's *pebble.Batch so that the HWM
// commits atomically with the state the event changed. A TrackerTx (one per
// batch; txs are serialized) sees its own pending advances, so several events
// of one session in one batch check against each other. Advance/MarkClosed only
// record pending state; Flush writes the changed sessions (one delta of the
// HWM log, or one row each with the log off), the WAL clock and any
// checkpoints into the batch and MUST be called before the batch commits.
// After the caller's commit succeeds it calls tx.Commit, which publishes to
// the cache; after a failure, tx.Abort, which leaves no trace.
// TrackerTx.CollectGarbage writes its deletions straight into the batch (no
// Flush needed for them).
//
// # Deciding a batch from plain values
//
// The rules of Check are a function of plain values, so a caller can load
// first and decide after (the store's receiver does, as raft's Step is pure
// and its Ready does the I/O): TrackerTx.Peek (state only) or Load (state
// and a slot to advance by) returns a session's HWM; Decide(h, seq, ts,
// Cutoff(clock, horizon)) is Check over it; AdvanceLoaded is Advance by the
// slot, without a second index lookup. Check and Advance are these same
// functions over the tx's own view, so the two ways cannot disagree.
//
// TrackerTx.Prefetch(id) is a hint with no effect on state: a caller that
// holds a whole batch prefetches its sessions before checking them, so the
// cache misses overlap instead of coming one per Check. It also touches the
// entry's log state and links, which Commit reads for every advanced
// session (without them, that read was a cache miss per session:
// Receiver/dup100-window 1030 → 874 cpu-ns per event, 3 rounds
// interleaved, load ~2). For a duplicate's Check alone it pays little once
// the cache is compact: 53–81 → 50–65 cpu-ns
// (bench.BenchmarkTrackerCheckDuplicate): a thousand sessions prefetched
// before the first Check need more lines than L1 keeps and than the CPU
// has in flight. TrackerTx.PeekAll peeks a whole batch instead, pipelining
// each lookup's two misses a few lookups ahead of it; the receiver uses
// it, and Load prefetches the log state of the sessions it indexes (the
// ones a batch may advance).
//
// # The HWM cache
//
// An exact LRU (cache.go) on the same table as the idempotency window
// (internal/lrutable): a linear-probing table of 4-byte slots (entry index, probe distance, hash fingerprint) over an array of
// 40-byte entries (ID, HWM with the closed flag in its top bit, last
// activity, recency links) with the log state in parallel arrays. No pointers, so the
// GC never scans it; a hit reads one slot and one entry (two or three cache lines)
// and allocates nothing; about 67 B of heap per cached session, fresh or
// churned (bench.BenchmarkTrackerCacheMemory: entry 40 B with its links, log
// state 9 B — delta and carry count —, table slots; golang-lru/v2 held 130 B fresh, 165 B churned). Lookups do not refresh recency (a random list
// write costs more than the lookup); filling from Pebble and committing a
// write do. golang-lru/v2 is the reference the cache is tested against.
// Besides these clean entries (at most CacheSize), the cache pins the
// sessions whose latest change is only in the HWM log (below): they are
// never evicted, since their row is stale, and do not count against
// CacheSize.
//
// # Amortised HWM persistence: the HWM log
//
// One HWM row per changed session per batch made a fresh event cost two
// Pebble keys (its state row and its session's HWM row), and a retry under a
// fresh SeqNo one key although nothing applied. Instead, Flush writes all of
// a batch's HWM changes as one value, a delta of the log (hwmlog.go),
// format 2:
//
//	hd/ + seq u64 BE → 2 | base i64 LE | per session: ID(16) | uvarint(HWM<<1 | closed) | varint(base − lastTS)
//
// base is the tx's WAL clock (no lastTS exceeds it), so a session that just
// changed costs ~21 bytes (16 of them its ID) where format 1 spent 33; HWM
// 0 is a GC tombstone (no time follows). Format-1 deltas (fixed 33-byte
// entries, "1 | ID | HWM u64 | lastTS i64 | flags") are still read, so a
// store an older binary wrote opens; an older binary refuses a format-2
// delta with ErrCorrupt. Golden files in testdata pin both.
//
// Deltas are numbered consecutively; the delta and the state it goes with
// commit in one batch. A session whose latest change is only logged is
// pinned in the cache (the cache's dirty list, ordered by the delta of its
// latest entry). Each Flush then retires, in the same batch, the logged
// sessions whose entry is LogBatches deltas old (and the oldest beyond
// LogSessions), skipping those the tx itself writes again:
//
//   - carried forward: while the log holds at most LogSessions sessions, an
//     old session is logged again, unchanged, in the batch's own delta —
//     about 21 bytes inside a value the batch writes anyway — at most
//     maxCarries (2) times in a row;
//   - checkpointed: otherwise (carried twice without a change, over the
//     bound, or a Flush that writes no delta) its h/ row is rewritten, a
//     Pebble key of its own (memtable insert, flush, every compaction).
//
// and deletes every delta older than the oldest entry still needed. A
// session that changes again within LogBatches batches costs nothing
// more. With 100K uniform sessions and 1000-event batches (each session
// touched once per ~100 batches) and LogBatches 128, a fresh event cost
// ~1.3 delta entries (its own, and 0.28 carried: e^-1.28 of sessions go
// 128 batches untouched) and 0.02 rows (0.28³), against 0.28 rows when old
// sessions were always rewritten and one row without the log
// (bench.BenchmarkTrackerWrites log=128, 3000x: hwm-keys/event 0.995 →
// 0.277 → 0.0215). The default is 256 since 2026-11-24: 0.08 carried and
// 0.0005 rows per fresh event (log=256, same benchmark, one run: 0.0023
// HWM keys, 146.5 against 152.1 WAL bytes and 2,249 against 2,451 CPU ns
// per event; sstable bytes 203 against 185, the deltas living longer), for
// a replay twice as long (below). Carrying, not rewriting, is
// what pays: a row costs Pebble ~2 µs over its life here, an entry in a
// value a few bytes of WAL, flush and compaction. Receiver/dup100-window
// (every event a retry: an HWM entry and a journal key, no state row),
// same run, loaded machine: 74.4 → 58.8 WAL bytes and 216 → 136 sstable
// bytes per event with format 2 and carrying. CollectGarbage deletes
// expired logged sessions too (with a tombstone, so a replay never brings
// them back); carried sessions go before the tx's own changes in the
// dirty list, which keeps it about ordered by last activity for GC's walk.
//
// OpenTracker replays the deltas in order and pins each logged session's
// latest state. The log holds at most about LogBatches deltas and
// LogSessions live sessions, which bounds the replay. With carrying, a
// follower of up to LogSessions active sessions keeps all of them logged:
// bench.BenchmarkReopen (100K uniform sessions, 200 batches after the
// preload, loaded 2-vCPU machine) replayed 100,000 sessions in 110–132 ms
// (open 260–315 ms) where rewriting rows left 71,957 to replay in
// 75–149 ms (open 199–261 ms); the store without the log opens in
// 163–268 ms. With LogBatches 256 (reopenBatches, LogBatches + 72 batches
// after the preload, so the log is as long as it gets; 2 runs, 3x each,
// against 128 interleaved): replay 56 ms against 39–42, open 106–108 ms
// against 59–67, and a killed follower's open (its Pebble WAL replay
// included) 239–241 ms against 177–182. ScanHWMs merges rows and log the same way.
//
// Crash and restart guarantees are unchanged, because every write of the
// scheme — delta, carried entries, checkpoint rows, delta deletions,
// tombstones — goes into the batch of the events it belongs to: a crash
// keeps or loses the batch whole, and the store always holds each
// session's committed record as its row overlaid by the surviving deltas
// in order. A carried entry repeats the committed record in a newer delta,
// so the replay's "latest entry wins" finds the same record. Invariants:
//
//  7. A session whose row is not its committed record is in the cache (as
//     logged); eviction takes clean entries only.
//  8. Every delta from the oldest logged entry on is kept; a delta is
//     deleted only in a batch that checkpoints, carries forward or
//     supersedes every entry it still holds for a logged session.
//
// A StateTx writes through on every op and remembers pending counters, so an
// Add after a Put/Add/Delete of the same key in the same batch builds on it.
//
// # Invariants
//
//  1. The HWM never moves backwards: Advance accepts only HWM+1 (1 for an
//     unknown or expired session), anything else is a typed error and no change.
//  2. The in-memory view (cache, WAL clock, GC cursor) changes only in Commit,
//     i.e. after the caller's batch committed; a batch that fails or is never
//     committed leaves no trace in memory or on disk. Changes never flushed into
//     the batch are not published (their sessions are dropped from the cache,
//     so memory never claims more than disk holds).
//  3. The cache holds only committed records: clean ones (LRU, at most
//     CacheSize, default 1M sessions), whose row holds them, so a miss reads
//     Pebble, which is authoritative; and the sessions whose latest change
//     is only in the HWM log (at most about LogSessions), pinned. A tx's
//     pending changes live in the tx, never in the cache.
//  4. WAL clock rule: the clock is the largest leader timestamp of any committed
//     Advance/MarkClosed — never the follower's own clock — so every follower
//     fed the same log decides the same. It is persisted at ClockKey in the same
//     batch and restored by OpenTracker. A tx sees its own pending clock.
//  5. Expiry: a session whose last activity (max timestamp of its advanced or
//     closed events) is older than clock − RetentionHorizon is expired and
//     counts as unknown, whether or not CollectGarbage has deleted its row yet,
//     so decisions never depend on when a follower ran GC. Closing a session
//     does not shorten its retention: its applied events can still be
//     redelivered, and were its row gone early, a redelivered seq 1 would be
//     applied again as a new session. GC only reclaims space; it runs inside a
//     TrackerTx (its deletions go into the same batch and reach the cache at
//     Commit) so it cannot race an Advance.
//  6. Horizon rule: RetentionHorizon must exceed the longest redelivery delay,
//     measured on the WAL clock (clock at delivery − the event's timestamp),
//     and the longest pause of a live session. Because lastTS is the session's
//     maximum timestamp, a redelivered event of an expired or collected session
//     always has ts <= lastTS < clock − horizon and is refused as TooOld, never
//     applied as new. What a too-short horizon breaks is the other direction:
//     an event first delivered later than the horizon is refused as TooOld
//     (seq 1) or checks as Gap (seq > 1), and a session that pauses longer than
//     the horizon is over — its next SeqNo checks as Gap, which a receiver must
//     refuse. The leader must therefore expire sessions by the same rule (stop
//     stamping them: LedgerLog refuses with ErrSessionExpired) and clients
//     open a new session.
//
// # Key layout (values start with a format-version byte, 1)
//
//	h/ + ID(16)      → 1 | HWM u64 LE | lastTS i64 LE | flags (bit0 closed)   HWMPrefix
//	h/clock          → 1 | WAL clock i64 LE                                   ClockKey
//	hd/ + seq(8 BE)  → 2 | base | (ID | uvarint | varint) × n: the HWM log  HWMLogPrefix (format 1 read too)
//	s/ + ID(16) + k  → 1 | user value (Add: i64 LE, 8 bytes)                  StatePrefix
//
// ClockKey is 7 bytes, every HWM key 18, so scans of h/ tell them apart.
//
// # Tests
//
// TestTrackerAgainstModel drives the Tracker (tiny cache, aborts, batches never
// committed, repeated Flushes, GC, reopen; the log off, constantly
// checkpointing, and at its defaults) against a plain map model, checking
// after every event that the cache holds exactly committed records, that
// every session with a stale row is pinned, that ScanHWMs shows the
// committed records and that a replay resurrects no collected session;
// ONCEWAL_LONG=1 runs it 50x longer. The follower's crash sweep and seeded
// simulations run with the log checkpointing every few batches. TestHWMCacheAgainstLRU checks the cache's answers, contents and
// eviction order against golang-lru/v2. Benchmarks live in
// bench/tracker_test.go.
package session

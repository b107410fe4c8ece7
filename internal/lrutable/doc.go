// Package lrutable is the one open-addressing hash table with index-linked
// recency lists under the idempotency window (idempotency.Store, an exact
// LRU set of keys) and the Tracker's HWM cache (session's hwmCache, an LRU
// of clean records beside a pinned list of dirty ones).
//
// A Table maps 16-byte keys to entries. Entries live in one array and are
// named by their int32 index; an entry holds its list links beside its key,
// so an eviction, which reads the victim's key to find its slot and its
// links to unlink it, takes one cache miss for both. The hash index is an
// array of uint32 slots probed linearly, of any size (a hash's home slot is
// its high bits scaled to the size); a slot holds the entry's index + 1, its
// probe distance from its home slot and a fingerprint of its hash, so a miss
// — the common case for a follower, where almost every key is new — seldom
// touches an entry, and deletion finds homes without reading keys. Lists
// (List) are owned by the caller: the table links and unlinks an index in
// the list it is told, and the caller knows which list an entry is in. The
// policy — when to evict, which list an entry belongs to, what its value
// means — is the caller's; Touch is the exact-LRU step for a caller whose
// whole table is one list.
//
// # Invariants
//
//  1. A slot is 0 (empty) or a word packing, from the low bits: the index +
//     1 of its entry, in as many bits as the table's limit (invariant 2)
//     needs; the entry's distance from its home slot, in up to 4 bits,
//     where the largest value means that distance or more; and the low
//     bits of the key's Hash under the table's seed, the fingerprint, in
//     the bits left. Every live entry has exactly one slot, reachable from
//     its home slot (Hash * slots >> 32) by probing forward, wrapping at the
//     end, without crossing an empty slot: deletion shifts the rest of the
//     probe cluster back (no tombstones), so churn never lengthens probes.
//  2. At most limit = ⌊0.55 × slots⌋ slots are used: Insert doubles the
//     index (rehashing the keys, in entry order) before it passes that.
//  3. Every index below the high-water mark of handed-out indexes is either
//     live (in the hash index, and in at most one List, chosen by the
//     caller) or on the free list, marked freed, never both. Lists are
//     doubly linked by index with Nil at both ends; Prev points toward the
//     head.
//  4. Nothing allocates except growth: a table made by Init with
//     SlotsFor(n) slots and n entries never grows while it holds at most n
//     entries. Keys and values must hold no pointers, so the arrays are
//     noscan allocations the garbage collector never traverses.
//  5. Lock-free readers: the caller serializes every change, but slot
//     writes are atomic stores so that ResidentHint, Warm, PrefetchKeys and
//     the other prefetch helpers may run concurrently with changes, without
//     the caller's lock. What they read is only a hint — a prefetch address,
//     never a result — and a table read that way must never grow
//     (invariant 4), because growth replaces the arrays.
//
// # Shape and cost
//
// The table is generic over the key (any ~[16]byte: the window's Key and
// the cache's session ID share one GC shape) and the value; each value type
// gets its own stenciled code, and the hot paths (Find, Touch, the list
// operations) compile to plain loads and compares with no dictionary
// lookups (go build -gcflags=-S). A value-less entry (the window's) is
// 24 B: 16 B key + 8 B links; the cache's, with its 16 B value, is 40 B.
// Links once lived in a parallel array, which kept the cache's entries at
// two per cache line but cost the window an extra miss per eviction: its
// new-key check took 1.2–1.4× the time of inline links in the same runs
// (bench Window/oncewal/new), while the cache's duplicate check showed no
// difference beyond noise and its memory grew 3 B per session.
//
// Slots are 4 B at a load of at most 0.55, so a table sized once by
// SlotsFor costs 24 + 4/0.55 ≈ 31.3 B per value-less entry: the window's
// 100K entries get 181,819 slots, and bench WindowMemory reports 31.30
// B/entry fresh and 31.35 after churn (go test ./bench -run '^$' -bench
// WindowMemory; 45.0 before, with 8 B slots — a 32-bit hash beside the
// index — in a power-of-two index at most half full, 0.38 full at 100K).
// A table that grows doubles, so it runs 0.275–0.55 full; the HWM cache
// fell from 77.8 to 67.4 B per session (TrackerCacheMemory). The index +
// 1 takes the bits the limit needs and the distance 4, so the window's
// default has an 11-bit fingerprint: a miss reads an entry for about one
// occupied probe in 2^11 that shares its home. Larger tables have fewer
// fingerprint bits — 3 at 2^24 entries, none from 2^28 - 1 (the window's
// largest, idempotency.MaxCapacity = 2^28, keeps a 3-bit distance, a
// table of MaxEntries a 1-bit one) — and stay correct: Find still compares keys only of
// entries at the distance its own would have (same home, below the
// saturated distance), and deletion rereads the key of every entry whose
// distance does not fit (TestLayoutsAgainstLRU, TestBackwardShiftDeletion).
//
// The price is the load: linear probing at 0.55 probes more than at 0.38.
// In interleaved runs on a shared 2-vCPU machine (3 rounds each, medians)
// the window's duplicate check took 44.9 ns against 39.0 before and its
// new-key check 87.2 ns against 69.0; the same code at load 0.375 measured
// 74.9 ns on new keys against 69.3, so the packing and the non-power-of-two
// index cost about 5 ns and the load the rest. Tried and dropped: comparing
// only the fingerprint in Find (no faster, and blind for the largest
// tables), a branch-free backward shift (no faster), a load of 0.52 (1–2
// ns, within noise, for less memory headroom). Robin Hood ordering was
// modeled and dropped: at 0.55 its shorter misses are paid back by shifting
// on insert. The HWM cache's benchmarks (Tracker, TrackerCheckDuplicate)
// moved within the machine's noise.
//
// A change here is gated by bench's Window, WindowMemory,
// TrackerCheckDuplicate, Tracker and TrackerCacheMemory benchmarks, run
// interleaved with the code before it: go test ./bench -run '^$' -bench
// 'Window$|WindowMemory|TrackerCheckDuplicate|Tracker$|TrackerCacheMemory'.
//
// The seed is random per table: keys arrive in shipped events, and a
// per-table seed keeps anyone who can choose keys from aiming them at one
// probe cluster.
package lrutable

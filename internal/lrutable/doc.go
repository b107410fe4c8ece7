// Package lrutable is the one open-addressing hash table with index-linked
// recency lists under the idempotency window (idempotency.Store, an exact
// LRU set of keys) and the Tracker's HWM cache (session's hwmCache, an LRU
// of clean records beside a pinned list of dirty ones).
//
// A Table maps 16-byte keys to entries. Entries live in one array and are
// named by their int32 index; an entry holds its list links beside its key,
// so an eviction, which reads the victim's key to find its slot and its
// links to unlink it, takes one cache miss for both. The hash index is a
// power-of-two array of uint64 slots probed linearly; a slot holds the
// 32-bit hash of its key and the entry's index + 1, so a miss — the common
// case for a follower, where almost every key is new — ends without touching
// any entry, and deletion and growth recompute home slots without reading
// keys. Lists (List) are owned by the caller: the table links and unlinks an
// index in the list it is told, and the caller knows which list an entry is
// in. The policy — when to evict, which list an entry belongs to, what its
// value means — is the caller's; Touch is the exact-LRU step for a caller
// whose whole table is one list.
//
// # Invariants
//
//  1. A slot is 0 (empty) or hash<<32 | index+1, where hash is Hash of the
//     key of entry index under the table's seed. Every live entry has
//     exactly one slot, reachable from its home slot (hash >> shift) by
//     probing forward without crossing an empty slot: deletion shifts the
//     rest of the probe cluster back (no tombstones), so churn never
//     lengthens probes.
//  2. At most half the slots are used: Insert doubles the index (rehashing
//     from the slot words, not the keys) when it passes half.
//  3. Every index below the high-water mark of handed-out indexes is either
//     live (in the hash index, and in at most one List, chosen by the
//     caller) or on the free list, never both. Lists are doubly linked by
//     index with Nil at both ends; Prev points toward the head.
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
// difference beyond noise and its memory grew 3 B per session. A change here
// is gated by bench's Window, WindowMemory, TrackerCheckDuplicate, Tracker
// and TrackerCacheMemory benchmarks, run interleaved with the code before
// it: go test ./bench -run '^$' -bench
// 'Window$|WindowMemory|TrackerCheckDuplicate|Tracker$|TrackerCacheMemory'.
//
// The seed is random per table: keys arrive in shipped events, and a
// per-table seed keeps anyone who can choose keys from aiming them at one
// probe cluster.
package lrutable

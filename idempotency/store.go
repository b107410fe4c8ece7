package idempotency

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// DefaultCapacity is the window size used when NewStore is given a
// capacity <= 0.
const DefaultCapacity = 100_000

// MaxCapacity bounds the window so entry indexes fit the int32 links; larger
// requests are clamped.
const MaxCapacity = 1 << 28

// nilIdx terminates the intrusive LRU list and the free list.
const nilIdx = -1

// entry is one remembered key. It holds no pointers, so the entries array
// is a single noscan allocation the GC never traverses.
type entry struct {
	key        Key
	prev, next int32 // LRU list: prev is toward MRU (head), next toward LRU (tail)
}

// The assembly in prefetch_amd64.s relies on this layout.
var (
	_ = [1]struct{}{}[unsafe.Sizeof(entry{})-24]
	_ = [1]struct{}{}[unsafe.Offsetof(entry{}.prev)-16]
	_ = [1]struct{}{}[unsafe.Offsetof(entry{}.next)-20]
)

// Store is the bounded window of recently seen keys: an exact LRU set of at
// most Capacity keys. See the package documentation for the invariants.
//
// Layout: a fixed array of entries linked by int32 indexes into a doubly
// linked recency list, and an open-addressing (linear probing) table of
// uint64 slots, each holding an entry index and the 32-bit hash of its key.
// The hash in the slot lets a miss — the common case for a follower, where
// almost every key is new — finish without touching any entry, and lets
// deletion recompute home slots without reading keys. Deletion shifts the
// following cluster back (no tombstones), so churn never degrades probing.
// Everything is allocated by NewStore; no operation allocates.
type Store struct {
	// Read-only after NewStore, read by every operation outside the lock:
	// kept on their own cache lines so lock-holder writes don't evict them.
	table    []uint64 // 0 = empty; else uint64(hash32)<<32 | uint64(index+1)
	entries  []entry
	seed0    uint64
	seed1    uint64
	mask     uint32
	capacity int32
	shift    uint8 // home slot = hash32 >> shift
	_        [64]byte

	mu   sync.Mutex
	n    int32 // live keys
	head int32 // most recently seen, or nilIdx
	tail int32 // least recently seen, or nilIdx
	free int32 // free list (via next) of released entries, or nilIdx
	used int32 // entries[used:] have never been handed out

	evictions atomic.Uint64 // keys CheckAndRecord evicted, ever (written under mu)
}

// NewStore returns an empty window remembering up to capacity keys
// (DefaultCapacity if capacity <= 0, clamped to MaxCapacity). All memory is
// allocated here: about 24 B per entry plus 8 B per table slot, with at
// least two slots per entry so probe sequences stay short when full.
func NewStore(capacity int) *Store {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	capacity = min(capacity, MaxCapacity)
	slots := tableSlots(capacity)
	return &Store{
		capacity: int32(capacity),
		head:     nilIdx,
		tail:     nilIdx,
		free:     nilIdx,
		shift:    uint8(32 - bits.TrailingZeros(uint(slots))),
		mask:     uint32(slots - 1),
		// Keys normally are BLAKE3 output, but they arrive in shipped
		// events; a per-store random seed keeps anyone who can choose keys
		// from aiming them at one probe cluster.
		seed0:   rand.Uint64(),
		seed1:   rand.Uint64() | 1,
		table:   make([]uint64, slots),
		entries: make([]entry, capacity),
	}
}

// tableSlots is the hash table size for a capacity: a power of two of at
// least 2*capacity (and 8), so probe sequences stay short when full.
func tableSlots(capacity int) int {
	return max(1<<bits.Len(uint(2*capacity-1)), 8)
}

// StoreBytes is the memory NewStore(capacity) allocates — all a window ever
// holds: 24 B per entry plus 8 B per table slot.
func StoreBytes(capacity int) int64 {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	capacity = min(capacity, MaxCapacity)
	return int64(unsafe.Sizeof(entry{}))*int64(capacity) + 8*int64(tableSlots(capacity))
}

// hash32 mixes the whole key with the store's seed (a wyhash-style
// multiply-fold). 0 is reserved so a slot word is never 0 for a used slot
// even if the index part were 0.
func (s *Store) hash32(k *Key) uint32 {
	lo := binary.LittleEndian.Uint64(k[0:8])
	hi := binary.LittleEndian.Uint64(k[8:16])
	h1, h0 := bits.Mul64(lo^s.seed0, hi^s.seed1)
	return uint32((h1 ^ h0) >> 32)
}

// find returns the table slot and entry index of k, or slot = the empty
// slot where the probe stopped and idx = nilIdx.
func (s *Store) find(k *Key, h uint32) (slot uint32, idx int32) {
	slot = h >> s.shift
	for {
		v := s.table[slot]
		if v == 0 {
			return slot, nilIdx
		}
		if uint32(v>>32) == h {
			i := int32(uint32(v)) - 1
			if s.entries[i].key == *k {
				return slot, i
			}
		}
		slot = (slot + 1) & s.mask
	}
}

// deleteSlot empties slot and shifts the rest of its cluster back so every
// remaining key stays reachable from its home slot.
func (s *Store) deleteSlot(hole uint32) {
	j := hole
	for {
		j = (j + 1) & s.mask
		v := s.table[j]
		if v == 0 {
			break
		}
		home := uint32(v>>32) >> s.shift
		// Move j into the hole unless its home lies cyclically in (hole, j].
		if (j-home)&s.mask >= (j-hole)&s.mask {
			atomic.StoreUint64(&s.table[hole], v)
			hole = j
		}
	}
	atomic.StoreUint64(&s.table[hole], 0)
}

func (s *Store) unlink(i int32) {
	e := &s.entries[i]
	if e.prev != nilIdx {
		s.entries[e.prev].next = e.next
	} else {
		s.head = e.next
	}
	if e.next != nilIdx {
		s.entries[e.next].prev = e.prev
	} else {
		s.tail = e.prev
	}
}

func (s *Store) pushFront(i int32) {
	e := &s.entries[i]
	e.prev = nilIdx
	e.next = s.head
	if s.head != nilIdx {
		s.entries[s.head].prev = i
	} else {
		s.tail = i
	}
	s.head = i
}

// removeIdx drops entry i (live) from the table and the list and returns it
// to the caller for reuse.
func (s *Store) removeIdx(i int32) {
	k := &s.entries[i].key
	slot, _ := s.find(k, s.hash32(k))
	s.deleteSlot(slot)
	s.unlink(i)
	s.n--
}

// CheckAndRecord reports whether k is new. A new key is recorded as the
// most recently seen, evicting the least recently seen key if the window is
// full; a duplicate (false) is moved to most recently seen. Atomic: of any
// number of concurrent calls with the same absent key exactly one returns
// true.
func (s *Store) CheckAndRecord(k Key) bool {
	h := s.hash32(&k)
	s.warm(&k, h)
	s.mu.Lock()
	slot, i := s.find(&k, h)
	if i != nilIdx {
		if i != s.head {
			wasTail := i == s.tail
			s.unlink(i)
			s.pushFront(i)
			if wasTail && s.n == s.capacity {
				s.prefetchVictim()
			}
		}
		s.mu.Unlock()
		return false
	}
	switch {
	case s.n == s.capacity:
		i = s.tail
		s.removeIdx(i)
		s.evictions.Store(s.evictions.Load() + 1) // under mu: no read-modify-write needed
		// The shift may have opened a hole earlier on k's probe path.
		slot, _ = s.find(&k, h)
	case s.free != nilIdx:
		i = s.free
		s.free = s.entries[i].next
	default:
		i = s.used
		s.used++
	}
	s.entries[i].key = k
	atomic.StoreUint64(&s.table[slot], uint64(h)<<32|uint64(uint32(i)+1))
	s.pushFront(i)
	s.n++
	if s.n == s.capacity {
		s.prefetchVictim()
	}
	s.mu.Unlock()
	return true
}

// warm runs before taking the lock and pulls into cache the lines the
// locked section will need for k: its probe slots and, if k is resident,
// its entry and neighbours, and the LRU tail. Cache misses are most of an
// operation's cost; taking them outside the lock keeps the locked section
// short (see the package doc for what that does and does not buy). The
// table is read with atomic loads (its writers store atomically) and the
// result is only a hint: everything is looked up again under the lock.
func (s *Store) warm(k *Key, h uint32) {
	// A miss records k and, when full, evicts the tail: warm the tail and
	// the entry that becomes the next tail.
	prefetchLinks(unsafe.Pointer(&s.entries[0]), &s.tail)
	if i := s.residentHint(h); i != nilIdx {
		// A hit refreshes recency: warm its list neighbours too.
		prefetchLinks(unsafe.Pointer(&s.entries[0]), &i)
	}
}

// residentHint is the entry index in the first of the first four probe
// slots of hash h that carries h, or nilIdx: where a key of that hash most
// likely lives. Read with atomic loads and without the lock, for prefetching
// only (the hash may collide, the table may change).
func (s *Store) residentHint(h uint32) int32 {
	slot := h >> s.shift
	for range 4 {
		v := atomic.LoadUint64(&s.table[slot])
		if v == 0 {
			return nilIdx
		}
		if uint32(v>>32) == h {
			return int32(uint32(v) - 1)
		}
		slot = (slot + 1) & s.mask
	}
	return nilIdx
}

// Prefetch is a hint with no effect on the window: it pulls into cache the
// lines a later operation on k will touch — its probe slots and, if k is
// resident, its entry and list neighbours — without taking the lock. A
// caller about to check a whole batch of keys prefetches them all first, so
// that their cache misses overlap instead of stalling each check in turn.
func (s *Store) Prefetch(k *Key) { s.warm(k, s.hash32(k)) }

// prefetchChunk is how many keys PrefetchKeys keeps in flight per pass:
// about what the CPU's outstanding-miss buffers hold, and small enough for
// the chunk's hashes and indexes to live on the stack.
const prefetchChunk = 32

// PrefetchKeys is Prefetch for a whole batch of keys, which a caller about
// to check them all (the follower's receiver) calls first. Prefetch must
// load a key's table slot to find its entry, and the entry to find its
// neighbours, so each call waits for two cache misses in turn; here each
// step is one pass over a chunk of keys — prefetch every home slot, then
// read the slots and prefetch the entries, then read the entries and
// prefetch their neighbours — so a chunk's misses overlap. Like Prefetch,
// a hint with no effect on the window.
func (s *Store) PrefetchKeys(keys []Key) {
	prefetchLinks(unsafe.Pointer(&s.entries[0]), &s.tail)
	var hs [prefetchChunk]uint32
	var idx [prefetchChunk]int32
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), prefetchChunk)]
		keys = keys[len(chunk):]
		for j := range chunk {
			hs[j] = s.hash32(&chunk[j])
			prefetch(unsafe.Pointer(&s.table[hs[j]>>s.shift]))
		}
		for j := range chunk {
			if idx[j] = s.residentHint(hs[j]); idx[j] != nilIdx {
				prefetch(unsafe.Pointer(&s.entries[idx[j]]))
			}
		}
		for j := range chunk {
			if idx[j] != nilIdx {
				prefetchLinks(unsafe.Pointer(&s.entries[0]), &idx[j])
			}
		}
	}
}

// prefetchVictim pulls in what the next eviction touches: the tail entry's
// table slot and the entry that becomes the tail after it. The tail entry
// itself was just touched by the caller. Called under the lock.
func (s *Store) prefetchVictim() {
	t := s.tail
	if t == nilIdx {
		return
	}
	e := &s.entries[t]
	prefetch(unsafe.Pointer(&s.table[s.hash32(&e.key)>>s.shift]))
	if e.prev != nilIdx {
		prefetch(unsafe.Pointer(&s.entries[e.prev]))
	}
}

// Contains reports whether k is in the window without refreshing its
// recency (so inspection never changes what gets evicted).
func (s *Store) Contains(k Key) bool {
	h := s.hash32(&k)
	s.warm(&k, h)
	s.mu.Lock()
	_, i := s.find(&k, h)
	s.mu.Unlock()
	return i != nilIdx
}

// Release forgets k if present: used when the event a key was recorded for
// failed to apply, so its retry is not mistaken for a duplicate. Releasing
// an absent key does nothing.
func (s *Store) Release(k Key) {
	h := s.hash32(&k)
	s.warm(&k, h)
	s.mu.Lock()
	slot, i := s.find(&k, h)
	if i != nilIdx {
		s.deleteSlot(slot)
		s.unlink(i)
		s.n--
		s.entries[i] = entry{next: s.free}
		s.free = i
	}
	s.mu.Unlock()
}

// Len returns the number of keys in the window (<= Capacity).
func (s *Store) Len() int {
	s.mu.Lock()
	n := s.n
	s.mu.Unlock()
	return int(n)
}

// Evictions returns how many keys CheckAndRecord has evicted since
// NewStore. After Capacity evictions following a key's last recording, that
// key has left the window: each eviction takes the least recently seen key,
// and fewer than Capacity keys are ever behind it (the window journal relies
// on this to drop entries nothing in the window needs).
func (s *Store) Evictions() uint64 { return s.evictions.Load() }

// Capacity returns the maximum number of keys the window remembers.
func (s *Store) Capacity() int { return int(s.capacity) }

// Keys appends the window's keys to dst from least to most recently seen and
// returns the extended slice. Recording them in that order with
// CheckAndRecord into an empty store of the same capacity restores the same
// window (same keys, same eviction order).
func (s *Store) Keys(dst []Key) []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	dst = slices.Grow(dst, int(s.n))
	for i := s.tail; i != nilIdx; i = s.entries[i].prev {
		dst = append(dst, s.entries[i].key)
	}
	return dst
}

package lrutable

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"unsafe"
)

// Nil ends a list and the free list, and is Find's index of an absent key.
const Nil = -1

// MaxEntries bounds a table's entries so that an index fits an int32 link
// and an index + 1 the low bits of a slot; callers clamp their capacities
// to it.
const MaxEntries = 1 << 30

// Key is what a table can hold as a key: 16 bytes, compared whole.
type Key interface{ ~[16]byte }

// Entry is one entry: the caller's value, its key and its place in a list.
// The value comes first so that an empty value (struct{}) adds no padding;
// the links sit beside the key because an eviction reads both.
type Entry[K Key, V any] struct {
	Val   V
	Key   K
	links Links
}

// Links places an entry in a List: Prev toward the head, Next toward the
// tail, Nil at the ends.
type Links struct{ Prev, Next int32 }

// List is a doubly linked list of entry indexes, owned by the caller (a
// zero List is not empty: use NewList). What its order means — recency,
// age of a change — is the caller's.
type List struct{ Head, Tail int32 }

// NewList returns an empty list.
func NewList() List { return List{Head: Nil, Tail: Nil} }

// Table is the hash table; see the package documentation. The zero value
// is unusable: call Init. Its methods are not safe for concurrent use,
// except the hints of prefetch.go (invariant 5).
type Table[K Key, V any] struct {
	// Read by every operation, written only by growth: on their own cache
	// lines, so that writes to the counters below (and to whatever the
	// caller puts next to the table, such as its lock) do not evict them.
	slots   []uint32 // invariant 1
	entries []Entry[K, V]
	seed0   uint64
	seed1   uint64
	nslots  uint32 // len(slots): home slot = h * nslots >> 32
	limit   int32  // most live entries the index holds (invariant 2)
	// The slot layout (invariant 1), fixed by limit: from the low bits,
	// index + 1 (idxMask), the probe distance (dOne is distance 1, dMax the
	// distance that means "dMax or more"), the fingerprint (from fpShift up).
	idxMask uint32
	dOne    uint32
	dMax    uint32
	idxBits uint8
	fpShift uint8
	_       [64]byte

	n       int32  // live entries
	used    int32  // indexes [0, used) have been handed out
	free    int32  // free list (via Links.Next), or Nil
	removed uint64 // entries removed so far (Removed)
}

// The load bound (invariant 2): a table of s slots holds at most
// s * loadNum / loadDen entries. 24 B entries need it above 0.5 for the
// window to stay within 32 B per entry with 4 B slots; linear probing's
// miss probes grow as 1/(1-load)², so not much above.
const (
	loadNum = 11
	loadDen = 20
)

// maxDistBits bounds the probe distance field: with linear probing at the
// load bound, displacements of 15 or more are rare enough that rereading
// the key for them costs nothing measurable, and the bits left over are the
// fingerprint's.
const maxDistBits = 4

// freed marks an entry on the free list (in Links.Prev, which is never
// below Nil in a live entry), so that growth can walk the entries array in
// order and skip dead indexes.
const freed = Nil - 1

// limitOf is the most live entries an index of slots slots holds.
func limitOf(slots int) int {
	return int(uint64(slots) * loadNum / loadDen)
}

// SlotsFor returns the smallest index that holds n entries within the load
// bound (invariant 2), and at least 8 slots.
func SlotsFor(n int) int {
	return max((n*loadDen+loadNum-1)/loadNum, 8)
}

// Bytes is what Init(slots, entries) allocates for a table of K and V:
// per entry the entry (with its links), and 4 B per slot.
func Bytes[K Key, V any](slots, entries int) int64 {
	return int64(unsafe.Sizeof(Entry[K, V]{}))*int64(entries) + 4*int64(slots)
}

// Init makes t an empty table of slots slots (at least 8, at most 1<<32 -
// 1) with room for entries entries before it allocates again. A table that
// must never grow gets Init(SlotsFor(n), n) and holds at most n entries.
func (t *Table[K, V]) Init(slots, entries int) {
	*t = Table[K, V]{
		entries: make([]Entry[K, V], entries),
		free:    Nil,
		seed0:   rand.Uint64(),
		seed1:   rand.Uint64() | 1,
	}
	t.setSlots(slots)
}

// setSlots makes an empty index of slots slots and fixes the slot layout
// for its limit: index + 1 never exceeds the limit, because a new index is
// handed out only while every lower one is live.
func (t *Table[K, V]) setSlots(slots int) {
	t.slots = make([]uint32, slots)
	t.nslots = uint32(slots)
	limit := min(limitOf(slots), MaxEntries)
	t.limit = int32(limit)
	t.setLayout(uint8(bits.Len32(uint32(limit))))
}

// setLayout gives index + 1 the low idxBits bits of a slot word (at most
// 32), the distance up to maxDistBits of the rest, and the fingerprint what
// remains. Tests call it on an empty table to try the layouts of tables too
// large to make.
func (t *Table[K, V]) setLayout(idxBits uint8) {
	t.idxBits = idxBits
	t.idxMask = uint32(1)<<idxBits - 1
	dbits := min(maxDistBits, 32-idxBits)
	t.dOne = uint32(1) << idxBits // 0 if idxBits is 32: the distance is then always dMax
	t.dMax = uint32(1)<<dbits - 1
	t.fpShift = idxBits + dbits
}

// Removed counts the entries removed (deleted or evicted) so far. An
// index Find or FindAll returned names the same key for as long as Removed
// does not change: only a removal frees an index for reuse.
func (t *Table[K, V]) Removed() uint64 { return t.removed }

// Len returns the number of live entries.
func (t *Table[K, V]) Len() int32 { return t.n }

// Slots returns the size of the hash index.
func (t *Table[K, V]) Slots() int { return len(t.slots) }

// Bytes returns what the table holds allocated now (see Bytes).
func (t *Table[K, V]) Bytes() int64 { return Bytes[K, V](len(t.slots), len(t.entries)) }

// At returns entry i. The pointer is valid until the table grows.
func (t *Table[K, V]) At(i int32) *Entry[K, V] { return &t.entries[i] }

// Next and Prev return the indexes after (toward the tail) and before
// (toward the head) live entry i in its list, or Nil.
func (t *Table[K, V]) Next(i int32) int32 { return t.entries[i].links.Next }
func (t *Table[K, V]) Prev(i int32) int32 { return t.entries[i].links.Prev }

// Hash mixes the whole key with the table's seed (a wyhash-style
// multiply-fold).
func (t *Table[K, V]) Hash(k *K) uint32 {
	b := (*[16]byte)(unsafe.Pointer(k))
	lo := binary.LittleEndian.Uint64(b[0:8])
	hi := binary.LittleEndian.Uint64(b[8:16])
	h1, h0 := bits.Mul64(lo^t.seed0, hi^t.seed1)
	return uint32((h1 ^ h0) >> 32)
}

// home is the home slot of hash h: its high bits scaled to the index
// ("fastrange"), so the index need not be a power of two. The fingerprint
// takes the low bits, which the home barely depends on.
func (t *Table[K, V]) home(h uint32) uint32 {
	return uint32(uint64(h) * uint64(t.nslots) >> 32)
}

// tag is the slot word of a key of hash h at distance 0 from its home,
// without the index: the word matches a slot word of that key at distance
// d ≥ 1 once dist(d) is added.
func (t *Table[K, V]) tag(h uint32) uint32 { return h << t.fpShift }

// word packs a slot word: entry i, at distance d from its home, of hash h.
func (t *Table[K, V]) word(i int32, d uint32, h uint32) uint32 {
	return t.tag(h) | min(d, t.dMax)*t.dOne | uint32(i+1)
}

// Find returns the slot and entry index of k, whose hash is h; for an
// absent k, the empty slot where the probe stopped and Nil. A slot word is
// compared whole but for the index: at distance d from k's home only an
// entry with the same fingerprint and the same home (distance field d, or
// dMax for d ≥ dMax) can hold k, so a miss seldom reads an entry.
func (t *Table[K, V]) Find(k *K, h uint32) (slot uint32, i int32) {
	slot = t.home(h)
	want, sat := t.tag(h), t.tag(h)|t.dMax*t.dOne
	for {
		v := t.slots[slot]
		if v == 0 {
			return slot, Nil
		}
		if v&^t.idxMask == want {
			i := int32(v&t.idxMask) - 1
			if t.entries[i].Key == *k {
				return slot, i
			}
		}
		if want != sat {
			want += t.dOne
		}
		if slot++; slot == t.nslots {
			slot = 0
		}
	}
}

// Insert adds k, absent, whose hash is h and whose probe Find ended at slot,
// and returns its index, in no list. With a victim list, that list's tail is
// evicted first (unlinked, dropped from the index) and its index reused,
// value and all; otherwise a freed or new index is used, its value zero.
// The index may grow (invariant 2), invalidating At's pointers.
func (t *Table[K, V]) Insert(k *K, h uint32, slot uint32, victim *List) int32 {
	var i int32
	if victim != nil {
		i = victim.Tail
		t.Unlink(victim, i)
		// The shift leaves one slot empty that was not, which may lie
		// earlier on k's probe path; every other slot there is still full.
		if hole := t.unindex(t.slotOf(i)); t.distance(hole, h) < t.distance(slot, h) {
			slot = hole
		}
		t.removed++
	} else {
		if t.n == t.limit {
			t.grow()
			slot, _ = t.Find(k, h)
		}
		i = t.alloc()
		t.entries[i].links.Prev = Nil // off the free list (growth skips freed)
	}
	t.entries[i].Key = *k
	atomic.StoreUint32(&t.slots[slot], t.word(i, t.distance(slot, h), h))
	t.n++
	return i
}

// distance is how far slot lies past the home of hash h, probing forward.
func (t *Table[K, V]) distance(slot, h uint32) uint32 {
	d := slot - t.home(h)
	if slot < t.home(h) {
		d += t.nslots
	}
	return d
}

// Delete drops live entry i, in no list, whose slot Find returned, and
// frees its index.
func (t *Table[K, V]) Delete(slot uint32, i int32) {
	t.unindex(slot)
	t.entries[i] = Entry[K, V]{}
	t.entries[i].links = Links{Prev: freed, Next: t.free}
	t.free = i
	t.removed++
}

// Evict drops the tail of l, which must not be empty, and frees its index,
// which it returns.
func (t *Table[K, V]) Evict(l *List) int32 {
	i := l.Tail
	t.Unlink(l, i)
	t.Delete(t.slotOf(i), i)
	return i
}

// Touch is one step of an exact LRU: l holds every entry of the table, most
// recently touched at the head, and at most capacity of them. A resident k
// moves to the head (added false); an absent k is added at the head (added
// true), after evicting the tail if the table holds capacity entries
// (evicted true). While the table is full it prefetches what the next
// eviction will touch.
func (t *Table[K, V]) Touch(l *List, k *K, h uint32, capacity int32) (added, evicted bool) {
	slot, i := t.Find(k, h)
	if i != Nil {
		if i != l.Head {
			wasTail := i == l.Tail
			t.Unlink(l, i)
			t.PushFront(l, i)
			if wasTail && t.n == capacity {
				t.PrefetchVictim(l)
			}
		}
		return false, false
	}
	var victim *List
	if t.n == capacity {
		victim = l
	}
	t.PushFront(l, t.Insert(k, h, slot, victim))
	if t.n == capacity {
		t.PrefetchVictim(l)
	}
	return true, victim != nil
}

// alloc hands out a freed index, or the next new one, growing the arrays
// as append would when they are used up.
func (t *Table[K, V]) alloc() int32 {
	if i := t.free; i != Nil {
		t.free = t.entries[i].links.Next
		return i
	}
	if int(t.used) == len(t.entries) {
		t.entries = slices.Grow(t.entries, 1)
		t.entries = t.entries[:cap(t.entries)]
	}
	i := t.used
	t.used++
	return i
}

// slotOf returns the slot of live entry i.
func (t *Table[K, V]) slotOf(i int32) uint32 {
	k := &t.entries[i].Key
	slot, _ := t.Find(k, t.Hash(k))
	return slot
}

// unindex empties slot and shifts the rest of its cluster back so every
// remaining key stays reachable from its home slot (invariant 1), and
// returns the slot it left empty. A slot's home comes from its distance
// field; only a distance of dMax or more rereads the entry's key.
func (t *Table[K, V]) unindex(hole uint32) uint32 {
	j, gap := hole, uint32(0)
	for {
		if j++; j == t.nslots {
			j = 0
		}
		v := t.slots[j]
		if v == 0 {
			break
		}
		gap++
		d := v >> t.idxBits & t.dMax
		if d == t.dMax {
			d = t.slotDistance(v, j)
		}
		// Move j into the hole unless its home lies cyclically in (hole, j].
		if d >= gap {
			v += (min(d-gap, t.dMax) - min(d, t.dMax)) * t.dOne
			atomic.StoreUint32(&t.slots[hole], v)
			hole, gap = j, 0
		}
	}
	atomic.StoreUint32(&t.slots[hole], 0)
	t.n--
	return hole
}

// slotDistance is the distance from its home of the entry whose word v is
// in slot j, from its key.
func (t *Table[K, V]) slotDistance(v, j uint32) uint32 {
	return t.distance(j, t.Hash(&t.entries[v&t.idxMask-1].Key))
}

// grow doubles the index and reinserts every live entry. The layout of a
// slot word depends on the limit, and a home on the size, so it rehashes
// the keys, walking the entries in order rather than the slots, whose
// order would make every key read a cache miss.
func (t *Table[K, V]) grow() {
	t.setSlots(2 * len(t.slots))
	for i := range t.used {
		e := &t.entries[i]
		if e.links.Prev == freed {
			continue
		}
		h := t.Hash(&e.Key)
		slot := t.home(h)
		d := uint32(0)
		for t.slots[slot] != 0 {
			if slot++; slot == t.nslots {
				slot = 0
			}
			d++
		}
		t.slots[slot] = t.word(i, d, h)
	}
}

// Unlink takes live entry i out of l.
func (t *Table[K, V]) Unlink(l *List, i int32) {
	p := t.entries[i].links
	if p.Prev != Nil {
		t.entries[p.Prev].links.Next = p.Next
	} else {
		l.Head = p.Next
	}
	if p.Next != Nil {
		t.entries[p.Next].links.Prev = p.Prev
	} else {
		l.Tail = p.Prev
	}
}

// PushFront puts live entry i, in no list, at the head of l.
func (t *Table[K, V]) PushFront(l *List, i int32) {
	t.entries[i].links = Links{Prev: Nil, Next: l.Head}
	if l.Head != Nil {
		t.entries[l.Head].links.Prev = i
	} else {
		l.Tail = i
	}
	l.Head = i
}

// PushBack puts live entry i, in no list, at the tail of l.
func (t *Table[K, V]) PushBack(l *List, i int32) {
	t.entries[i].links = Links{Prev: l.Tail, Next: Nil}
	if l.Tail != Nil {
		t.entries[l.Tail].links.Next = i
	} else {
		l.Head = i
	}
	l.Tail = i
}

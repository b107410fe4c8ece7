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

// MaxEntries bounds a table's entries so that an index + 1 fits the low 32
// bits of a slot and an int32 link; callers clamp their capacities to it.
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
	slots   []uint64 // invariant 1
	entries []Entry[K, V]
	seed0   uint64
	seed1   uint64
	mask    uint32
	shift   uint8 // home slot = hash >> shift
	_       [64]byte

	n    int32 // live entries
	used int32 // indexes [0, used) have been handed out
	free int32 // free list (via Links.Next), or Nil
}

// SlotsFor returns the smallest index that holds n entries at most half
// full (invariant 2): a power of two of at least 2n, and at least 8.
func SlotsFor(n int) int {
	return max(1<<bits.Len(uint(2*n-1)), 8)
}

// Bytes is what Init(slots, entries) allocates for a table of K and V:
// per entry the entry (with its links), and 8 B per slot.
func Bytes[K Key, V any](slots, entries int) int64 {
	return int64(unsafe.Sizeof(Entry[K, V]{}))*int64(entries) + 8*int64(slots)
}

// Init makes t an empty table of slots slots (a power of two, at least 8)
// with room for entries entries before it allocates again. A table that
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

func (t *Table[K, V]) setSlots(slots int) {
	t.slots = make([]uint64, slots)
	t.mask = uint32(slots - 1)
	t.shift = uint8(32 - bits.TrailingZeros(uint(slots)))
}

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

// Find returns the slot and entry index of k, whose hash is h; for an
// absent k, the empty slot where the probe stopped and Nil.
func (t *Table[K, V]) Find(k *K, h uint32) (slot uint32, i int32) {
	slot = h >> t.shift
	for {
		v := t.slots[slot]
		if v == 0 {
			return slot, Nil
		}
		if uint32(v>>32) == h {
			i := int32(uint32(v)) - 1
			if t.entries[i].Key == *k {
				return slot, i
			}
		}
		slot = (slot + 1) & t.mask
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
		t.unindex(t.slotOf(i))
		// The shift may have opened a hole earlier on k's probe path.
		slot, _ = t.Find(k, h)
	} else {
		i = t.alloc()
	}
	t.entries[i].Key = *k
	atomic.StoreUint64(&t.slots[slot], uint64(h)<<32|uint64(uint32(i)+1))
	t.n++
	if int(t.n) > len(t.slots)/2 {
		t.grow()
	}
	return i
}

// Delete drops live entry i, in no list, whose slot Find returned, and
// frees its index.
func (t *Table[K, V]) Delete(slot uint32, i int32) {
	t.unindex(slot)
	t.entries[i] = Entry[K, V]{}
	t.entries[i].links = Links{Prev: Nil, Next: t.free}
	t.free = i
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
// remaining key stays reachable from its home slot (invariant 1).
func (t *Table[K, V]) unindex(hole uint32) {
	j := hole
	for {
		j = (j + 1) & t.mask
		v := t.slots[j]
		if v == 0 {
			break
		}
		home := uint32(v>>32) >> t.shift
		// Move j into the hole unless its home lies cyclically in (hole, j].
		if (j-home)&t.mask >= (j-hole)&t.mask {
			atomic.StoreUint64(&t.slots[hole], v)
			hole = j
		}
	}
	atomic.StoreUint64(&t.slots[hole], 0)
	t.n--
}

// grow doubles the index and reinserts every slot word at its new home.
func (t *Table[K, V]) grow() {
	old := t.slots
	t.setSlots(2 * len(old))
	for _, v := range old {
		if v == 0 {
			continue
		}
		slot := uint32(v>>32) >> t.shift
		for t.slots[slot] != 0 {
			slot = (slot + 1) & t.mask
		}
		t.slots[slot] = v
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

package lrutable

import (
	"sync/atomic"
	"unsafe"
)

// Cache misses are most of an operation's cost on a large table. The hints
// here pull into cache the lines a later operation will touch, so that a
// caller can take the misses outside its lock, or overlap the misses of a
// whole batch instead of stalling each operation in turn. They change
// nothing and may run without the caller's lock (invariant 5).

// ResidentHint is the index in the first of the first four probe slots of
// hash h whose word could be a key of that hash (as Find compares it), or
// Nil: where a key of that hash most likely lives. It reads the slots with
// atomic loads and may be wrong (the fingerprint may collide, the table may
// change): a hint only.
func (t *Table[K, V]) ResidentHint(h uint32) int32 {
	slot := t.home(h)
	want := t.tag(h)
	for d := range uint32(4) {
		v := atomic.LoadUint32(&t.slots[slot])
		if v == 0 {
			return Nil
		}
		if v&^t.idxMask == want|min(d, t.dMax)*t.dOne {
			return int32(v&t.idxMask) - 1
		}
		if slot++; slot == t.nslots {
			slot = 0
		}
	}
	return Nil
}

// PrefetchEntry pulls in entry i, links and all.
func (t *Table[K, V]) PrefetchEntry(i int32) {
	Prefetch(unsafe.Pointer(&t.entries[i]))
}

// Warm pulls in what an operation on a key of hash h in list l touches:
// its probe slots and, if it is resident, its entry and its neighbours'
// links (a hit moves it), and the tail of l with the links of the entry
// that becomes the tail (a miss in a full l evicts it).
func (t *Table[K, V]) Warm(h uint32, l *List) {
	t.prefetchLinks(&l.Tail)
	if i := t.ResidentHint(h); i != Nil {
		t.prefetchLinks(&i)
	}
}

// PrefetchChunk is how many keys PrefetchKeys keeps in flight per pass:
// about what the CPU's outstanding-miss buffers hold, and small enough for
// the chunk's hashes and indexes to live on the stack.
const PrefetchChunk = 32

// PrefetchKeys is Warm for a whole batch of keys. Warm must load a key's
// slot to find its entry, and the entry's links to find its neighbours, so
// each call waits for two cache misses in turn; here each step is one pass
// over a chunk of keys — prefetch every home slot, then read the slots and
// prefetch the entries, then read the links and prefetch the neighbours —
// so a chunk's misses overlap.
func (t *Table[K, V]) PrefetchKeys(keys []K, l *List) {
	t.prefetchLinks(&l.Tail)
	var hs [PrefetchChunk]uint32
	var idx [PrefetchChunk]int32
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), PrefetchChunk)]
		keys = keys[len(chunk):]
		for j := range chunk {
			hs[j] = t.Hash(&chunk[j])
			Prefetch(unsafe.Pointer(&t.slots[t.home(hs[j])]))
		}
		for j := range chunk {
			if idx[j] = t.ResidentHint(hs[j]); idx[j] != Nil {
				t.PrefetchEntry(idx[j])
			}
		}
		for j := range chunk {
			if idx[j] != Nil {
				t.prefetchLinks(&idx[j])
			}
		}
	}
}

// PrefetchVictim pulls in what evicting the tail of l touches beyond the
// tail entry itself (which the caller just touched): the tail's slot and
// the entry and links of the entry that becomes the tail after it. It
// reads the table: call it where changes are excluded.
func (t *Table[K, V]) PrefetchVictim(l *List) {
	v := l.Tail
	if v == Nil {
		return
	}
	Prefetch(unsafe.Pointer(&t.slots[t.home(t.Hash(&t.entries[v].Key))]))
	if p := t.entries[v].links.Prev; p != Nil {
		t.PrefetchEntry(p)
	}
}

// prefetchLinks pulls in the entry whose index is *link, reading *link and
// that entry's links without synchronization (in assembly, see
// prefetchLinks in prefetch_amd64.go), and its neighbours' links.
func (t *Table[K, V]) prefetchLinks(link *int32) {
	e := unsafe.SliceData(t.entries)
	prefetchLinks(unsafe.Pointer(&e.links), unsafe.Pointer(e), unsafe.Sizeof(Entry[K, V]{}), link)
}

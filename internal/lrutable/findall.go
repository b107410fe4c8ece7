package lrutable

import "unsafe"

// FindAll's lookahead, in keys: while it finds key j, it reads the slot of
// key j+entryAhead (prefetched slotAhead-entryAhead keys before) and
// prefetches the entry that slot names, and prefetches the home slot of key
// j+slotAhead. Each of a lookup's two dependent misses thus has about
// entryAhead lookups' time to arrive, and about slotAhead lines are in
// flight at once — fewer than the CPU's outstanding-miss buffers, so none is
// dropped.
const (
	entryAhead = 8
	slotAhead  = 2 * entryAhead
	// aheadRing holds the hashes of the keys between j and j+slotAhead: a
	// power of two above slotAhead, so that a key's place in it is a mask.
	aheadRing = 32
)

var (
	_ = [1]struct{}{}[aheadRing&(aheadRing-1)]     // aheadRing is a power of two …
	_ = [1]struct{}{}[(aheadRing-slotAhead-1)>>63] // … above slotAhead
)

// FindAll is Find for a batch: idx[j] becomes the entry index of keys[j],
// or Nil if it is absent (idx must be at least as long as keys). An index
// stays valid while Removed is unchanged.
//
// A lookup in a large table waits for two cache misses in turn: the slot,
// then the entry it names. Prefetching a whole batch first (PrefetchKeys,
// Warm per key) overlaps them, but a batch of a thousand keys needs more
// lines than L1 holds and than the CPU keeps in flight, so by the time the
// lookups come many have been evicted or were never fetched. FindAll
// pipelines instead: it hashes each key once and prefetches each key's
// slot and then its entry a fixed distance ahead of the Find that reads
// them.
func (t *Table[K, V]) FindAll(keys []K, idx []int32) {
	n := len(keys)
	idx = idx[:n]
	var hs [aheadRing]uint32
	for j := -slotAhead; j < n; j++ {
		if a := j + slotAhead; a < n {
			h := t.Hash(&keys[a])
			hs[a&(aheadRing-1)] = h
			Prefetch(unsafe.Pointer(&t.slots[t.home(h)]))
		}
		if a := j + entryAhead; a >= 0 && a < n {
			if i := t.ResidentHint(hs[a&(aheadRing-1)]); i != Nil {
				t.PrefetchEntry(i)
			}
		}
		if j >= 0 {
			_, idx[j] = t.Find(&keys[j], hs[j&(aheadRing-1)])
		}
	}
}

package lrutable

import "fmt"

// Verify checks the table's invariants (1–3) given every list that holds
// its live entries, and returns the first violation found: each list is
// well linked and its entries are found at their own index from their home
// slot, every live entry is in exactly one of the lists and has exactly one
// slot, whose word carries its fingerprint and its distance from its home
// with no empty slot between, the index is within its load bound, and every
// other handed-out index is on the free list, marked freed. It walks
// everything: for tests, with the caller's changes excluded.
func (t *Table[K, V]) Verify(lists ...*List) error {
	listed := 0
	for li, l := range lists {
		prev := int32(Nil)
		for i := l.Head; i != Nil; i = t.entries[i].links.Next {
			if i < 0 || i >= t.used {
				return fmt.Errorf("list %d: index %d out of [0, %d)", li, i, t.used)
			}
			if t.entries[i].links.Prev != prev {
				return fmt.Errorf("list %d: entry %d: prev %d, want %d", li, i, t.entries[i].links.Prev, prev)
			}
			k := &t.entries[i].Key
			if _, j := t.Find(k, t.Hash(k)); j != i {
				return fmt.Errorf("list %d: key of entry %d found at %d", li, i, j)
			}
			prev = i
			if listed++; listed > int(t.n) {
				return fmt.Errorf("lists hold more than the %d live entries (a cycle, or an entry in two lists)", t.n)
			}
		}
		if prev != l.Tail {
			return fmt.Errorf("list %d: tail %d, walk ended at %d", li, l.Tail, prev)
		}
	}
	used := 0
	seen := make([]bool, t.used)
	for s, v := range t.slots {
		if v == 0 {
			continue
		}
		used++
		i := int32(v&t.idxMask) - 1
		if i < 0 || i >= t.used {
			return fmt.Errorf("slot %d: index %d out of [0, %d)", s, i, t.used)
		}
		if seen[i] {
			return fmt.Errorf("slot %d: entry %d has a second slot", s, i)
		}
		seen[i] = true
		if t.entries[i].links.Prev == freed {
			return fmt.Errorf("slot %d: entry %d is marked freed", s, i)
		}
		h := t.Hash(&t.entries[i].Key)
		d := t.distance(uint32(s), h)
		if want := t.word(i, d, h); v != want {
			return fmt.Errorf("slot %d: word %#x, want %#x (entry %d at distance %d, hash %#x)", s, v, want, i, d, h)
		}
		for j := t.home(h); j != uint32(s); j = (j + 1) % t.nslots {
			if t.slots[j] == 0 {
				return fmt.Errorf("slot %d: empty slot %d between it and its home %d", s, j, t.home(h))
			}
		}
	}
	if listed != int(t.n) || used != int(t.n) {
		return fmt.Errorf("n=%d, lists hold %d, slots %d", t.n, listed, used)
	}
	if used > int(t.limit) || int(t.limit) > limitOf(len(t.slots)) {
		return fmt.Errorf("%d of %d slots used: over the limit %d", used, len(t.slots), t.limit)
	}
	if t.idxMask < uint32(t.limit) {
		return fmt.Errorf("index field %#x too narrow for limit %d", t.idxMask, t.limit)
	}
	nfree := 0
	for i := t.free; i != Nil; i = t.entries[i].links.Next {
		if i < 0 || i >= t.used {
			return fmt.Errorf("free list: index %d out of [0, %d)", i, t.used)
		}
		if t.entries[i].links.Prev != freed {
			return fmt.Errorf("free list: entry %d not marked freed", i)
		}
		if nfree++; nfree > int(t.used-t.n) {
			return fmt.Errorf("free list longer than the %d dead indexes (a cycle, or a live entry on it)", t.used-t.n)
		}
	}
	if nfree != int(t.used-t.n) {
		return fmt.Errorf("free list holds %d, want %d (used %d - live %d)", nfree, t.used-t.n, t.used, t.n)
	}
	return nil
}

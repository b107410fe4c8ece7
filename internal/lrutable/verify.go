package lrutable

import "fmt"

// Verify checks the table's invariants (1–3) given every list that holds
// its live entries, and returns the first violation found: each list is
// well linked and its entries are found at their own index from their home
// slot, every live entry is in exactly one of the lists, the index is at
// most half full, and every other handed-out index is on the free list. It
// walks everything: for tests, with the caller's changes excluded.
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
	for s, v := range t.slots {
		if v == 0 {
			continue
		}
		used++
		i := int32(uint32(v)) - 1
		if i < 0 || i >= t.used {
			return fmt.Errorf("slot %d: index %d out of [0, %d)", s, i, t.used)
		}
		if h := t.Hash(&t.entries[i].Key); uint32(v>>32) != h {
			return fmt.Errorf("slot %d: hash %#x, entry %d's key hashes to %#x", s, v>>32, i, h)
		}
	}
	if listed != int(t.n) || used != int(t.n) {
		return fmt.Errorf("n=%d, lists hold %d, slots %d", t.n, listed, used)
	}
	if used > len(t.slots)/2 {
		return fmt.Errorf("%d of %d slots used: over half", used, len(t.slots))
	}
	freed := 0
	for i := t.free; i != Nil; i = t.entries[i].links.Next {
		if i < 0 || i >= t.used {
			return fmt.Errorf("free list: index %d out of [0, %d)", i, t.used)
		}
		if freed++; freed > int(t.used-t.n) {
			return fmt.Errorf("free list longer than the %d dead indexes (a cycle, or a live entry on it)", t.used-t.n)
		}
	}
	if freed != int(t.used-t.n) {
		return fmt.Errorf("free list holds %d, want %d (used %d - live %d)", freed, t.used-t.n, t.used, t.n)
	}
	return nil
}

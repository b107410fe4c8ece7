package lrutable

import (
	"slices"
	"testing"
)

// model is the reference for FuzzTwoLists: two ordered slices (head first)
// and the values, as the HWM cache uses a table — an LRU list of bounded
// length and a pinned list outside the bound.
type model struct {
	lists [2][]key
	vals  map[key]uint64
}

func (m *model) listOf(k key) int {
	for li, l := range m.lists {
		if slices.Contains(l, k) {
			return li
		}
	}
	return -1
}

func (m *model) remove(k key) {
	for li, l := range m.lists {
		if j := slices.Index(l, k); j >= 0 {
			m.lists[li] = slices.Delete(l, j, j+1)
		}
	}
}

const (
	fuzzCap  = 5  // bound on list 0
	fuzzKeys = 24 // keys in play
)

// FuzzTwoLists runs random operation sequences on a table that starts at 8
// slots and no entries (so it grows) with two lists — list 0 an LRU of at
// most fuzzCap entries whose tail is evicted by an insert, list 1 pinned,
// appended at its tail — against model, checking contents, order, values
// and the invariants (Verify) after every operation. Each operation is two
// bytes: what to do and to which key.
func FuzzTwoLists(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 1, 2, 3, 3, 0, 4, 2})
	f.Add([]byte{1, 1, 1, 2, 0, 1, 2, 2, 1, 1, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8, 5, 1})
	seq := make([]byte, 0, 400)
	for j := range 200 {
		seq = append(seq, byte(j*7%6), byte(j*13%fuzzKeys))
	}
	f.Add(seq)
	f.Fuzz(func(t *testing.T, ops []byte) {
		var tb Table[key, uint64]
		tb.Init(8, 0)
		lists := [2]List{NewList(), NewList()}
		m := model{vals: map[key]uint64{}}
		for n := 0; n+1 < len(ops); n += 2 {
			k := mkKey(uint64(ops[n+1] % fuzzKeys))
			h := tb.Hash(&k)
			slot, i := tb.Find(&k, h)
			if got, want := i != Nil, m.listOf(k) >= 0; got != want {
				t.Fatalf("op %d: key %d found %v, model %v", n/2, ops[n+1]%fuzzKeys, got, want)
			}
			val := uint64(n + 1)
			switch ops[n] % 6 {
			case 0: // put at the head of list 0, evicting its tail if it is full
				if i != Nil {
					tb.Unlink(&lists[m.listOf(k)], i)
				} else {
					var victim *List
					if len(m.lists[0]) == fuzzCap {
						victim = &lists[0]
						delete(m.vals, m.lists[0][fuzzCap-1])
						m.lists[0] = m.lists[0][:fuzzCap-1]
					}
					i = tb.Insert(&k, h, slot, victim)
				}
				m.remove(k)
				if len(m.lists[0]) == fuzzCap { // a moved key from list 1 overfills it
					tb.Evict(&lists[0])
					delete(m.vals, m.lists[0][fuzzCap-1])
					m.lists[0] = m.lists[0][:fuzzCap-1]
				}
				tb.PushFront(&lists[0], i)
				m.lists[0] = slices.Insert(m.lists[0], 0, k)
				tb.At(i).Val, m.vals[k] = val, val
			case 1: // pin at the tail of list 1
				if i != Nil {
					tb.Unlink(&lists[m.listOf(k)], i)
				} else {
					i = tb.Insert(&k, h, slot, nil)
				}
				m.remove(k)
				tb.PushBack(&lists[1], i)
				m.lists[1] = append(m.lists[1], k)
				tb.At(i).Val, m.vals[k] = val, val
			case 2: // delete
				if i != Nil {
					tb.Unlink(&lists[m.listOf(k)], i)
					tb.Delete(slot, i)
					m.remove(k)
					delete(m.vals, k)
				}
			case 3: // evict the tail of list 0
				if len(m.lists[0]) > 0 {
					tb.Evict(&lists[0])
					delete(m.vals, m.lists[0][len(m.lists[0])-1])
					m.lists[0] = m.lists[0][:len(m.lists[0])-1]
				}
			case 4: // read the value
				if i != Nil && tb.At(i).Val != m.vals[k] {
					t.Fatalf("op %d: value %d, model %d", n/2, tb.At(i).Val, m.vals[k])
				}
			case 5: // hints change nothing
				tb.Warm(h, &lists[0])
				tb.PrefetchKeys([]key{k, mkKey(uint64(ops[n] % fuzzKeys))}, &lists[1])
				if i != Nil {
					tb.PrefetchEntry(i)
				}
			}
			verify(t, &tb, &lists[0], &lists[1])
			for li := range lists {
				var got []key
				for j := lists[li].Head; j != Nil; j = tb.Next(j) {
					got = append(got, tb.At(j).Key)
					if tb.At(j).Val != m.vals[tb.At(j).Key] {
						t.Fatalf("op %d: list %d: value %d, model %d", n/2, li, tb.At(j).Val, m.vals[tb.At(j).Key])
					}
				}
				if !slices.Equal(got, m.lists[li]) && len(got)+len(m.lists[li]) > 0 {
					t.Fatalf("op %d: list %d is %v, model %v", n/2, li, got, m.lists[li])
				}
			}
		}
	})
}

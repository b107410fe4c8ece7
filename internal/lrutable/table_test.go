package lrutable

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	lru "github.com/hashicorp/golang-lru/v2"
)

type key [16]byte

func mkKey(n uint64) key {
	var k key
	binary.LittleEndian.PutUint64(k[:], n)
	binary.LittleEndian.PutUint64(k[8:], n*0x9e3779b97f4a7c15)
	return k
}

func verify(t testing.TB, tb interface{ Verify(...*List) error }, lists ...*List) {
	t.Helper()
	if err := tb.Verify(lists...); err != nil {
		t.Fatal(err)
	}
}

// The sizes the window's memory bound (idempotency.StoreBytes) and the
// cache's memory figure (session's doc) rest on.
func TestLayout(t *testing.T) {
	type rec struct{ a, b uint64 }
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"Entry[key, struct{}]", unsafe.Sizeof(Entry[key, struct{}]{}), 24},
		{"Entry[key, 16 B record]", unsafe.Sizeof(Entry[key, rec]{}), 40},
		{"Links", unsafe.Sizeof(Links{}), 8},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d B, want %d", c.name, c.got, c.want)
		}
	}
	if got := Bytes[key, struct{}](SlotsFor(100_000), 100_000); got != 24*100_000+8*(1<<18) {
		t.Errorf("Bytes = %d", got)
	}
}

func TestSlotsFor(t *testing.T) {
	for _, c := range []struct{ n, want int }{{1, 8}, {4, 8}, {5, 16}, {8, 16}, {9, 32}, {100_000, 1 << 18}, {1 << 17, 1 << 18}} {
		if got := SlotsFor(c.n); got != c.want {
			t.Errorf("SlotsFor(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

// lruRef is the exact-LRU reference: golang-lru with Get, so that a hit
// refreshes recency (its Contains does not).
type lruRef struct{ c *lru.Cache[key, struct{}] }

func (r lruRef) touch(k key) (added bool) {
	if _, ok := r.c.Get(k); ok {
		return false
	}
	r.c.Add(k, struct{}{})
	return true
}

// keysOf lists l from tail (least recent) to head, as golang-lru's Keys.
func keysOf[V any](tb *Table[key, V], l *List) []key {
	var ks []key
	for i := l.Tail; i != Nil; i = tb.Prev(i) {
		ks = append(ks, tb.At(i).Key)
	}
	return ks
}

// TestTouchAgainstLRU drives Touch (with Delete as a release and Find as a
// lookup) and golang-lru with the same random operations, far past
// capacity, and requires the same answers, lengths and recency order. Each
// capacity runs on a table sized once (as the window's) and on one that
// starts at 8 slots and no entries and grows (as the HWM cache's); the
// prefetch hints run in between and must change nothing.
func TestTouchAgainstLRU(t *testing.T) {
	steps := 50_000
	if testing.Short() {
		steps = 5_000
	}
	for _, capacity := range []int{1, 2, 3, 8, 100, 3000} {
		for _, grows := range []bool{false, true} {
			t.Run(fmt.Sprintf("cap%d/grows=%v", capacity, grows), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(capacity), 7))
				var tb Table[key, struct{}]
				if grows {
					tb.Init(8, 0)
				} else {
					tb.Init(SlotsFor(capacity), capacity)
				}
				l := NewList()
				c, err := lru.New[key, struct{}](capacity)
				if err != nil {
					t.Fatal(err)
				}
				ref := lruRef{c}
				universe := uint64(capacity + capacity/2 + 3)
				evictions := 0
				for step := range steps {
					k := mkKey(r.Uint64N(universe))
					if r.IntN(10) == 0 {
						k = mkKey(1<<40 + uint64(step))
					}
					h := tb.Hash(&k)
					switch op := r.IntN(100); {
					case op < 5:
						batch := make([]key, r.IntN(3*PrefetchChunk))
						for j := range batch {
							batch[j] = mkKey(r.Uint64N(universe))
						}
						tb.PrefetchKeys(batch, &l)
						tb.Warm(h, &l)
					case op < 75:
						full := ref.c.Len() == capacity
						added, evicted := tb.Touch(&l, &k, h, int32(capacity))
						if want := ref.touch(k); added != want || evicted != (want && full) {
							t.Fatalf("step %d: Touch = %v, %v; want %v, %v", step, added, evicted, want, want && full)
						}
						if evicted {
							evictions++
						}
					case op < 88:
						_, i := tb.Find(&k, h)
						if got, want := i != Nil, ref.c.Contains(k); got != want {
							t.Fatalf("step %d: found %v, want %v", step, got, want)
						}
					default:
						if slot, i := tb.Find(&k, h); i != Nil {
							tb.Unlink(&l, i)
							tb.Delete(slot, i)
						}
						ref.c.Remove(k)
					}
					if int(tb.Len()) != ref.c.Len() {
						t.Fatalf("step %d: Len %d, want %d", step, tb.Len(), ref.c.Len())
					}
					if step%(steps/20) == 0 || capacity <= 3 {
						if got, want := keysOf(&tb, &l), ref.c.Keys(); !slices.Equal(got, want) {
							t.Fatalf("step %d: order %v, want %v", step, got, want)
						}
						verify(t, &tb, &l)
					}
				}
				if evictions == 0 {
					t.Fatal("no evictions: the test did not reach capacity")
				}
				if !grows && tb.Slots() != SlotsFor(capacity) {
					t.Fatalf("a table sized by SlotsFor grew to %d slots", tb.Slots())
				}
			})
		}
	}
}

// collidingKeys returns, for a table of 16 slots, keys whose home slots are
// the given ones, in order.
func collidingKeys(tb *Table[key, struct{}], homes []uint32) []key {
	var ks []key
	used := map[key]bool{}
	for _, home := range homes {
		for n := uint64(0); ; n++ {
			k := mkKey(n)
			if h := tb.Hash(&k); h>>tb.shift == home && !used[k] {
				used[k] = true
				ks = append(ks, k)
				break
			}
		}
	}
	return ks
}

// TestBackwardShiftDeletion builds probe clusters on purpose — several keys
// of one home slot, a cluster that wraps from the last slot to the first,
// and keys of a later home inside an earlier cluster — and deletes their
// keys in every order: after each deletion every remaining key is found, no
// slot is left behind (no tombstones), and the invariants hold.
func TestBackwardShiftDeletion(t *testing.T) {
	for _, homes := range [][]uint32{
		{3, 3, 3, 4},     // one cluster, a later home inside it
		{14, 15, 15, 15}, // wraps past the last slot
		{15, 0, 15, 1},   // homes on both sides of the wrap
		{2, 3, 2, 5, 2},  // a cluster that reaches the next home
	} {
		var tb0 Table[key, struct{}]
		tb0.Init(16, 8)
		keys := collidingKeys(&tb0, homes)
		for _, order := range permutations(len(keys)) {
			var tb Table[key, struct{}]
			tb.Init(16, 8)
			tb.seed0, tb.seed1 = tb0.seed0, tb0.seed1 // so that the same keys collide
			l := NewList()
			for _, k := range keys {
				h := tb.Hash(&k)
				slot, _ := tb.Find(&k, h)
				tb.PushBack(&l, tb.Insert(&k, h, slot, nil))
			}
			verify(t, &tb, &l)
			for n, o := range order {
				k := keys[o]
				slot, i := tb.Find(&k, tb.Hash(&k))
				if i == Nil {
					t.Fatalf("homes %v order %v: key %d lost before its deletion", homes, order, o)
				}
				tb.Unlink(&l, i)
				tb.Delete(slot, i)
				verify(t, &tb, &l)
				for _, p := range order[n+1:] {
					if _, i := tb.Find(&keys[p], tb.Hash(&keys[p])); i == Nil {
						t.Fatalf("homes %v order %v: key %d unreachable after deleting %d", homes, order, p, o)
					}
				}
			}
			if tb.Len() != 0 || slices.ContainsFunc(tb.slots, func(v uint64) bool { return v != 0 }) {
				t.Fatalf("homes %v order %v: slots left behind: %x", homes, order, tb.slots)
			}
		}
	}
}

func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for at := 0; at <= len(p); at++ {
			out = append(out, slices.Insert(slices.Clone(p), at, n-1))
		}
	}
	return out
}

// TestGrowth fills a table from 8 slots and no entries: the index doubles
// whenever it passes half full, the entries grow as append would, every
// key stays found, and freed indexes are reused before new ones.
func TestGrowth(t *testing.T) {
	var tb Table[key, uint64]
	tb.Init(8, 0)
	l := NewList()
	const n = 5000
	for j := range uint64(n) {
		k := mkKey(j)
		h := tb.Hash(&k)
		slot, i := tb.Find(&k, h)
		if i != Nil {
			t.Fatalf("key %d found before its insert", j)
		}
		i = tb.Insert(&k, h, slot, nil)
		tb.At(i).Val = j
		tb.PushFront(&l, i)
		if int(tb.Len()) > tb.Slots()/2 || tb.Slots() > 8 && int(tb.Len()) <= tb.Slots()/4 {
			t.Fatalf("%d entries in %d slots", tb.Len(), tb.Slots())
		}
	}
	verify(t, &tb, &l)
	for j := range uint64(n) {
		k := mkKey(j)
		if _, i := tb.Find(&k, tb.Hash(&k)); i == Nil || tb.At(i).Val != j {
			t.Fatalf("key %d lost in growth", j)
		}
	}
	if want := cap(slices.Grow([]Entry[key, uint64](nil), n)); len(tb.entries) > 2*want {
		t.Fatalf("%d entries allocated for %d", len(tb.entries), n)
	}
	// Free three, then insert three: no new index is handed out.
	used := tb.used
	for range 3 {
		tb.Evict(&l)
	}
	verify(t, &tb, &l)
	for j := range uint64(3) {
		k := mkKey(n + j)
		h := tb.Hash(&k)
		slot, _ := tb.Find(&k, h)
		i := tb.Insert(&k, h, slot, nil)
		if tb.At(i).Val != 0 {
			t.Fatal("a freed index kept its value")
		}
		tb.PushFront(&l, i)
	}
	verify(t, &tb, &l)
	if tb.used != used {
		t.Fatalf("used %d after reusing freed indexes, want %d", tb.used, used)
	}
}

func TestOpsDoNotAllocate(t *testing.T) {
	const capacity = 100
	var tb Table[key, struct{}]
	tb.Init(SlotsFor(capacity), capacity)
	l := NewList()
	batch := make([]key, 2*PrefetchChunk+1)
	for j := range batch {
		batch[j] = mkKey(uint64(j))
	}
	n := uint64(0)
	if a := testing.AllocsPerRun(1000, func() {
		n++
		k := mkKey(n)
		h := tb.Hash(&k)
		tb.Warm(h, &l)
		tb.Touch(&l, &k, h, capacity)
		tb.Touch(&l, &k, h, capacity)
		if slot, i := tb.Find(&k, h); i != Nil {
			tb.Unlink(&l, i)
			tb.Delete(slot, i)
		}
		tb.PrefetchKeys(batch, &l)
	}); a != 0 {
		t.Fatalf("%v allocations per op set", a)
	}
}

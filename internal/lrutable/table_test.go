package lrutable

import (
	"encoding/binary"
	"fmt"
	"math/bits"
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
	// The window's default: 181,819 slots of 4 B, within 32 B per entry.
	if got := Bytes[key, struct{}](SlotsFor(100_000), 100_000); got != 24*100_000+4*181_819 || got > 32*100_000 {
		t.Errorf("Bytes = %d", got)
	}
}

// TestSlotsFor: SlotsFor(n) is the fewest slots (at least 8) that hold n
// entries at a load of at most 0.55, and Init's table of them takes n
// entries before it grows.
func TestSlotsFor(t *testing.T) {
	for _, c := range []struct{ n, want int }{{1, 8}, {4, 8}, {5, 10}, {8, 15}, {9, 17}, {100_000, 181_819}, {1 << 17, 238_313}, {MaxEntries, 1_952_257_862}} {
		if got := SlotsFor(c.n); got != c.want {
			t.Errorf("SlotsFor(%d) = %d, want %d", c.n, got, c.want)
		}
	}
	for n := 1; n < 1<<20; n += 1 + n/64 {
		s := SlotsFor(n)
		if float64(n) > 0.55*float64(s) {
			t.Fatalf("SlotsFor(%d) = %d: load %.4f", n, s, float64(n)/float64(s))
		}
		if s > 8 && float64(n) <= 0.55*float64(s-1) {
			t.Fatalf("SlotsFor(%d) = %d: %d slots would do", n, s, s-1)
		}
		var tb Table[key, struct{}]
		tb.Init(s, 0)
		if int(tb.limit) < n {
			t.Fatalf("SlotsFor(%d) = %d: the table holds %d", n, s, tb.limit)
		}
	}
}

// TestLayout: the slot word's fields by table size — the index takes the
// bits its limit needs, the distance four of the rest, the fingerprint the
// remainder — down to tables too large for a fingerprint or a full
// distance field, which stay correct (TestLayoutsAgainstLRU) at the cost
// of more key reads.
func TestSlotLayout(t *testing.T) {
	for _, c := range []struct {
		n             int
		idx, dist, fp int
	}{
		{4, 3, 4, 25},
		{100_000, 17, 4, 11}, // the window's default
		{1 << 24, 25, 4, 3},
		{1<<28 - 1, 28, 4, 0},
		{1 << 28, 29, 3, 0}, // the window's largest (idempotency.MaxCapacity)
		{1 << 29, 30, 2, 0},
		{MaxEntries, 31, 1, 0},
	} {
		limit := limitOf(SlotsFor(c.n))
		var tb Table[key, struct{}]
		tb.setLayout(uint8(bits.Len32(uint32(min(limit, MaxEntries)))))
		dist := bits.Len32(tb.dMax)
		if int(tb.idxBits) != c.idx || dist != c.dist || 32-int(tb.fpShift) != c.fp {
			t.Errorf("%d entries: index %d, distance %d, fingerprint %d bits; want %d, %d, %d",
				c.n, tb.idxBits, dist, 32-tb.fpShift, c.idx, c.dist, c.fp)
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
	for _, capacity := range []int{1, 2, 3, 8, 100, 3000} {
		for _, grows := range []bool{false, true} {
			t.Run(fmt.Sprintf("cap%d/grows=%v", capacity, grows), func(t *testing.T) {
				touchAgainstLRU(t, capacity, grows, 0)
			})
		}
	}
}

// TestLayoutsAgainstLRU is TestTouchAgainstLRU on tables sized once whose
// slot words have the layouts of tables too large to make here (2^28 to
// 2^30 entries and beyond): fewer distance bits (so more probes past the
// saturated distance, whose deletion rereads keys) and no fingerprint, down
// to a word that is all index.
func TestLayoutsAgainstLRU(t *testing.T) {
	for _, idxBits := range []uint8{28, 29, 30, 31, 32} {
		for _, capacity := range []int{3, 100, 3000} {
			t.Run(fmt.Sprintf("idx%d/cap%d", idxBits, capacity), func(t *testing.T) {
				touchAgainstLRU(t, capacity, false, idxBits)
			})
		}
	}
}

// touchAgainstLRU runs TestTouchAgainstLRU's operations on a table of
// capacity entries, one that grows or not, with the slot layout of idxBits
// index bits if not 0.
func touchAgainstLRU(t *testing.T, capacity int, grows bool, idxBits uint8) {
	steps := 50_000
	if testing.Short() {
		steps = 5_000
	}
	r := rand.New(rand.NewPCG(uint64(capacity), 7))
	var tb Table[key, struct{}]
	if grows {
		tb.Init(8, 0)
	} else {
		tb.Init(SlotsFor(capacity), capacity)
	}
	if idxBits != 0 {
		tb.setLayout(idxBits)
	}
	l := NewList()
	c, err := lru.New[key, struct{}](capacity)
	if err != nil {
		t.Fatal(err)
	}
	ref := lruRef{c}
	universe := uint64(capacity + capacity/2 + 3)
	evictions, deletes := 0, 0
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
			// FindAll agrees with Find, whatever the batch's length
			// against its lookahead; some keys were never inserted.
			for j := range batch {
				if r.IntN(4) == 0 {
					batch[j] = mkKey(1<<41 + r.Uint64())
				}
			}
			idx := make([]int32, len(batch)+1)
			idx[len(batch)] = -7 // past the batch: left alone
			tb.FindAll(batch, idx)
			for j := range batch {
				if _, want := tb.Find(&batch[j], tb.Hash(&batch[j])); idx[j] != want {
					t.Fatalf("step %d: FindAll's key %d of %d at %d, Find's at %d", step, j, len(batch), idx[j], want)
				}
			}
			if idx[len(batch)] != -7 {
				t.Fatalf("step %d: FindAll wrote past its batch", step)
			}
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
				deletes++
			}
			ref.c.Remove(k)
		}
		if got, want := tb.Removed(), uint64(evictions+deletes); got != want {
			t.Fatalf("step %d: Removed %d, want %d evictions + deletes", step, got, want)
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
}

// collidingKeys returns, for a table of 16 slots, keys whose home slots are
// the given ones, in order.
func collidingKeys(tb *Table[key, struct{}], homes []uint32) []key {
	var ks []key
	used := map[key]bool{}
	for _, home := range homes {
		for n := uint64(0); ; n++ {
			k := mkKey(n)
			if h := tb.Hash(&k); tb.home(h) == home && !used[k] {
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
// slot is left behind (no tombstones), and the invariants hold. It runs
// with the slot layout of this small table and with those of the largest
// ones, whose distance field saturates at 7, 3, 1 and 0 (so deletion
// rereads keys to find their homes).
func TestBackwardShiftDeletion(t *testing.T) {
	for _, idxBits := range []uint8{0, 29, 30, 31, 32} {
		for _, homes := range [][]uint32{
			{3, 3, 3, 4},        // one cluster, a later home inside it
			{14, 15, 15, 15},    // wraps past the last slot
			{15, 0, 15, 1},      // homes on both sides of the wrap
			{2, 3, 2, 5, 2},     // a cluster that reaches the next home
			{9, 9, 9, 9, 10, 9}, // distances up to 5
		} {
			backwardShiftDeletion(t, idxBits, homes)
		}
	}
}

func backwardShiftDeletion(t *testing.T, idxBits uint8, homes []uint32) {
	var tb0 Table[key, struct{}]
	tb0.Init(16, 8)
	keys := collidingKeys(&tb0, homes)
	for _, order := range permutations(len(keys)) {
		var tb Table[key, struct{}]
		tb.Init(16, 8)
		if idxBits != 0 {
			tb.setLayout(idxBits)
		}
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
				t.Fatalf("idx%d homes %v order %v: key %d lost before its deletion", idxBits, homes, order, o)
			}
			tb.Unlink(&l, i)
			tb.Delete(slot, i)
			verify(t, &tb, &l)
			for _, p := range order[n+1:] {
				if _, i := tb.Find(&keys[p], tb.Hash(&keys[p])); i == Nil {
					t.Fatalf("idx%d homes %v order %v: key %d unreachable after deleting %d", idxBits, homes, order, p, o)
				}
			}
		}
		if tb.Len() != 0 || slices.ContainsFunc(tb.slots, func(v uint32) bool { return v != 0 }) {
			t.Fatalf("idx%d homes %v order %v: slots left behind: %x", idxBits, homes, order, tb.slots)
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
// whenever it would pass its load bound, the entries grow as append would, every
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
		if int(tb.Len()) > limitOf(tb.Slots()) || tb.Slots() > 8 && int(tb.Len()) <= limitOf(tb.Slots()/2) {
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
	idx := make([]int32, len(batch))
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
		tb.FindAll(batch, idx)
	}); a != 0 {
		t.Fatalf("%v allocations per op set", a)
	}
}

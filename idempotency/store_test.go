package idempotency

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/oncewal/oncewal/internal/lrutable"
)

func key(n uint64) Key {
	var k Key
	binary.LittleEndian.PutUint64(k[:], n)
	binary.LittleEndian.PutUint64(k[8:], n*0x9e3779b97f4a7c15)
	return k
}

// checkInvariants verifies the internal structure: the recency list holds
// every live key, each reachable from its home slot, and counts match
// (lrutable.Table.Verify).
func checkInvariants(t testing.TB, s *Store) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.t.Verify(&s.lru); err != nil {
		t.Fatal(err)
	}
}

func TestStoreDefaults(t *testing.T) {
	for _, c := range []int{0, -5} {
		if got := NewStore(c).Capacity(); got != DefaultCapacity {
			t.Fatalf("NewStore(%d).Capacity() = %d", c, got)
		}
	}
	if got := NewStore(7).Capacity(); got != 7 {
		t.Fatalf("capacity %d", got)
	}
}

func TestStoreNewThenDuplicate(t *testing.T) {
	s := NewStore(10)
	if s.Len() != 0 || s.Contains(key(1)) {
		t.Fatal("fresh store not empty")
	}
	if !s.CheckAndRecord(key(1)) {
		t.Fatal("first sighting reported duplicate")
	}
	if s.CheckAndRecord(key(1)) {
		t.Fatal("second sighting reported new")
	}
	if !s.Contains(key(1)) || s.Len() != 1 {
		t.Fatal("key not remembered")
	}
	checkInvariants(t, s)
}

func TestStoreEvictsLeastRecentlySeen(t *testing.T) {
	s := NewStore(3)
	for _, n := range []uint64{1, 2, 3} {
		s.CheckAndRecord(key(n))
	}
	if s.CheckAndRecord(key(1)) { // refreshes 1: order now 2,3,1
		t.Fatal("dup")
	}
	s.CheckAndRecord(key(4)) // evicts 2
	if s.Contains(key(2)) {
		t.Fatal("2 should have been evicted (least recently seen)")
	}
	for _, n := range []uint64{1, 3, 4} {
		if !s.Contains(key(n)) {
			t.Fatalf("%d evicted", n)
		}
	}
	if got := s.Keys(nil); fmt.Sprint(got) != fmt.Sprint([]Key{key(3), key(1), key(4)}) {
		t.Fatalf("order %v", got)
	}
	checkInvariants(t, s)
}

func TestStoreContainsDoesNotRefresh(t *testing.T) {
	s := NewStore(2)
	s.CheckAndRecord(key(1))
	s.CheckAndRecord(key(2))
	if !s.Contains(key(1)) {
		t.Fatal("missing")
	}
	s.CheckAndRecord(key(3)) // 1 is still the oldest
	if s.Contains(key(1)) || !s.Contains(key(2)) {
		t.Fatal("Contains refreshed recency")
	}
}

func TestStoreNothingEvictedBeforeFull(t *testing.T) {
	const c = 1000
	s := NewStore(c)
	for i := range uint64(c) {
		if !s.CheckAndRecord(key(i)) {
			t.Fatalf("key %d dup", i)
		}
		if s.Len() != int(i+1) {
			t.Fatalf("len %d after %d", s.Len(), i+1)
		}
	}
	for i := range uint64(c) {
		if !s.Contains(key(i)) {
			t.Fatalf("key %d evicted before full", i)
		}
	}
	s.CheckAndRecord(key(c))
	if s.Len() != c || s.Contains(key(0)) {
		t.Fatal("eviction at capacity wrong")
	}
	checkInvariants(t, s)
}

// TestStoreRemembersLastCapacityDistinct is the window guarantee: after any
// history, the last capacity distinct keys seen are all present.
func TestStoreRemembersLastCapacityDistinct(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const c = 500
	s := NewStore(c)
	var hist []uint64
	for i := 0; i < 20000; i++ {
		n := r.Uint64N(1500)
		s.CheckAndRecord(key(n))
		hist = append(hist, n)
		if i%997 == 0 {
			distinct := map[uint64]bool{}
			for j := len(hist) - 1; j >= 0 && len(distinct) < c; j-- {
				distinct[hist[j]] = true
			}
			for n := range distinct {
				if !s.Contains(key(n)) {
					t.Fatalf("step %d: recent key %d forgotten", i, n)
				}
			}
			if s.Len() != len(distinct) {
				t.Fatalf("len %d, want %d", s.Len(), len(distinct))
			}
		}
	}
}

func TestStoreRelease(t *testing.T) {
	s := NewStore(3)
	s.CheckAndRecord(key(1))
	s.CheckAndRecord(key(2))
	s.CheckAndRecord(key(3))
	s.Release(key(2))
	s.Release(key(99)) // absent: no-op
	if s.Len() != 2 || s.Contains(key(2)) {
		t.Fatal("release did not forget")
	}
	// The freed slot is reused: nothing is evicted until full again.
	if !s.CheckAndRecord(key(4)) || !s.Contains(key(1)) || s.Len() != 3 {
		t.Fatal("insert after release evicted")
	}
	if !s.CheckAndRecord(key(2)) {
		t.Fatal("released key must be new again")
	}
	if s.Contains(key(1)) {
		t.Fatal("1 was least recently seen")
	}
	for range 3 {
		s.Release(key(2))
		s.Release(key(3))
		s.Release(key(4))
	}
	if s.Len() != 0 || len(s.Keys(nil)) != 0 {
		t.Fatal("not empty")
	}
	checkInvariants(t, s)
	if !s.CheckAndRecord(key(5)) || s.Len() != 1 {
		t.Fatal("reuse after emptying")
	}
	checkInvariants(t, s)
}

func TestStoreKeysRestore(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	a := NewStore(200)
	for range 5000 {
		a.CheckAndRecord(key(r.Uint64N(400)))
	}
	prefix := []Key{key(1 << 60)}
	snap := a.Keys(prefix)
	if snap[0] != prefix[0] || len(snap) != 1+a.Len() {
		t.Fatalf("Keys must append: %d", len(snap))
	}
	b := NewStore(200)
	for _, k := range snap[1:] {
		if !b.CheckAndRecord(k) {
			t.Fatal("snapshot holds a duplicate")
		}
	}
	if fmt.Sprint(b.Keys(nil)) != fmt.Sprint(a.Keys(nil)) {
		t.Fatal("restored order differs")
	}
	for range 5000 {
		k := key(r.Uint64N(400))
		if a.CheckAndRecord(k) != b.CheckAndRecord(k) {
			t.Fatal("restored store decides differently")
		}
	}
}

// model is the reference window: golang-lru with Get for the
// duplicate-refreshes-recency semantics (its Contains and ContainsOrAdd do
// not refresh).
type model struct{ c *lru.Cache[Key, struct{}] }

func (m model) checkAndRecord(k Key) bool {
	if _, ok := m.c.Get(k); ok {
		return false
	}
	m.c.Add(k, struct{}{})
	return true
}

// TestStoreDifferential drives the store and golang-lru with long random
// sequences — inserts, duplicates, Contains, releases, churn far past
// capacity — and requires identical decisions, lengths and orders.
func TestStoreDifferential(t *testing.T) {
	steps := 200_000
	switch {
	case os.Getenv("ONCEWAL_LONG") != "":
		steps = 2_000_000
	case testing.Short():
		steps = 20_000
	case raceEnabled:
		steps = 50_000
	}
	for _, c := range []int{1, 2, 3, 8, 64, 1000, 4096} {
		for seed := uint64(0); seed < 3; seed++ {
			t.Run(fmt.Sprintf("cap%d/seed%d", c, seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, uint64(c)))
				s := NewStore(c)
				lc, err := lru.New[Key, struct{}](c)
				if err != nil {
					t.Fatal(err)
				}
				m := model{lc}
				// Universe a bit larger than capacity keeps a mix of hits,
				// evicted keys coming back and fresh keys.
				universe := uint64(c + c/2 + 3)
				fresh := uint64(1 << 40)
				for i := 0; i < steps; i++ {
					var k Key
					if r.IntN(10) == 0 {
						fresh++
						k = key(fresh)
					} else {
						k = key(r.Uint64N(universe))
					}
					switch op := r.IntN(100); {
					case op < 5:
						// A hint: the model does not change. Batches
						// cross PrefetchKeys's chunks.
						batch := make([]Key, r.IntN(3*lrutable.PrefetchChunk))
						for j := range batch {
							batch[j] = key(r.Uint64N(universe))
						}
						s.PrefetchKeys(batch)
					case op < 75:
						if got, want := s.CheckAndRecord(k), m.checkAndRecord(k); got != want {
							t.Fatalf("step %d CheckAndRecord(%v) = %v, model %v", i, k, got, want)
						}
					case op < 88:
						if got, want := s.Contains(k), m.c.Contains(k); got != want {
							t.Fatalf("step %d Contains = %v, model %v", i, got, want)
						}
					default:
						s.Release(k)
						m.c.Remove(k)
					}
					if s.Len() != m.c.Len() {
						t.Fatalf("step %d Len %d, model %d", i, s.Len(), m.c.Len())
					}
					if i%(steps/10) == 0 {
						if fmt.Sprint(s.Keys(nil)) != fmt.Sprint(m.c.Keys()) {
							t.Fatalf("step %d: key order differs", i)
						}
						checkInvariants(t, s)
					}
				}
				if fmt.Sprint(s.Keys(nil)) != fmt.Sprint(m.c.Keys()) {
					t.Fatal("final key order differs")
				}
				checkInvariants(t, s)
			})
		}
	}
}

// TestStoreConcurrentExactlyOnce: goroutines race to record overlapping
// keys; each key must be reported new exactly once.
func TestStoreConcurrentExactlyOnce(t *testing.T) {
	const keys, workers = 20_000, 4
	s := NewStore(keys)
	var wins [workers][]uint64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for _, n := range r.Perm(keys) {
				if s.CheckAndRecord(key(uint64(n))) {
					wins[w] = append(wins[w], uint64(n))
				}
			}
		}()
	}
	wg.Wait()
	count := map[uint64]int{}
	for _, ws := range wins {
		for _, n := range ws {
			count[n]++
		}
	}
	if len(count) != keys {
		t.Fatalf("%d keys won, want %d", len(count), keys)
	}
	for n, c := range count {
		if c != 1 {
			t.Fatalf("key %d reported new %d times", n, c)
		}
	}
	checkInvariants(t, s)
}

// TestStoreConcurrentMixed runs every operation concurrently under churn
// (meaningful with -race) and then checks the structure.
func TestStoreConcurrentMixed(t *testing.T) {
	s := NewStore(512)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 11))
			var buf []Key
			for i := range 20_000 {
				k := key(r.Uint64N(2000))
				switch r.IntN(10) {
				case 0:
					s.Release(k)
				case 1:
					s.Contains(k)
					s.PrefetchKeys([]Key{k, key(r.Uint64N(2000))})
				case 2:
					if i%100 == 0 {
						buf = s.Keys(buf[:0])
						if len(buf) > s.Capacity() {
							panic("too many keys")
						}
					}
					_ = s.Len()
				default:
					s.CheckAndRecord(k)
				}
			}
		}()
	}
	wg.Wait()
	checkInvariants(t, s)
}

func TestStoreOpsDoNotAllocate(t *testing.T) {
	s := NewStore(100)
	i := uint64(0)
	batch := make([]Key, 2*lrutable.PrefetchChunk+1)
	for j := range batch {
		batch[j] = key(uint64(j))
	}
	if a := testing.AllocsPerRun(1000, func() {
		i++
		s.CheckAndRecord(key(i))
		s.CheckAndRecord(key(i))
		s.Contains(key(i - 3))
		s.Release(key(i - 1))
		s.PrefetchKeys(batch)
	}); a != 0 {
		t.Fatalf("%v allocs per op set", a)
	}
}

// liveHeap returns the live heap after a full GC.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestStoreMemoryBound: a full DefaultCapacity window stays within 10 MB of
// live heap, freshly filled and after churn (1M inserts by default, 10M
// with ONCEWAL_LONG=1).
func TestStoreMemoryBound(t *testing.T) {
	churn := 1_000_000
	if os.Getenv("ONCEWAL_LONG") != "" {
		churn = 10_000_000
	}
	if testing.Short() || raceEnabled {
		churn = 200_000
	}
	const limit = 10 << 20
	before := liveHeap()
	s := NewStore(DefaultCapacity)
	n := uint64(0)
	for ; n < DefaultCapacity; n++ {
		s.CheckAndRecord(key(n))
	}
	fresh := liveHeap() - before
	for ; n < DefaultCapacity+uint64(churn); n++ {
		s.CheckAndRecord(key(n))
	}
	churned := liveHeap() - before
	runtime.KeepAlive(s)
	t.Logf("live heap: fresh %d B (%.1f B/entry), after %d churn inserts %d B (%.1f B/entry)",
		fresh, float64(fresh)/DefaultCapacity, churn, churned, float64(churned)/DefaultCapacity)
	if fresh > limit || churned > limit {
		t.Fatalf("over the 10 MB bound: fresh %d, churned %d", fresh, churned)
	}
	if s.Len() != DefaultCapacity {
		t.Fatalf("len %d", s.Len())
	}
}

func TestStoreBytesMatchesAllocation(t *testing.T) {
	for _, c := range []int{1, 3, 100, 100_000} {
		s := NewStore(c)
		want := s.t.Bytes()
		if got := StoreBytes(c); got != want {
			t.Fatalf("StoreBytes(%d) = %d, NewStore allocated %d", c, got, want)
		}
	}
}

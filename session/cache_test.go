package session

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"testing"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/stretchr/testify/require"
)

// checkCache verifies the cache's structure — list and table agree, every
// entry is reachable from its home slot, counts match, the bound holds — and
// returns its contents from least to most recently put.
func checkCache(t testing.TB, c *hwmCache) (ids []ID, recs []record) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	ids, recs = []ID{}, []record{}
	next := int32(nilIdx)
	for i := c.tail; i != nilIdx; i = c.links[i].prev {
		if c.links[i].next != next {
			t.Fatalf("entry %d: next %d, want %d", i, c.links[i].next, next)
		}
		id := c.entries[i].id
		if _, j := c.find(&id, c.hash32(&id)); j != i {
			t.Fatalf("ID %s of entry %d found at %d", id, i, j)
		}
		r, _ := c.peek(&id)
		ids, recs = append(ids, id), append(recs, r)
		next = i
		if len(ids) > int(c.capacity) {
			t.Fatal("list longer than capacity (cycle?)")
		}
	}
	if next != c.head {
		t.Fatalf("head %d, walk ended at %d", c.head, next)
	}
	used := 0
	for _, v := range c.table {
		if v != 0 {
			used++
		}
	}
	if len(ids) != int(c.n) || used != int(c.n) {
		t.Fatalf("n=%d list=%d table=%d", c.n, len(ids), used)
	}
	if len(c.table) > c.maxSlots || (len(c.table) < c.maxSlots && used > len(c.table)/2) {
		t.Fatalf("table of %d slots (max %d) holds %d", len(c.table), c.maxSlots, used)
	}
	return ids, recs
}

func cacheID(n uint64) ID {
	var id ID
	binary.LittleEndian.PutUint64(id[:], n)
	binary.LittleEndian.PutUint64(id[8:], n*0x9e3779b97f4a7c15)
	return id
}

// TestHWMCacheAgainstLRU drives the cache and golang-lru/v2 (the reference:
// Add = put, Remove = remove, Peek = peek) with the same random operations and
// requires the same answers and the same contents in the same recency order
// after every step. Capacities cover a single entry, eviction with a small
// table, and growth of the table. ONCEWAL_LONG=1 runs 20x more steps.
func TestHWMCacheAgainstLRU(t *testing.T) {
	steps := 20_000
	if os.Getenv("ONCEWAL_LONG") != "" {
		steps *= 20
	}
	for _, tc := range []struct{ capacity, ids int }{{1, 4}, {3, 10}, {64, 200}, {5000, 8000}} {
		rng := rand.New(rand.NewPCG(uint64(tc.capacity), 5))
		c := newHWMCache(tc.capacity)
		ref, err := lru.New[ID, record](tc.capacity)
		require.NoError(t, err)
		for step := range steps {
			id := cacheID(uint64(rng.IntN(tc.ids)))
			switch op := rng.IntN(10); {
			case op < 5:
				r := record{hwm: SeqNo(1 + rng.IntN(1000)), lastTS: rng.Int64() - rng.Int64(), closed: rng.IntN(4) == 0}
				c.mu.Lock()
				c.put(&id, r)
				c.mu.Unlock()
				ref.Add(id, r)
			case op < 7:
				c.mu.Lock()
				c.remove(&id)
				c.mu.Unlock()
				ref.Remove(id)
			default:
				got, ok := c.peek(&id)
				want, wantOK := ref.Peek(id)
				require.Equal(t, wantOK, ok, "capacity %d step %d", tc.capacity, step)
				require.Equal(t, want, got, "capacity %d step %d", tc.capacity, step)
			}
			if step%97 == 0 || tc.capacity < 100 {
				ids, recs := checkCache(t, c)
				require.Equal(t, ref.Keys(), ids, "capacity %d step %d: contents or order", tc.capacity, step)
				require.Equal(t, ref.Values(), recs, "capacity %d step %d", tc.capacity, step)
			}
		}
		require.Equal(t, ref.Len(), c.len())
	}
}

// TestHWMCacheGrowsToCapacity fills a cache of 100K: the table grows from
// its first size by doubling, nothing is evicted before the bound, and the
// arrays end at the capacity's size.
func TestHWMCacheGrowsToCapacity(t *testing.T) {
	const capacity = 100_000
	c := newHWMCache(capacity)
	require.Equal(t, minSlots, len(c.table))
	c.mu.Lock()
	for n := range uint64(capacity) {
		id := cacheID(n)
		c.put(&id, record{hwm: SeqNo(n + 1), lastTS: int64(n)})
	}
	c.mu.Unlock()
	require.Equal(t, capacity, c.len())
	require.Equal(t, c.maxSlots, len(c.table))
	for n := range uint64(capacity) {
		id := cacheID(n)
		if r, ok := c.peek(&id); !ok || r != (record{hwm: SeqNo(n + 1), lastTS: int64(n)}) {
			t.Fatalf("session %d: %+v %v before the cache was full", n, r, ok)
		}
	}
	c.mu.Lock()
	id := cacheID(capacity)
	c.put(&id, record{hwm: 1})
	c.mu.Unlock()
	first := cacheID(0)
	_, ok := c.peek(&first)
	require.False(t, ok, "the least recently put session stays past the bound")
	checkCache(t, c)
}

// TestHWMCacheUnrepresentableHWM: the top HWM bit holds the closed flag, so a
// record using it is not cached (it is read from Pebble instead) and an
// older cached value of that session is dropped, never left stale.
func TestHWMCacheUnrepresentableHWM(t *testing.T) {
	c := newHWMCache(4)
	id := cacheID(1)
	c.mu.Lock()
	c.put(&id, record{hwm: 7, closed: true, lastTS: -3})
	c.mu.Unlock()
	r, ok := c.peek(&id)
	require.True(t, ok)
	require.Equal(t, record{hwm: 7, closed: true, lastTS: -3}, r)
	c.mu.Lock()
	c.put(&id, record{hwm: 1 << 63})
	c.mu.Unlock()
	_, ok = c.peek(&id)
	require.False(t, ok)
	checkCache(t, c)
}

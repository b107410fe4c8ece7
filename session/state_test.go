package session

import (
	"encoding/binary"
	"sort"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

func le(v int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(v)) }

// TestStatePutDeleteAdd runs on a plain batch (the tx remembers its pending
// counters) and on an indexed one (Add reads the batch itself).
func TestStatePutDeleteAdd(t *testing.T) {
	for _, indexed := range []bool{false, true} {
		name := "plain"
		if indexed {
			name = "indexed"
		}
		t.Run(name, func(t *testing.T) { testStatePutDeleteAdd(t, indexed) })
	}
}

func testStatePutDeleteAdd(t *testing.T, indexed bool) {
	db := testutil.MemDB(t)
	s := NewState(db)
	a, c := NewID(), NewID()
	// a committed counter the batch builds on
	pre := db.NewBatch()
	require.NoError(t, s.Begin(pre).Add(a, []byte("c"), 40))
	require.NoError(t, pre.Commit(pebble.Sync))
	pre.Close()

	b := db.NewBatch()
	if indexed {
		b = db.NewIndexedBatch()
	}
	tx := s.Begin(b)
	require.NoError(t, tx.Add(a, []byte("c"), 2))
	require.NoError(t, tx.Add(a, []byte("c"), 1))
	buf := []byte("v1")
	require.NoError(t, tx.Put(a, []byte("k"), buf))
	buf[0] = 'X' // caller reuses its buffer
	require.NoError(t, tx.Add(a, []byte("n"), 5))
	require.NoError(t, tx.Add(a, []byte("n"), 7)) // Add after Add in one batch
	require.NoError(t, tx.Put(a, []byte("p"), le(100)))
	require.NoError(t, tx.Add(a, []byte("p"), -1)) // Add after Put in one batch
	require.NoError(t, tx.Put(a, []byte("q"), []byte("abc")))
	require.NoError(t, tx.Add(a, []byte("q"), 3)) // other length counts as 0
	require.NoError(t, tx.Add(a, []byte("d"), 9))
	require.NoError(t, tx.Delete(a, []byte("d")))
	require.NoError(t, tx.Add(a, []byte("d"), 2)) // Add after Delete in one batch
	require.NoError(t, tx.Put(c, []byte(""), []byte("empty key")))
	require.NoError(t, tx.Delete(c, []byte("absent")))

	// nothing visible before commit
	_, ok, err := s.Get(a, []byte("k"))
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, b.Commit(pebble.Sync))
	b.Close()

	v, ok, err := s.Get(a, []byte("k"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []byte("v1"), v)
	for k, want := range map[string]int64{"n": 12, "p": 99, "q": 3, "d": 2, "c": 43, "none": 0} {
		n, err := s.Counter(a, []byte(k))
		require.NoError(t, err)
		require.Equal(t, want, n, k)
	}
	keys, err := s.Keys(a)
	require.NoError(t, err)
	require.Equal(t, map[string][]byte{"k": []byte("v1"), "n": le(12), "p": le(99), "q": le(3), "d": le(2), "c": le(43)}, keys)
	keys, err = s.Keys(c)
	require.NoError(t, err)
	require.Equal(t, map[string][]byte{"": []byte("empty key")}, keys)

	// next batch builds on committed values
	b = db.NewBatch()
	tx = s.Begin(b)
	require.NoError(t, tx.Add(a, []byte("n"), -20))
	require.NoError(t, tx.Delete(a, []byte("k")))
	require.NoError(t, tx.Add(a, []byte("k"), 1)) // "v1" is 2 bytes → 0
	require.NoError(t, b.Commit(pebble.Sync))
	b.Close()
	n, err := s.Counter(a, []byte("n"))
	require.NoError(t, err)
	require.Equal(t, int64(-8), n)
	v, _, err = s.Get(a, []byte("k"))
	require.NoError(t, err)
	require.Equal(t, le(1), v)

	// overflow wraps
	b = db.NewBatch()
	tx = s.Begin(b)
	require.NoError(t, tx.Put(c, []byte("max"), le(1<<63-1)))
	require.NoError(t, tx.Add(c, []byte("max"), 1))
	require.NoError(t, b.Commit(pebble.Sync))
	b.Close()
	n, err = s.Counter(c, []byte("max"))
	require.NoError(t, err)
	require.Equal(t, int64(-1<<63), n)

	ids, err := s.Sessions()
	require.NoError(t, err)
	want := []ID{a, c}
	sort.Slice(want, func(i, j int) bool { return string(want[i][:]) < string(want[j][:]) })
	require.Equal(t, want, ids)
}

func TestStateWriteOnly(t *testing.T) {
	db := testutil.MemDB(t)
	s := NewState(db)
	a := NewID()
	b := db.NewBatch()
	defer b.Close()
	tx := s.Begin(b)
	tx.WriteOnly()
	require.NoError(t, tx.Put(a, []byte("n"), le(5)))
	require.NoError(t, tx.Delete(a, []byte("gone")))
	require.Empty(t, tx.pending, "a write-only tx remembers nothing")
	n := b.Count()
	require.ErrorIs(t, tx.Add(a, []byte("n"), 1), ErrWriteOnly)
	require.Equal(t, n, b.Count(), "a refused Add writes nothing")
	require.NoError(t, b.Commit(pebble.Sync))
	c, err := s.Counter(a, []byte("n"))
	require.NoError(t, err)
	require.Equal(t, int64(5), c)
}

func TestStateAbortedBatchLeavesNothing(t *testing.T) {
	db := testutil.MemDB(t)
	s := NewState(db)
	a := NewID()
	b := db.NewBatch()
	tx := s.Begin(b)
	require.NoError(t, tx.Put(a, []byte("k"), []byte("v")))
	require.NoError(t, b.Close())
	ids, err := s.Sessions()
	require.NoError(t, err)
	require.Empty(t, ids)
	keys, err := s.Keys(a)
	require.NoError(t, err)
	require.Empty(t, keys)
}

func TestStateBadInput(t *testing.T) {
	db := testutil.MemDB(t)
	s := NewState(db)
	a := NewID()
	require.ErrorIs(t, s.Begin(nil).Put(a, nil, nil), ErrNilBatch)
	require.ErrorIs(t, s.Begin(nil).Add(a, nil, 1), ErrNilBatch)
	require.ErrorIs(t, s.Begin(nil).Delete(a, nil), ErrNilBatch)
	_, _, err := NewState(nil).Get(a, nil)
	require.ErrorIs(t, err, ErrNilDB)

	// a row without the version byte is corrupt, and Add refuses to build on it
	require.NoError(t, db.Set(stateKey(a, []byte("bad")), []byte{9, 1}, pebble.Sync))
	_, _, err = s.Get(a, []byte("bad"))
	require.ErrorIs(t, err, ErrCorrupt)
	b := db.NewBatch()
	defer b.Close()
	require.ErrorIs(t, s.Begin(b).Add(a, []byte("bad"), 1), ErrCorrupt)
	require.True(t, b.Empty())
}

func TestStatePersistsAcrossReopen(t *testing.T) {
	fs := vfs.NewMem()
	db := testutil.OpenDB(t, fs, "db")
	s := NewState(db)
	a := NewID()
	b := db.NewBatch()
	tx := s.Begin(b)
	require.NoError(t, tx.Add(a, []byte("n"), 41))
	require.NoError(t, b.Commit(pebble.Sync))
	b.Close()
	require.NoError(t, db.Close())
	db = testutil.OpenDB(t, fs, "db")
	defer db.Close()
	s = NewState(db)
	b = db.NewBatch()
	require.NoError(t, s.Begin(b).Add(a, []byte("n"), 1))
	require.NoError(t, b.Commit(pebble.Sync))
	b.Close()
	n, err := s.Counter(a, []byte("n"))
	require.NoError(t, err)
	require.Equal(t, int64(42), n)
}

func BenchmarkStatePut(b *testing.B) {
	for _, m := range []string{"indexed", "plain", "write-only"} {
		b.Run(m, func(b *testing.B) { benchmarkStatePut(b, m) })
	}
}

func benchmarkStatePut(b *testing.B, mode string) {
	db := testutil.MemDB(b)
	s := NewState(db)
	ids := make([]ID, 1000)
	for i := range ids {
		ids[i] = NewID()
	}
	val := make([]byte, 99)
	batch := db.NewBatch()
	if mode == "indexed" {
		batch = db.NewIndexedBatch()
	}
	defer batch.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; {
		batch.Reset()
		tx := s.Begin(batch)
		if mode == "write-only" {
			tx.WriteOnly()
		}
		for j := 0; j < len(ids) && i < b.N; j, i = j+1, i+1 {
			if err := tx.Put(ids[j], []byte("key123"), val); err != nil {
				b.Fatal(err)
			}
		}
	}
}

package kv_test

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/wal"
)

func TestScoped(t *testing.T) {
	s := kv.Scoped("alice", []byte("{acct:alice}/balance"))
	require.Equal(t, append([]byte{5}, "alice{acct:alice}/balance"...), s)
	p, k, err := kv.SplitScoped(s)
	require.NoError(t, err)
	require.Equal(t, "alice", p)
	require.Equal(t, "{acct:alice}/balance", string(k))
	// The length byte keeps principals apart: "ab"+"c" is not "a"+"bc".
	require.NotEqual(t, kv.Scoped("ab", []byte("c")), kv.Scoped("a", []byte("bc")))
	// A principal's keys with a prefix are exactly the scoped keys with
	// ScopedPrefix's prefix, and no other principal's.
	pre := kv.ScopedPrefix("a", []byte("x"))
	require.True(t, bytes.HasPrefix(kv.Scoped("a", []byte("xyz")), pre))
	require.False(t, bytes.HasPrefix(kv.Scoped("ab", []byte("x")), pre))
	require.False(t, bytes.HasPrefix(kv.Scoped("a", []byte("y")), pre))

	for _, bad := range [][]byte{nil, {}, {0, 'k'}, {3, 'a', 'b', 'c'}, {5, 'a'}} {
		_, _, err := kv.SplitScoped(bad)
		require.ErrorIs(t, err, kv.ErrCorrupt, "%q", bad)
		require.ErrorIs(t, err, corruption.Err)
	}
	require.Panics(t, func() { kv.Scoped(string(make([]byte, kv.MaxPrincipal+1)), []byte("k")) })
	require.NoError(t, kv.CheckPrincipal(string(make([]byte, kv.MaxPrincipal))))
	require.ErrorIs(t, kv.CheckPrincipal(""), kv.ErrInvalidPrincipal)
}

func TestRowCodec(t *testing.T) {
	for _, r := range []kv.Row{
		{Value: []byte("v"), Version: 1, ModLSN: 1},
		{Value: []byte{}, Version: 7, ModLSN: 1 << 40},
		{Value: bytes.Repeat([]byte{0xff}, 300), Version: math.MaxInt64, ModLSN: math.MaxUint64},
	} {
		b := kv.AppendRow([]byte("prefix"), r)
		require.Equal(t, "prefix", string(b[:6]))
		require.Equal(t, byte(1), b[6], "format byte")
		got, err := kv.DecodeRow(b[6:])
		require.NoError(t, err)
		require.Equal(t, r, got)
	}
	good := kv.AppendRow(nil, kv.Row{Value: []byte("v"), Version: 1, ModLSN: 1})
	for name, b := range map[string][]byte{
		"empty":     nil,
		"short":     good[:16],
		"format 2":  append([]byte{2}, good[1:]...),
		"format 0":  append([]byte{0}, good[1:]...),
		"version 0": kv.AppendRow(nil, kv.Row{Version: 0, ModLSN: 1}),
		"modlsn 0":  kv.AppendRow(nil, kv.Row{Version: 1, ModLSN: 0}),
	} {
		_, err := kv.DecodeRow(b)
		require.ErrorIs(t, err, kv.ErrCorrupt, name)
		require.ErrorIs(t, err, corruption.Err, name)
	}
}

// FuzzDecodeRow: decoding arbitrary bytes never panics, fails only with
// ErrCorrupt, and what decodes re-encodes to the same bytes.
func FuzzDecodeRow(f *testing.F) {
	f.Add(kv.AppendRow(nil, kv.Row{Value: []byte("v"), Version: 1, ModLSN: 1}))
	f.Add(kv.AppendRow(nil, kv.Row{Version: math.MaxUint64, ModLSN: 2}))
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := kv.DecodeRow(b)
		if err != nil {
			if !errors.Is(err, kv.ErrCorrupt) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if re := kv.AppendRow(nil, r); !bytes.Equal(re, b) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", b, r, re)
		}
	})
}

type mapReader map[string]kv.Row

func (m mapReader) Get(k []byte) (kv.Row, bool, error) {
	r, ok := m[string(k)]
	return r, ok, nil
}

func get(t *testing.T, r kv.Reader, key string) (kv.Row, bool) {
	t.Helper()
	row, ok, err := r.Get([]byte(key))
	require.NoError(t, err)
	return row, ok
}

// TestPending: the overlay shows a key's newest logged write (a row or a
// tombstone) over the store until the store has applied it, then the
// store's row again.
func TestPending(t *testing.T) {
	store := mapReader{"a": {Value: []byte("store-a"), Version: 4, ModLSN: 1}, "b": {Value: []byte("store-b"), Version: 1, ModLSN: 2}}
	var p kv.Pending
	view := kv.Layer(&p, store)
	r, ok := get(t, view, "a")
	require.True(t, ok)
	require.Equal(t, "store-a", string(r.Value), "an empty overlay reads through")

	val := []byte("a5")
	p.Note([]wal.Event{
		{LSN: 10, Op: wal.OpKVPut, Key: []byte("a"), Value: val, Delta: 5},
		{LSN: 11, Op: wal.OpPut, Key: []byte("x"), Value: []byte("session op: ignored")},
		{LSN: 12, Op: wal.OpKVDelete, Key: []byte("b")},
		{LSN: 13, Op: wal.OpKVPut, Key: []byte("c"), Delta: 1},
	})
	val[0] = 'X' // Note copied the value: events alias a batch buffer
	require.Equal(t, 3, p.Len())
	r, ok = get(t, view, "a")
	require.True(t, ok)
	require.Equal(t, kv.Row{Value: []byte("a5"), Version: 5, ModLSN: 10}, r)
	_, ok = get(t, view, "b")
	require.False(t, ok, "a tombstone hides the store's row")
	r, ok = get(t, view, "c")
	require.True(t, ok)
	require.Equal(t, kv.Row{Value: []byte{}, Version: 1, ModLSN: 13}, r, "an empty value exists")
	_, ok = get(t, view, "x")
	require.False(t, ok)

	// A newer write to a wins; an older one noted late does not.
	p.Note([]wal.Event{{LSN: 14, Op: wal.OpKVPut, Key: []byte("a"), Value: []byte("a6"), Delta: 6}})
	p.Note([]wal.Event{{LSN: 9, Op: wal.OpKVPut, Key: []byte("a"), Value: []byte("old"), Delta: 4}})
	r, _ = get(t, view, "a")
	require.Equal(t, "a6", string(r.Value))

	// The store applies through LSN 12: a's entry (LSN 14) stays, b's
	// tombstone goes — the store now shows the delete.
	store["a"] = kv.Row{Value: []byte("a5"), Version: 5, ModLSN: 10}
	delete(store, "b")
	p.Forget(12)
	require.Equal(t, 2, p.Len())
	r, _ = get(t, view, "a")
	require.Equal(t, "a6", string(r.Value), "a newer pending write outlives the forgotten one")
	_, ok = get(t, view, "b")
	require.False(t, ok)

	p.Forget(14)
	require.Zero(t, p.Len())
	r, _ = get(t, view, "a")
	require.Equal(t, "a5", string(r.Value), "forgotten: the store's row shows")
	p.Forget(100) // nothing left: harmless
	require.Zero(t, p.Len())
}

// TestPendingResolves: Resolve over Layer sees an unapplied transaction's
// writes, so a second transaction's compare is judged after the first.
func TestPendingResolves(t *testing.T) {
	store := mapReader{}
	var p kv.Pending
	txn := &kv.Txn{
		If:   []kv.Compare{{Key: []byte("name"), Target: kv.TargetExists, Result: kv.Equal, Number: 0}},
		Then: []kv.Op{{Kind: kv.Put, Key: []byte("name"), Value: []byte("taken")}},
	}
	evs, res, err := kv.Resolve(kv.Layer(&p, store), "alice", txn, sid, 1)
	require.NoError(t, err)
	require.True(t, res.Succeeded)
	p.Note(evs) // logged, not applied
	evs2, res2, err := kv.Resolve(kv.Layer(&p, store), "alice", txn, sid, 2)
	require.NoError(t, err)
	require.False(t, res2.Succeeded, "the first transaction's put is pending, and counts")
	require.Empty(t, evs2)
}

// TestResolveResultIsACopy: a Get's value in a result is the caller's: writing
// into it changes neither the overlay nor what the next resolution reads.
func TestResolveResultIsACopy(t *testing.T) {
	var p kv.Pending
	p.Note([]wal.Event{{LSN: 1, Op: wal.OpKVPut, Key: kv.Scoped("alice", []byte("k")), Value: []byte("v"), Delta: 1}})
	get := &kv.Txn{Then: []kv.Op{{Kind: kv.Get, Key: []byte("k")}}}
	_, res, err := kv.Resolve(kv.Layer(&p, mapReader{}), "alice", get, sid, 2)
	require.NoError(t, err)
	res.Ops[0].Value[0] = 'X'
	_, res, err = kv.Resolve(kv.Layer(&p, mapReader{}), "alice", get, sid, 2)
	require.NoError(t, err)
	require.Equal(t, "v", string(res.Ops[0].Value))
}

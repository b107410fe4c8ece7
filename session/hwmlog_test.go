package session

import (
	"encoding/binary"
	"encoding/hex"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// appendLogEntryV1 is the version-1 entry encoder (33 fixed bytes), kept
// to write the deltas older binaries left behind.
func appendLogEntryV1(dst []byte, id *ID, r record, exists bool) []byte {
	var flags byte
	switch {
	case !exists:
		flags, r = flagDeleted, record{}
	case r.closed:
		flags = flagClosed
	}
	dst = append(dst, id[:]...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.hwm))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.lastTS))
	return append(dst, flags)
}

type goldenEntry struct {
	id     ID
	rec    record
	exists bool
}

// goldenDelta is the fixed input of the golden deltas; never change it
// without changing testdata/golden_hwm_delta_v*.hex, i.e. the format.
func goldenDelta() (base int64, entries []goldenEntry) {
	base = 1_700_000_000_123_456_789
	var a, b, c, d ID
	for i := range a {
		a[i], b[i], c[i], d[i] = byte(i), byte(0x10+i), byte(0xa0+i), byte(0xf0-i)
	}
	return base, []goldenEntry{
		{a, record{hwm: 1, lastTS: base}, true},                             // just advanced
		{b, record{hwm: 300, lastTS: base - 2_500_000, closed: true}, true}, // closed, 2.5 ms ago
		{c, record{}, false}, // tombstone
		{d, record{hwm: MaxSeqNo, lastTS: base - 24*hour - 1}, true}, // extremes
		{a, record{hwm: 2, lastTS: base + 5}, true},                  // later than base (never written so, but decodable)
	}
}

func goldenFile(t *testing.T, name string, got []byte) []byte {
	t.Helper()
	return testutil.ReadGolden(t, filepath.Join("testdata", name), got)
}

func decodeAll(t *testing.T, v []byte) []goldenEntry {
	t.Helper()
	var out []goldenEntry
	require.NoError(t, decodeDelta(v, func(id *ID, l loggedRecord) {
		out = append(out, goldenEntry{*id, l.rec, l.exists})
	}))
	return out
}

func TestGoldenDeltaV2(t *testing.T) {
	base, entries := goldenDelta()
	v := appendLogHeader(nil, base)
	for _, e := range entries {
		var err error
		v, err = appendLogEntry(v, &e.id, e.rec, e.exists)
		require.NoError(t, err)
	}
	want := goldenFile(t, "golden_hwm_delta_v2.hex", v)
	require.Equal(t, hex.EncodeToString(want), hex.EncodeToString(v), "HWM delta format drifted")
	// Spot-check the documented layout: version, base, then the first
	// entry: ID, uvarint(1<<1), varint(0).
	require.Equal(t, byte(logVersion2), want[0])
	require.Equal(t, uint64(base), binary.LittleEndian.Uint64(want[1:]))
	require.Equal(t, entries[0].id[:], want[9:25])
	require.Equal(t, []byte{2, 0}, want[25:27])
	// A just-advanced session costs 18 bytes, a closed one 2.5 ms old 22.
	require.Equal(t, entries[1].id[:], want[27:43])
	require.Len(t, want, 9+18+22+17+33+18) // MaxSeqNo and a day-old time: 10 + 7 bytes
	require.Equal(t, entries, decodeAll(t, want))
}

func TestGoldenDeltaV1StillReads(t *testing.T) {
	_, entries := goldenDelta()
	v := []byte{logVersion1}
	for _, e := range entries {
		v = appendLogEntryV1(v, &e.id, e.rec, e.exists)
	}
	want := goldenFile(t, "golden_hwm_delta_v1.hex", v)
	require.Equal(t, hex.EncodeToString(want), hex.EncodeToString(v))
	require.Len(t, want, 1+5*logEntryLenV1)
	require.Equal(t, entries, decodeAll(t, want))
}

// A store whose log an older binary wrote (version-1 deltas) opens and
// replays them; the deltas written from then on are version 2, and the
// latest change wins across the two.
func TestOpenReplaysVersion1Deltas(t *testing.T) {
	fs := vfs.NewMem()
	db := testutil.OpenDB(t, fs, "db")
	a, b := NewID(), NewID()
	base := 100 * hour
	var lk [logKeyLen]byte
	v := []byte{logVersion1}
	v = appendLogEntryV1(v, &a, record{hwm: 3, lastTS: base}, true)
	v = appendLogEntryV1(v, &b, record{hwm: 7, lastTS: base + 1, closed: true}, true)
	require.NoError(t, db.Set(logKey(&lk, 1), v, pebble.Sync))
	tr := openTracker(t, db, nil)
	requireHWM(t, tr, a, 3, false)
	requireHWM(t, tr, b, 7, true)
	require.Equal(t, Apply, check(t, tr, db, a, 4, base+2))
	applyBatch(t, db, tr, ev{a, 4, base + 2})
	require.NoError(t, db.Close())

	db = testutil.OpenDB(t, fs, "db")
	defer db.Close()
	tr = openTracker(t, db, nil)
	requireHWM(t, tr, a, 4, false)
	requireHWM(t, tr, b, 7, true)
	r, ok := storedRecord(t, db, a)
	require.True(t, ok)
	require.Equal(t, record{hwm: 4, lastTS: base + 2}, r)
}

// Bad deltas are refused with ErrCorrupt naming the key, never misread.
func TestBadDeltaRefused(t *testing.T) {
	id := NewID()
	base := int64(1 << 40)
	good := appendLogHeader(nil, base)
	good, err := appendLogEntry(good, &id, record{hwm: 5, lastTS: base - 1000}, true)
	require.NoError(t, err)
	cases := map[string][]byte{
		"empty":             {},
		"unknown version":   append([]byte{3}, good[1:]...),
		"short header":      good[:5],
		"truncated ID":      good[:logHeaderLen+10],
		"truncated time":    good[:len(good)-1],
		"closed with HWM 0": append(append(appendLogHeader(nil, base), id[:]...), 1, 0),
		"v1 bad length":     make([]byte, 1+logEntryLenV1-1),
		"v1 bad flags":      append(appendLogEntryV1([]byte{logVersion1}, &id, record{hwm: 1}, true)[:logEntryLenV1], 0x80),
	}
	cases["v1 bad length"][0] = logVersion1
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			db := testutil.MemDB(t)
			var lk [logKeyLen]byte
			require.NoError(t, db.Set(logKey(&lk, 9), v, pebble.Sync))
			_, err := OpenTracker(db, nil)
			require.ErrorIs(t, err, ErrCorrupt)
			require.Contains(t, err.Error(), hex.EncodeToString(logKey(&lk, 9)))
			require.ErrorIs(t, ScanHWMs(db, func(ID, SeqNo, bool, int64) error { return nil }), ErrCorrupt)
		})
	}
	// The encoder refuses a live record it cannot represent.
	_, err = appendLogEntry(appendLogHeader(nil, base), &id, record{hwm: 0, lastTS: base}, true)
	require.ErrorIs(t, err, ErrCorrupt)
}

// FuzzDecodeDelta: any bytes decode or fail with ErrCorrupt, never panic;
// whatever decodes re-encodes (as version 2 with the same base) to a value
// that decodes to the same entries.
func FuzzDecodeDelta(f *testing.F) {
	base, entries := goldenDelta()
	v := appendLogHeader(nil, base)
	v1 := []byte{logVersion1}
	for _, e := range entries {
		v, _ = appendLogEntry(v, &e.id, e.rec, e.exists)
		v1 = appendLogEntryV1(v1, &e.id, e.rec, e.exists)
	}
	f.Add(v)
	f.Add(v1)
	f.Add([]byte{logVersion2, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, v []byte) {
		var got []goldenEntry
		err := decodeDelta(v, func(id *ID, l loggedRecord) { got = append(got, goldenEntry{*id, l.rec, l.exists}) })
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		b := int64(0)
		if v[0] == logVersion2 {
			b = int64(binary.LittleEndian.Uint64(v[1:]))
		}
		w := appendLogHeader(nil, b)
		var want []goldenEntry
		for _, e := range got {
			if e.exists && e.rec.hwm == 0 {
				continue // version 1 can hold it; version 2 refuses to write it
			}
			if !e.exists {
				e.rec = record{}
			}
			var err error
			w, err = appendLogEntry(w, &e.id, e.rec, e.exists)
			require.NoError(t, err)
			want = append(want, e)
		}
		var again []goldenEntry
		require.NoError(t, decodeDelta(w, func(id *ID, l loggedRecord) { again = append(again, goldenEntry{*id, l.rec, l.exists}) }))
		require.Equal(t, want, again)
	})
}

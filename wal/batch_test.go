package wal

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
)

var typedErrs = []error{ErrCorrupt, ErrChecksum, ErrTruncated, ErrTooLarge, ErrVersion}

func requireTyped(t testing.TB, err error) {
	t.Helper()
	require.Error(t, err)
	for _, e := range typedErrs {
		if errors.Is(err, e) {
			return
		}
	}
	t.Fatalf("error %v is not one of the wal sentinels", err)
}

// allCombos returns events covering every op with every flag combination and
// edge values of each field.
func allCombos() []Event {
	var evs []Event
	sid := session.ID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	seqs := []session.SeqNo{0, 1, 127, 128, 300, math.MaxUint64}
	times := []int64{0, -1, 1_700_000_000_000_000_000, math.MinInt64, math.MaxInt64}
	keys := [][]byte{nil, []byte("k"), bytes.Repeat([]byte{0xab}, 200)}
	vals := [][]byte{nil, []byte("v"), bytes.Repeat([]byte{0}, 130)}
	deltas := []int64{0, 1, -1, 63, -64, 64, math.MinInt64, math.MaxInt64}
	i := 0
	for op := OpOpen; op <= OpClose; op++ {
		for _, idem := range []bool{false, true} {
			for _, seq := range seqs {
				base := Event{Op: op, Session: sid, Seq: seq, HasIdemKey: idem, Time: times[i%len(times)]}
				i++
				if idem {
					// An all-zero key is a real key: presence is the flag.
					if i%2 == 0 {
						base.IdemKey = idempotency.Key{0xff, byte(i)}
					}
				}
				switch op {
				case OpOpen, OpClose:
					evs = append(evs, base)
				case OpDelete:
					for _, k := range keys {
						e := base
						e.Key = k
						evs = append(evs, e)
					}
				case OpPut:
					for _, k := range keys {
						for _, v := range vals {
							e := base
							e.Key, e.Value = k, v
							evs = append(evs, e)
						}
					}
				case OpAdd:
					for _, k := range keys {
						for _, d := range deltas {
							e := base
							e.Key, e.Delta = k, d
							evs = append(evs, e)
						}
					}
				}
			}
		}
	}
	// The key-space ops: a key is required, kvput's version is ≥ 1.
	versions := []int64{1, 127, 128, math.MaxInt64}
	for j, k := range keys[1:] {
		for _, v := range vals {
			for _, ver := range versions {
				evs = append(evs, Event{Op: OpKVPut, Session: sid, Seq: seqs[j%len(seqs)], HasIdemKey: j%2 == 0,
					Time: times[j%len(times)], Key: k, Value: v, Delta: ver})
			}
		}
		evs = append(evs, Event{Op: OpKVDelete, Session: sid, Seq: seqs[(j+1)%len(seqs)], HasIdemKey: j%2 == 1,
			Time: times[(j+1)%len(times)], Key: k})
	}
	return evs
}

func withLSNs(evs []Event, first uint64) []Event {
	out := make([]Event, len(evs))
	copy(out, evs)
	for i := range out {
		out[i].LSN = first + uint64(i)
	}
	return out
}

func TestRoundTripAllCombos(t *testing.T) {
	evs := allCombos()
	// As one batch.
	buf, err := AppendBatch(nil, 7, 3, 100, evs)
	require.NoError(t, err)
	h, got, err := DecodeBatch(buf, nil)
	require.NoError(t, err)
	require.Equal(t, Header{Version: Version, Shard: 7, Epoch: 3, FirstLSN: 100, Count: uint32(len(evs)),
		BodyLen: uint32(len(buf) - HeaderSize), BodyCRC: h.BodyCRC, HeaderCRC: binary.LittleEndian.Uint32(buf[40:])}, h)
	require.Equal(t, uint64(100+len(evs)-1), h.LastLSN())
	require.Equal(t, len(buf), h.Size())
	require.Equal(t, withLSNs(evs, 100), got)
	// Decoded again over those events, reversed, so each slot held another
	// event: DecodeBatch does not zero them first, and every field of the
	// old event is overwritten.
	rev := slices.Clone(evs)
	slices.Reverse(rev)
	rbuf, err := AppendBatch(nil, 7, 3, 100, rev)
	require.NoError(t, err)
	_, again, err := DecodeBatch(rbuf, got)
	require.NoError(t, err)
	require.Equal(t, withLSNs(rev, 100), again)
	// And each event alone, appended after existing bytes in dst.
	for i := range evs {
		prefix := []byte("prefix")
		buf, err := AppendBatch(prefix, 1, 1, 1, evs[i:i+1])
		require.NoError(t, err)
		require.Equal(t, "prefix", string(buf[:6]))
		_, got, err := DecodeBatch(buf[6:], got)
		require.NoError(t, err)
		require.Equal(t, withLSNs(evs[i:i+1], 1), got)
		require.Equal(t, encodedEventSize(&evs[i]), len(buf)-6-HeaderSize)
	}
}

func TestDecodeAliasesAndClipsCapacity(t *testing.T) {
	buf, err := AppendBatch(nil, 1, 1, 1, []Event{{Op: OpPut, Key: []byte("key"), Value: []byte("val")}, {Op: OpClose}})
	require.NoError(t, err)
	_, evs, err := DecodeBatch(buf, nil)
	require.NoError(t, err)
	require.Equal(t, len(evs[0].Key), cap(evs[0].Key))
	require.Equal(t, len(evs[0].Value), cap(evs[0].Value))
	k := evs[0].Key
	k = append(k, 'X') // must not scribble over the value
	_ = k
	require.Equal(t, "val", string(evs[0].Value))
	idx := bytes.Index(buf, []byte("key"))
	buf[idx] = 'K'
	require.Equal(t, "Key", string(evs[0].Key), "decoded slices alias the input")
}

func TestEncodeRejectsInvalidEvents(t *testing.T) {
	big := make([]byte, MaxPayloadSize+1)
	cases := map[string][]Event{
		"empty":          nil,
		"op0":            {{Op: 0}},
		"op6":            {{Op: 6}},
		"open key":       {{Op: OpOpen, Key: []byte("k")}},
		"close delta":    {{Op: OpClose, Delta: 1}},
		"put delta":      {{Op: OpPut, Delta: 1}},
		"delete value":   {{Op: OpDelete, Value: []byte("v")}},
		"add value":      {{Op: OpAdd, Value: []byte("v")}},
		"payload > max":  {{Op: OpPut, Key: big}},
		"second invalid": {{Op: OpOpen}, {Op: 99}},
		"op13":           {{Op: 13, Key: []byte("k")}},
		"kvput no key":   {{Op: OpKVPut, Value: []byte("v"), Delta: 1}},
		"kvput version0": {{Op: OpKVPut, Key: []byte("k"), Value: []byte("v")}},
		"kvput negative": {{Op: OpKVPut, Key: []byte("k"), Delta: -1}},
		"kvdelete nokey": {{Op: OpKVDelete}},
		"kvdelete value": {{Op: OpKVDelete, Key: []byte("k"), Value: []byte("v")}},
		"kvdelete delta": {{Op: OpKVDelete, Key: []byte("k"), Delta: 1}},
		"kvput too big":  {{Op: OpKVPut, Key: []byte("k"), Value: big, Delta: 1}},
	}
	for name, evs := range cases {
		t.Run(name, func(t *testing.T) {
			dst := []byte("keep")
			out, err := AppendBatch(dst, 1, 1, 1, evs)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrInvalidEvent) || errors.Is(err, ErrTooLarge), "%v", err)
			require.Equal(t, "keep", string(out))
		})
	}
	_, err := AppendBatch(nil, 1, 1, 0, []Event{{Op: OpOpen}})
	require.ErrorIs(t, err, ErrInvalidEvent)
	_, err = AppendBatch(nil, 1, 1, math.MaxUint64, []Event{{Op: OpOpen}, {Op: OpClose}})
	require.ErrorIs(t, err, ErrInvalidEvent)
	// The body limit: four events of just under 16 MiB exceed 64 MiB.
	half := make([]byte, MaxPayloadSize-100)
	_, err = AppendBatch(nil, 1, 1, 1, []Event{{Op: OpPut, Key: half}, {Op: OpPut, Key: half}, {Op: OpPut, Key: half},
		{Op: OpPut, Key: half}, {Op: OpPut, Key: half}})
	require.ErrorIs(t, err, ErrTooLarge)
}

func TestOpStrings(t *testing.T) {
	for op := OpOpen; op <= OpClose; op++ {
		got, err := ParseOp(op.String())
		require.NoError(t, err)
		require.Equal(t, op, got)
	}
	require.Equal(t, "open|put|delete|add|close",
		strings.Join([]string{OpOpen.String(), OpPut.String(), OpDelete.String(), OpAdd.String(), OpClose.String()}, "|"))
	require.Equal(t, "op(16)", Op(16).String())
	_, err := ParseOp("op(16)")
	require.ErrorIs(t, err, ErrInvalidEvent)
	_, err = ParseOp("")
	require.Error(t, err)
}

func TestAppendOpBytes(t *testing.T) {
	put := Event{Op: OpPut, Key: []byte("k"), Value: []byte("v"), Seq: 9, Session: session.ID{1}}
	require.Equal(t, []byte{byte(OpPut), 1, 'k', 1, 'v'}, put.AppendOpBytes(nil))
	add := Event{Op: OpAdd, Key: []byte("k"), Delta: -1}
	require.Equal(t, []byte{byte(OpAdd), 1, 'k', 1}, add.AppendOpBytes(nil))
	del := Event{Op: OpDelete, Key: []byte("k")}
	require.Equal(t, []byte{byte(OpDelete), 1, 'k'}, del.AppendOpBytes(nil))
	require.Equal(t, []byte{byte(OpOpen)}, (&Event{Op: OpOpen}).AppendOpBytes(nil))
	require.Equal(t, []byte{byte(OpClose)}, (&Event{Op: OpClose}).AppendOpBytes(nil))
	// Distinct ops of the combo set give distinct op bytes unless they are the
	// same operation; session/seq/time/idem key do not enter.
	seen := map[string]Event{}
	for _, e := range allCombos() {
		b := string(e.AppendOpBytes([]byte("x"))[1:])
		if prev, ok := seen[b]; ok {
			require.Equal(t, prev.Op, e.Op)
			require.Equal(t, string(prev.Key), string(e.Key))
			require.Equal(t, string(prev.Value), string(e.Value))
			require.Equal(t, prev.Delta, e.Delta)
		}
		seen[b] = e
	}
	allocs := testing.AllocsPerRun(100, func() { _ = put.AppendOpBytes(make([]byte, 0, 64)[:0]) })
	require.LessOrEqual(t, allocs, 1.0)
}

// goldenEvents is the fixed input of the golden batch; never change it
// without changing testdata/golden_batch.hex, i.e. the format.
func goldenEvents() []Event {
	sid := session.ID{0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f}
	ts := int64(1_767_225_600_000_000_000) // 2026-01-01T00:00:00Z
	return []Event{
		{Op: OpOpen, Session: sid, Seq: 1, Time: ts},
		{Op: OpPut, Session: sid, Seq: 2, Time: ts + 1, HasIdemKey: true,
			IdemKey: idempotency.Key{0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf},
			Key:     []byte("user"), Value: []byte("ada")},
		{Op: OpAdd, Session: sid, Seq: 300, Time: ts + 2, HasIdemKey: true, Key: []byte("n"), Delta: -2},
		{Op: OpDelete, Session: sid, Seq: 301, Time: ts + 3, Key: []byte("user")},
		{Op: OpClose, Session: sid, Seq: 302, Time: ts + 4},
	}
}

func TestGoldenBatch(t *testing.T) {
	buf, err := AppendBatch(nil, 3, 7, 4096, goldenEvents())
	require.NoError(t, err)
	path := filepath.Join("testdata", "golden_batch.hex")
	if os.Getenv("ONCEWAL_UPDATE_GOLDEN") == "1" {
		var sb strings.Builder
		for off := 0; off < len(buf); off += 32 {
			sb.WriteString(hex.EncodeToString(buf[off:min(off+32, len(buf))]))
			sb.WriteByte('\n')
		}
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(sb.String()), 0o644))
	}
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	want, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(raw)), "\n", ""))
	require.NoError(t, err)
	require.Equal(t, hex.EncodeToString(want), hex.EncodeToString(buf), "batch format drifted")
	// Spot-check the documented layout.
	require.Equal(t, "OWAL", string(want[:4]))
	require.Equal(t, uint16(2), binary.LittleEndian.Uint16(want[4:]))
	require.Equal(t, uint32(3), binary.LittleEndian.Uint32(want[8:]))
	require.Equal(t, uint64(7), binary.LittleEndian.Uint64(want[12:]))
	require.Equal(t, uint64(4096), binary.LittleEndian.Uint64(want[20:]))
	require.Equal(t, uint32(5), binary.LittleEndian.Uint32(want[28:]))
	require.Equal(t, uint32(len(want)-HeaderSize), binary.LittleEndian.Uint32(want[32:]))
	require.Equal(t, crc32.Checksum(want[HeaderSize:], castagnoli), binary.LittleEndian.Uint32(want[36:]))
	require.Equal(t, crc32.Checksum(want[:40], castagnoli), binary.LittleEndian.Uint32(want[40:]))
	require.Equal(t, byte(OpOpen), want[HeaderSize])
	_, evs, err := DecodeBatch(want, nil)
	require.NoError(t, err)
	require.Equal(t, withLSNs(goldenEvents(), 4096), evs)
}

func TestBitFlipEveryBit(t *testing.T) {
	evs := goldenEvents()
	if os.Getenv("ONCEWAL_LONG") == "1" {
		evs = allCombos()
	}
	buf, err := AppendBatch(nil, 3, 7, 4096, evs)
	require.NoError(t, err)
	mut := make([]byte, len(buf))
	var out []Event
	for bit := 0; bit < len(buf)*8; bit++ {
		copy(mut, buf)
		mut[bit/8] ^= 1 << (bit % 8)
		_, out, err = DecodeBatch(mut, out)
		requireTyped(t, err)
		if bit/8 >= HeaderSize {
			require.ErrorIs(t, err, ErrChecksum, "bit %d", bit)
		}
	}
}

func TestTruncatedAndExtendedBuffers(t *testing.T) {
	buf, err := AppendBatch(nil, 3, 7, 4096, goldenEvents())
	require.NoError(t, err)
	for n := 0; n < len(buf); n++ {
		_, _, err := DecodeBatch(buf[:n], nil)
		require.ErrorIs(t, err, ErrTruncated, "len %d", n)
	}
	_, _, err = DecodeBatch(append(buf[:len(buf):len(buf)], 0), nil)
	require.ErrorIs(t, err, ErrCorrupt)
}

// allocatedBytes reports the bytes allocated by f (averaged over runs).
func allocatedBytes(f func()) uint64 {
	const runs = 5
	f() // warm up
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	for i := 0; i < runs; i++ {
		f()
	}
	runtime.ReadMemStats(&b)
	return (b.TotalAlloc - a.TotalAlloc) / runs
}

// forge rewrites header fields and fixes both checksums, as an attacker could.
func forge(t *testing.T, buf []byte, edit func(h []byte), fixBody bool) []byte {
	t.Helper()
	b := bytes.Clone(buf)
	edit(b)
	if fixBody && len(b) >= HeaderSize {
		binary.LittleEndian.PutUint32(b[36:], crc32.Checksum(b[HeaderSize:], castagnoli))
	}
	binary.LittleEndian.PutUint32(b[40:], crc32.Checksum(b[:40], castagnoli))
	return b
}

func TestForgedLengths(t *testing.T) {
	ev := []Event{{Op: OpPut, Key: []byte("key"), Value: []byte("value")}}
	buf, err := AppendBatch(nil, 1, 1, 1, ev)
	require.NoError(t, err)
	le := binary.LittleEndian
	check := func(name string, b []byte, want error) {
		t.Run(name, func(t *testing.T) {
			evs := make([]Event, 0, 4)
			n := allocatedBytes(func() {
				_, _, err := DecodeBatch(b, evs)
				require.ErrorIs(t, err, want)
			})
			// Errors are wrapped with fmt.Errorf (a few small allocations);
			// nothing proportional to a forged length.
			require.Less(t, n, uint64(64<<10))
		})
	}
	check("body len huge", forge(t, buf, func(h []byte) { le.PutUint32(h[32:], math.MaxUint32) }, false), ErrTooLarge)
	check("body len max+1", forge(t, buf, func(h []byte) { le.PutUint32(h[32:], MaxBodySize+1) }, false), ErrTooLarge)
	check("body len max", forge(t, buf, func(h []byte) { le.PutUint32(h[32:], MaxBodySize) }, false), ErrTruncated)
	check("count huge", forge(t, buf, func(h []byte) { le.PutUint32(h[28:], math.MaxUint32) }, false), ErrCorrupt)
	check("count zero", forge(t, buf, func(h []byte) { le.PutUint32(h[28:], 0) }, false), ErrCorrupt)
	check("first lsn zero", forge(t, buf, func(h []byte) { le.PutUint64(h[20:], 0) }, false), ErrCorrupt)
	check("lsn overflow", forge(t, buf, func(h []byte) { le.PutUint64(h[20:], math.MaxUint64); le.PutUint32(h[28:], 2) }, false), ErrCorrupt)
	check("version 3", forge(t, buf, func(h []byte) { le.PutUint16(h[4:], 3) }, false), ErrVersion)
	check("flags", forge(t, buf, func(h []byte) { le.PutUint16(h[6:], 1) }, false), ErrCorrupt)
	check("magic", forge(t, buf, func(h []byte) { h[0] = 'X' }, false), ErrCorrupt)

	keyLenAt := HeaderSize + eventFixedSize + 1 // seq 0 is one byte, no idem key
	require.Equal(t, byte(3), buf[keyLenAt])
	withKeyLen := func(n uint64) []byte {
		b := append(bytes.Clone(buf[:keyLenAt]), binary.AppendUvarint(nil, n)...)
		b = append(b, buf[keyLenAt+1:]...)
		return forge(t, b, func(h []byte) { le.PutUint32(h[32:], uint32(len(h)-HeaderSize)) }, true)
	}
	check("key len 2^63", withKeyLen(1<<63), ErrTooLarge)
	check("key len max payload+1", withKeyLen(MaxPayloadSize+1), ErrTooLarge)
	check("key len max payload", withKeyLen(MaxPayloadSize), ErrTruncated)
	check("key len past body", withKeyLen(100), ErrTruncated)
	// Overlong varint for key length 3: 0x83 0x00.
	over := append(bytes.Clone(buf[:keyLenAt]), 0x83, 0x00)
	over = append(over, buf[keyLenAt+1:]...)
	check("non-minimal varint", forge(t, over, func(h []byte) { le.PutUint32(h[32:], uint32(len(h)-HeaderSize)) }, true), ErrCorrupt)
	// Value length that fits alone but not with the key.
	vl := bytes.Clone(buf[:keyLenAt+4])
	vl = append(vl, binary.AppendUvarint(nil, MaxPayloadSize-2)...)
	vl = append(vl, "value"...)
	check("key+value over payload", forge(t, vl, func(h []byte) { le.PutUint32(h[32:], uint32(len(h)-HeaderSize)) }, true), ErrTooLarge)
	// Unknown op and reserved event flags, with valid checksums.
	check("unknown op", forge(t, buf, func(h []byte) { h[HeaderSize] = 16 }, true), ErrCorrupt)
	check("reserved event flag", forge(t, buf, func(h []byte) { h[HeaderSize+1] = 2 }, true), ErrCorrupt)
	// Count larger than the events present.
	check("count beyond body", forge(t, buf, func(h []byte) { le.PutUint32(h[28:], 2) }, true), ErrCorrupt)
	gold, err := AppendBatch(nil, 3, 7, 4096, goldenEvents()) // 5 events, room for 6 by size
	require.NoError(t, err)
	check("count beyond events", forge(t, gold, func(h []byte) { le.PutUint32(h[28:], 6) }, true), ErrTruncated)
	check("count below events", forge(t, gold, func(h []byte) { le.PutUint32(h[28:], 4) }, true), ErrCorrupt)
}

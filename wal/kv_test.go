package wal

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
)

// goldenKVEvents is the fixed input of testdata/golden_kv_batch.hex: the
// key-space ops beside a session op, as a leader logs a transaction's
// resolved writes. Never change it without changing the file, i.e. the
// format.
func goldenKVEvents() []Event {
	sid := session.ID{0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f}
	ts := int64(1_767_225_600_000_000_000) // 2026-01-01T00:00:00Z
	scoped := append([]byte{5}, "alice{acct:alice}/balance"...)
	return []Event{
		{Op: OpKVPut, Session: sid, Seq: 7, Time: ts, HasIdemKey: true,
			IdemKey: idempotency.Key{0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf},
			Key:     scoped, Value: []byte("100"), Delta: 1},
		{Op: OpKVPut, Session: sid, Seq: 8, Time: ts + 1, Key: scoped, Value: nil, Delta: 300},
		{Op: OpKVDelete, Session: sid, Seq: 9, Time: ts + 2, Key: scoped},
		{Op: OpPut, Session: sid, Seq: 10, Time: ts + 3, Key: []byte("k"), Value: []byte("v")},
	}
}

func TestKVOps(t *testing.T) {
	require.Equal(t, []Op{11, 12}, []Op{OpKVPut, OpKVDelete}, "format constants")
	for _, op := range []Op{OpKVPut, OpKVDelete} {
		require.True(t, op.Valid())
		require.True(t, op.IsKV())
		require.False(t, op.IsLedger())
		require.Zero(t, op.RecordKind())
		got, err := ParseOp(op.String())
		require.NoError(t, err)
		require.Equal(t, op, got)
	}
	require.Equal(t, "kvput|kvdelete", OpKVPut.String()+"|"+OpKVDelete.String())
	for _, op := range []Op{OpPut, OpDelete, OpAdd, OpClaim, 13} {
		require.False(t, op.IsKV(), "%s", op)
	}
}

func TestGoldenKVBatch(t *testing.T) {
	checkGoldenBatch(t, "golden_kv_batch.hex", goldenKVEvents(), OpKVPut, "key-space op format drifted")
}

// TestKVDecodeRejectsNonCanonical: what the encoder refuses (an empty key,
// version 0 or above 2^63-1) does not decode either, with valid checksums,
// so decode(encode) stays the identity and a forged batch stops a follower.
func TestKVDecodeRejectsNonCanonical(t *testing.T) {
	le := binary.LittleEndian
	single := func(e Event) []byte {
		b, err := AppendBatch(nil, 1, 1, 1, []Event{e})
		require.NoError(t, err)
		return b
	}
	payloadAt := HeaderSize + eventFixedSize + 1 // seq 0, no idem key
	resized := func(b []byte) []byte {
		return forge(t, b, func(h []byte) { le.PutUint32(h[32:], uint32(len(h)-HeaderSize)) }, true)
	}
	put := single(Event{Op: OpKVPut, Key: []byte("k"), Value: []byte("v"), Delta: 1})
	require.Equal(t, []byte{1, 'k', 1, 'v', 1}, put[payloadAt:])

	for name, b := range map[string][]byte{
		"kvput version 0": resized(append(bytes.Clone(put[:len(put)-1]), 0)),
		"kvput version 2^63": resized(append(bytes.Clone(put[:len(put)-1]),
			binary.AppendUvarint(nil, math.MaxInt64+1)...)),
		"kvput empty key": resized(append(bytes.Clone(put[:payloadAt]), 0, 1, 'v', 1)),
		"kvdelete empty key": resized(append(bytes.Clone(
			single(Event{Op: OpKVDelete, Key: []byte("k")})[:payloadAt]), 0)),
	} {
		_, _, err := DecodeBatch(b, nil)
		require.ErrorIs(t, err, ErrCorrupt, name)
	}
	_, _, err := DecodeBatch(resized(put[:len(put)-1]), nil)
	require.ErrorIs(t, err, ErrTruncated, "kvput without its version")
}

// TestKVOpBytes: a kvput's op bytes carry its version, so the same value
// put at two versions (two requests) derives two idempotency keys; a
// kvdelete's are a delete's under its own op byte.
func TestKVOpBytes(t *testing.T) {
	put := Event{Op: OpKVPut, Key: []byte("k"), Value: []byte("v"), Delta: 300}
	require.Equal(t, []byte{byte(OpKVPut), 1, 'k', 1, 'v', 0xac, 0x02}, put.AppendOpBytes(nil))
	again := put
	again.Delta = 301
	require.NotEqual(t, put.AppendOpBytes(nil), again.AppendOpBytes(nil))
	del := Event{Op: OpKVDelete, Key: []byte("k")}
	require.Equal(t, []byte{byte(OpKVDelete), 1, 'k'}, del.AppendOpBytes(nil))
}

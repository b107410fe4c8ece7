package wal

import (
	"bytes"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
)

// ledgerRecords covers every record kind with edge values.
func ledgerRecords() []idempotency.Record {
	fp := idempotency.FingerprintOf([]byte("add 5 to n"))
	tok := idempotency.Token{0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf}
	ts := int64(1_767_225_600_000_000_000) // 2026-01-01T00:00:00Z
	return []idempotency.Record{
		{Kind: idempotency.RecordClaim, Token: tok, Time: ts, Expires: ts + 60e9, Fingerprint: fp, Scope: "ops", Key: "req-1"},
		{Kind: idempotency.RecordComplete, Token: tok, Time: ts + 1, Expires: ts + 1 + 86400e9, Fingerprint: fp, Scope: "ops", Key: "req-1", Outcome: []byte("n=5")},
		{Kind: idempotency.RecordRelease, Token: tok, Time: ts + 2, Scope: "", Key: "req-2"},
		{Kind: idempotency.RecordFail, Token: tok, Time: ts + 3, Expires: ts + 3 + 10e9, Fingerprint: fp, Scope: "webhooks", Key: strings.Repeat("k", 200), Outcome: []byte("bad")},
		{Kind: idempotency.RecordComplete, Token: tok, Time: -1, Expires: 0, Fingerprint: fp, Scope: strings.Repeat("s", 200), Key: "x"},
		{Kind: idempotency.RecordExtend, Token: tok, Time: ts + 4, Expires: ts + 4 + 60e9, Scope: "ops", Key: "req-1"},
		{Kind: idempotency.RecordClaim, Token: tok, Time: ts + 5, Expires: ts + 5 + 60e9, Fingerprint: fp, Scope: "ops", Key: "req-3",
			Action: "POST /v1/transfers"},
	}
}

func ledgerEvents() []Event {
	var evs []Event
	for _, r := range ledgerRecords() {
		evs = append(evs, LedgerEvent(&r))
	}
	return evs
}

func TestLedgerOps(t *testing.T) {
	for k := idempotency.RecordClaim; k <= idempotency.RecordExtend; k++ {
		op := LedgerOp(k)
		require.True(t, op.Valid())
		require.True(t, op.IsLedger())
		require.Equal(t, k, op.RecordKind())
		require.Equal(t, k.String(), op.String())
		got, err := ParseOp(op.String())
		require.NoError(t, err)
		require.Equal(t, op, got)
	}
	require.Equal(t, []Op{6, 7, 8, 9, 10}, []Op{OpClaim, OpComplete, OpRelease, OpFail, OpExtend}, "format constants")
	require.Equal(t, Op(0), LedgerOp(0))
	require.Equal(t, Op(0), LedgerOp(6))
	require.False(t, OpAdd.IsLedger())
	require.False(t, OpKVPut.IsLedger())
	require.False(t, Op(13).IsLedger())
	require.Equal(t, idempotency.RecordKind(0), OpPut.RecordKind())
	require.False(t, Op(13).Valid())
	require.Equal(t, "op(13)", Op(13).String())
}

func TestLedgerEventsRoundTrip(t *testing.T) {
	evs := append(goldenEvents(), ledgerEvents()...) // mixed with session ops, as a leader logs them
	buf, err := AppendBatch(nil, 3, 7, 10, evs)
	require.NoError(t, err)
	_, got, err := DecodeBatch(buf, nil)
	require.NoError(t, err)
	require.Equal(t, withLSNs(evs, 10), got)
	recs := ledgerRecords()
	for i, e := range got[len(goldenEvents()):] {
		r, err := e.LedgerRecord()
		require.NoError(t, err)
		want := recs[i]
		if len(want.Outcome) == 0 {
			want.Outcome = nil
		}
		require.Equal(t, want, r)
		require.Equal(t, encodedEventSize(&e), len(appendEvent(nil, &e)))
		require.False(t, e.HasIdemKey, "ledger records take no window slot")
	}
	_, err = (&got[0]).LedgerRecord()
	require.ErrorIs(t, err, ErrInvalidEvent)
}

func TestLedgerEventsRejected(t *testing.T) {
	good := LedgerEvent(&ledgerRecords()[1])
	withKey := good
	withKey.Key = []byte("k")
	withDelta := good
	withDelta.Delta = 1
	empty := good
	empty.Value = nil
	badBody := good
	badBody.Value = append(bytes.Clone(good.Value), 0)
	wrongKind := good
	wrongKind.Op = OpRelease
	for name, e := range map[string]Event{"key": withKey, "delta": withDelta, "empty": empty, "trailing": badBody, "kind": wrongKind} {
		_, err := AppendBatch(nil, 1, 1, 1, []Event{e})
		require.ErrorIs(t, err, ErrInvalidEvent, name)
	}
	// A hand-made batch with a bad record body decodes as ErrCorrupt.
	buf, err := AppendBatch(nil, 1, 1, 1, []Event{good})
	require.NoError(t, err)
	idx := bytes.Index(buf, good.Value)
	require.Positive(t, idx)
	bad := bytes.Clone(buf)
	bad[idx] = 9 // record version
	bad = forge(t, bad, func([]byte) {}, true)
	_, _, err = DecodeBatch(bad, nil)
	require.ErrorIs(t, err, ErrCorrupt)
	// A truncated record inside a well-framed event: shorten the value
	// length by one and drop the last byte.
	short := bytes.Clone(buf[:idx-1])
	short = append(short, byte(len(good.Value)-1))
	short = append(short, good.Value[:len(good.Value)-1]...)
	short = forge(t, short, func(h []byte) { h[32]-- }, true)
	_, _, err = DecodeBatch(short, nil)
	require.ErrorIs(t, err, ErrCorrupt)
}

// goldenLedgerEvents is the fixed input of the golden ledger batch: every
// record kind, a claim with an action, and an effect in its complete's batch.
func goldenLedgerEvents() []Event {
	evs := keyedLedgerEvents()
	for i := range evs {
		evs[i].HasIdemKey, evs[i].IdemKey = false, idempotency.Key{}
	}
	recs := ledgerRecords()
	return append(evs, LedgerEvent(&recs[5]), LedgerEvent(&recs[6]))
}

// keyedLedgerEvents is the input of golden_ledger_batch_keyed.hex, written
// when LedgerEvent still gave ledger records an idempotency key (derived
// from the op bytes) and the effect had none.
func keyedLedgerEvents() []Event {
	sid := session.ID{0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f}
	recs := ledgerRecords()[:4]
	keyed := func(r *idempotency.Record) Event {
		e := LedgerEvent(r)
		e.HasIdemKey = true
		var buf [256]byte
		e.IdemKey = idempotency.DeriveKey(session.ID{}, 0, e.AppendOpBytes(buf[:0]))
		return e
	}
	return []Event{keyed(&recs[0]),
		{Op: OpAdd, Session: sid, Seq: 1, Time: recs[1].Time, Key: []byte("n"), Delta: 5}, // the effect, same batch as its complete
		keyed(&recs[1]), keyed(&recs[2]), keyed(&recs[3])}
}

// readGolden reads (or, with ONCEWAL_UPDATE_GOLDEN=1, first writes) a hex
// golden file.
func readGolden(t *testing.T, name string, buf []byte) []byte {
	t.Helper()
	return testutil.ReadGolden(t, filepath.Join("testdata", name), buf)
}

// TestGoldenLedgerBatchKeyed: a batch logged before ledger records lost their
// window key still decodes, to the same records, and re-encodes to itself.
func TestGoldenLedgerBatchKeyed(t *testing.T) {
	want := readGolden(t, "golden_ledger_batch_keyed.hex", nil)
	_, evs, err := DecodeBatch(want, nil)
	require.NoError(t, err)
	require.Equal(t, withLSNs(keyedLedgerEvents(), 4096), evs)
	var recs []idempotency.Record
	for _, e := range evs {
		if e.Op.IsLedger() {
			require.True(t, e.HasIdemKey)
			r, err := e.LedgerRecord()
			require.NoError(t, err)
			recs = append(recs, r)
		}
	}
	require.Equal(t, ledgerRecords()[:4], recs)
	re, err := AppendBatch(nil, 3, 7, 4096, evs)
	require.NoError(t, err)
	require.Equal(t, want, re)
}

func TestGoldenLedgerBatch(t *testing.T) {
	checkGoldenBatch(t, "golden_ledger_batch.hex", goldenLedgerEvents(), OpClaim, "ledger record format drifted")
}

// checkGoldenBatch: events (their first of op first) encode to the golden
// file's bytes, which decode back to them, and every bit flip of which is
// caught as a typed error.
func checkGoldenBatch(t *testing.T, file string, events []Event, first Op, drifted string) {
	t.Helper()
	buf, err := AppendBatch(nil, 3, 7, 4096, events)
	require.NoError(t, err)
	want := readGolden(t, file, buf)
	require.Equal(t, hex.EncodeToString(want), hex.EncodeToString(buf), drifted)
	require.Equal(t, byte(first), want[HeaderSize])
	_, evs, err := DecodeBatch(want, nil)
	require.NoError(t, err)
	require.Equal(t, withLSNs(events, 4096), evs)
	mut := make([]byte, len(want))
	for bit := 0; bit < len(want)*8; bit++ {
		copy(mut, want)
		mut[bit/8] ^= 1 << (bit % 8)
		_, _, err = DecodeBatch(mut, nil)
		requireTyped(t, err)
	}
}

func TestWriterFirstLSN(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWriter(dir, &WriterOptions{Shard: 2, FirstLSN: 1001})
	require.NoError(t, err)
	require.Equal(t, uint64(1001), w.NextLSN())
	require.Equal(t, uint64(1000), w.DurableLSN())
	h, err := w.Append(2, goldenLedgerEvents())
	require.NoError(t, err)
	require.Equal(t, uint64(1001), h.FirstLSN)
	require.NoError(t, w.Close())
	// Reopening ignores FirstLSN: the segments say where the log is.
	w, err = OpenWriter(dir, &WriterOptions{Shard: 2, FirstLSN: 7})
	require.NoError(t, err)
	require.Equal(t, h.LastLSN()+1, w.NextLSN())
	require.NoError(t, w.Close())
	r, err := OpenReader(dir, 2)
	require.NoError(t, err)
	defer r.Close()
	// The log starts at 1001: below it is compacted, not skipped.
	require.ErrorIs(t, r.Seek(1), ErrCompacted)
	require.NoError(t, r.Seek(1001))
	rh, raw, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, h, rh)
	_, evs, err := DecodeBatch(raw, nil)
	require.NoError(t, err)
	require.Equal(t, withLSNs(goldenLedgerEvents(), 1001), evs)
}

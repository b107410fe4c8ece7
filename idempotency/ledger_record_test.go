package idempotency_test

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/idempotency"
)

func sampleRecords() []idempotency.Record {
	fp := idempotency.FingerprintOf([]byte("payload"))
	tok := idempotency.Token{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	long := strings.Repeat("k", idempotency.MaxRequestKeyLen)
	return []idempotency.Record{
		{Kind: idempotency.RecordClaim, Token: tok, Time: 1, Expires: 61, Fingerprint: fp, Scope: "ops", Key: "req-1"},
		{Kind: idempotency.RecordClaim, Token: tok, Time: math.MinInt64, Expires: math.MaxInt64, Fingerprint: fp, Scope: "", Key: long},
		{Kind: idempotency.RecordComplete, Token: tok, Time: 5, Expires: 99, Fingerprint: fp, Scope: strings.Repeat("s", 200), Key: "k", Outcome: []byte("ok")},
		{Kind: idempotency.RecordComplete, Token: tok, Time: 5, Expires: -1, Fingerprint: fp, Scope: "a", Key: "k", Outcome: bytes.Repeat([]byte{0}, 300)},
		{Kind: idempotency.RecordFail, Token: tok, Time: 6, Expires: 16, Fingerprint: fp, Scope: "a", Key: "k", Outcome: []byte("no")},
		{Kind: idempotency.RecordFail, Token: tok, Time: 6, Expires: 16, Fingerprint: fp, Scope: "a", Key: "k"},
		{Kind: idempotency.RecordRelease, Token: tok, Time: 7, Scope: "a", Key: " k "},
		{Kind: idempotency.RecordExtend, Token: tok, Time: 8, Expires: 68, Scope: "a", Key: "k"},
		{Kind: idempotency.RecordExtend, Token: tok, Time: math.MaxInt64, Expires: math.MinInt64, Scope: "", Key: long},
		{Kind: idempotency.RecordClaim, Token: tok, Time: 9, Expires: 69, Fingerprint: fp, Scope: "ops", Key: "req-2",
			Action: "POST /v1/transfers"},
		{Kind: idempotency.RecordClaim, Token: tok, Time: 9, Expires: 69, Fingerprint: fp, Scope: "ops", Key: "req-2",
			Action: strings.Repeat("a", idempotency.MaxActionLen)},
	}
}

// SampleRecordBodies is shared with the fuzz seeds.
func sampleBodies() [][]byte {
	var out [][]byte
	for _, r := range sampleRecords() {
		out = append(out, append([]byte{byte(r.Kind)}, r.AppendBody(nil)...))
	}
	return out
}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range sampleRecords() {
		require.NoError(t, r.Validate())
		body := r.AppendBody([]byte("x"))[1:]
		require.Equal(t, r.BodySize(), len(body))
		got, err := idempotency.DecodeRecord(r.Kind, r.Time, body)
		require.NoError(t, err)
		require.Equal(t, r, got)
		// Every truncation and every extension is refused.
		for n := range len(body) {
			_, err := idempotency.DecodeRecord(r.Kind, r.Time, body[:n])
			require.ErrorIs(t, err, idempotency.ErrBadRecord, "%s cut to %d", r.Kind, n)
		}
		_, err = idempotency.DecodeRecord(r.Kind, r.Time, append(bytes.Clone(body), 0))
		require.ErrorIs(t, err, idempotency.ErrBadRecord)
		// Under another kind the layout does not fit.
		for k := idempotency.RecordKind(0); k < 7; k++ {
			if k == r.Kind || (k == idempotency.RecordComplete && r.Kind == idempotency.RecordFail) ||
				(k == idempotency.RecordFail && r.Kind == idempotency.RecordComplete) {
				continue
			}
			if _, err := idempotency.DecodeRecord(k, r.Time, body); err == nil {
				t.Fatalf("%s body decodes as %s", r.Kind, k)
			}
		}
	}
}

func TestRecordStrict(t *testing.T) {
	r := sampleRecords()[0]
	body := r.AppendBody(nil)
	bad := bytes.Clone(body)
	bad[0] = 2 // version
	_, err := idempotency.DecodeRecord(r.Kind, 0, bad)
	require.ErrorIs(t, err, idempotency.ErrBadRecord)
	// Non-minimal scope length varint: 0x83 0x00 instead of 0x03.
	off := 1 + 16 + 8 + 32
	require.Equal(t, byte(3), body[off])
	nm := append(append(bytes.Clone(body[:off]), 0x83, 0x00), body[off+1:]...)
	_, err = idempotency.DecodeRecord(r.Kind, 0, nm)
	require.ErrorIs(t, err, idempotency.ErrBadRecord)
	// Invalid request key inside an otherwise well-formed record.
	for _, k := range []string{"", "  ", strings.Repeat("k", 201)} {
		br := r
		br.Key = k
		require.ErrorIs(t, br.Validate(), idempotency.ErrInvalidKey)
		_, err := idempotency.DecodeRecord(r.Kind, 0, br.AppendBody(nil))
		require.ErrorIs(t, err, idempotency.ErrBadRecord)
	}
	// Fields that do not belong to the kind.
	rel := sampleRecords()[6]
	rel.Expires = 1
	require.ErrorIs(t, rel.Validate(), idempotency.ErrBadRecord)
	cl := sampleRecords()[0]
	cl.Outcome = []byte("x")
	require.ErrorIs(t, cl.Validate(), idempotency.ErrBadRecord)
	ext := sampleRecords()[7]
	ext.Fingerprint[0] = 1
	require.ErrorIs(t, ext.Validate(), idempotency.ErrBadRecord, "an extend carries no fingerprint")
	for _, r := range sampleRecords()[2:9] {
		r.Action = "x"
		require.ErrorIs(t, r.Validate(), idempotency.ErrBadRecord, "only a claim records an action")
	}
	long := sampleRecords()[10]
	long.Action += "a"
	require.ErrorIs(t, long.Validate(), idempotency.ErrBadRecord)
	_, err = idempotency.DecodeRecord(long.Kind, 0, long.AppendBody(nil))
	require.ErrorIs(t, err, idempotency.ErrBadRecord)
	// A claim without an action is a version 1 body, byte for byte as
	// before actions existed; version 2 with an empty action is not
	// canonical, and version 2 is refused for every other kind.
	plain := sampleRecords()[0].AppendBody(nil)
	require.Equal(t, byte(1), plain[0])
	v2 := append([]byte{2}, plain[1:]...)
	v2 = append(v2, 0) // empty action
	_, err = idempotency.DecodeRecord(idempotency.RecordClaim, 0, v2)
	require.ErrorIs(t, err, idempotency.ErrBadRecord)
	withAction := sampleRecords()[9].AppendBody(nil)
	require.Equal(t, byte(2), withAction[0])
	comp := sampleRecords()[2].AppendBody(nil)
	comp[0] = 2
	_, err = idempotency.DecodeRecord(idempotency.RecordComplete, 0, comp)
	require.ErrorIs(t, err, idempotency.ErrBadRecord)
	big := sampleRecords()[2]
	big.Outcome = make([]byte, idempotency.MaxOutcomeSize+1)
	require.ErrorIs(t, big.Validate(), idempotency.ErrOutcomeTooLarge)
	_, err = idempotency.DecodeRecord(big.Kind, 0, big.AppendBody(nil))
	require.ErrorIs(t, err, idempotency.ErrBadRecord)
}

// FuzzDecodeRecord: arbitrary bytes never panic, fail only with
// ErrBadRecord, and whatever decodes re-encodes to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	for _, b := range sampleBodies() {
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return
		}
		r, err := idempotency.DecodeRecord(idempotency.RecordKind(b[0]), 42, b[1:])
		if err != nil {
			require.ErrorIs(t, err, idempotency.ErrBadRecord)
			return
		}
		require.NoError(t, r.Validate())
		require.Equal(t, b[1:], r.AppendBody(nil))
	})
}

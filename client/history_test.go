package client_test

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/internal/clienthistory"
	"github.com/oncewal/oncewal/internal/ledgerrecord"
	"github.com/oncewal/oncewal/wal"
)

// checkWAL reads every shard's log in walDir (the in-process leader's):
// each request ID of h has at most one ledger complete record, an
// acknowledged one exactly one, whose outcome is the one its answers gave.
func checkWAL(t *testing.T, h *clienthistory.History, walDir string, shards int) {
	t.Helper()
	completes := map[[2]string][]ledgerrecord.Record{}
	for s := range uint32(shards) {
		rd, err := wal.OpenReader(walDir, s)
		require.NoError(t, err)
		for {
			_, raw, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break // the end of what was logged
			}
			require.NoError(t, err)
			_, evs, err := wal.DecodeBatch(raw, nil)
			require.NoError(t, err)
			for i := range evs {
				if !evs[i].Op.IsLedger() {
					continue
				}
				rec, err := evs[i].LedgerRecord()
				require.NoError(t, err)
				if rec.Kind == ledgerrecord.Complete {
					rec.Outcome = bytes.Clone(rec.Outcome) // it points into the reader's buffer
					k := [2]string{rec.Scope, rec.Key}
					completes[k] = append(completes[k], rec)
				}
			}
		}
		require.NoError(t, rd.Close())
	}
	for _, r := range h.Requests() {
		recs := completes[[2]string{r.Client, r.ID}]
		require.LessOrEqual(t, len(recs), 1, "request %s has %d complete records in the WAL", r.ID, len(recs))
		for _, a := range r.Answers() {
			if a.OK() {
				require.Len(t, recs, 1, "acknowledged request %s has no complete record in the WAL", r.ID)
				require.Equal(t, string(a.Res.Outcome), string(recs[0].Outcome), "request %s: the answer's outcome is not the WAL's", r.ID)
			}
		}
	}
}

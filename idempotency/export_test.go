package idempotency

import "github.com/cockroachdb/pebble/v2"

// Reset deletes every ledger entry and the ledger's clock and sweep marks.
// It exists only in this package's tests: a test file is never compiled
// into a production binary, so no configuration can reach it.
func (l *Ledger) Reset() error {
	l.logMu.Lock()
	defer l.logMu.Unlock()
	return l.table.db.DeleteRange([]byte(LedgerPrefix), []byte("l0"), pebble.Sync)
}

// DB is the store the table lives in; the table hands it to no one else, so
// that a follower's or leader's LedgerTable is no way round store.View.
func (t *LedgerTable) DB() *pebble.DB { return t.db }

package replication

import (
	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/idempotency"
)

// JournalKeys returns how many idempotency keys the window journal in db
// holds, counting only entries that decode (the ones a Receiver would replay).
// A follower opened on db with window capacity c starts with min(n, c) keys in
// its window; the journal may hold slightly more than c because an entry is
// pruned only once every one of its keys has been pushed out.
//
// It only reads, so it works on a store opened ReadOnly (oncewal inspect).
func JournalKeys(db *pebble.DB) (int, error) {
	// Reuse loadJournal so the decode rule lives in one place; a window of
	// capacity 1 keeps the replay it performs from costing memory.
	j, err := loadJournal(db, idempotency.NewStore(1), func(string, ...any) {})
	if err != nil {
		return 0, err
	}
	return j.total, nil
}

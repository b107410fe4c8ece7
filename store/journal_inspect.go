package store

import (
	"log/slog"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/idempotency"
)

// JournalWindow replays the window journal in db into a window of the given
// capacity, exactly as a Receiver opening db would, and returns how many keys
// the rebuilt window holds and how many key records the journal holds (a key
// recorded again, as a window hit, counts once per record).
//
// It only reads, so it works on a store opened ReadOnly (oncewal inspect).
func JournalWindow(db *pebble.DB, capacity int) (window, records int, err error) {
	w := idempotency.NewStore(capacity)
	j, err := loadJournal(db, w, slog.New(slog.DiscardHandler))
	if err != nil {
		return 0, 0, err
	}
	return w.Len(), j.total, nil
}

package testutil

import (
	"github.com/cockroachdb/pebble/v2"
)

// SnapshotDB returns every key and value in db, for byte-for-byte comparisons
// of a store before and after an operation that must not change it.
func SnapshotDB(db pebble.Reader) (map[string]string, error) {
	it, err := db.NewIter(nil)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for valid := it.First(); valid; valid = it.Next() {
		out[string(it.Key())] = string(it.Value())
	}
	return out, it.Close()
}

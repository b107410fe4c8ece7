package testutil

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// DBOptions are the Pebble options the helpers open a store with: fs,
// Pebble's newest format (what oncewal's stores use) and PanicLogger. A test
// that needs more (a cache size, the store's own logger) changes the copy it
// gets and calls OpenDBWith.
func DBOptions(fs vfs.FS) *pebble.Options {
	return &pebble.Options{FS: fs, FormatMajorVersion: pebble.FormatNewest, Logger: PanicLogger{}}
}

// OpenDB opens the Pebble store at dir on fs with DBOptions and fails the
// test if it cannot. The test closes it: a test that reopens a store closes
// it and opens it again by name on the same FS.
func OpenDB(t testing.TB, fs vfs.FS, dir string) *pebble.DB {
	t.Helper()
	return OpenDBWith(t, dir, DBOptions(fs))
}

// OpenDBWith is OpenDB with options of the test's own (DBOptions changed).
func OpenDBWith(t testing.TB, dir string, o *pebble.Options) *pebble.DB {
	t.Helper()
	db, err := pebble.Open(dir, o)
	if err != nil {
		t.Fatalf("opening the Pebble store %q: %v", dir, err)
	}
	return db
}

// MemDB is a Pebble store on a fresh in-memory filesystem, closed when the
// test ends; the close must succeed (it fails on a leaked iterator), so the
// test must not close it itself.
func MemDB(t testing.TB) *pebble.DB {
	t.Helper()
	db := OpenDB(t, vfs.NewMem(), "db")
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("closing the in-memory store: %v", err)
		}
	})
	return db
}

// PanicLogger is a pebble.Logger for tests: Infof and Errorf are dropped,
// and Fatalf panics with the message. Pebble's default logger exits the
// process on Fatalf, which would end every test of the binary with no
// trace of which one failed.
type PanicLogger struct{}

// Infof implements pebble.Logger.
func (PanicLogger) Infof(string, ...any) {}

// Errorf implements pebble.Logger.
func (PanicLogger) Errorf(string, ...any) {}

// Fatalf implements pebble.Logger by panicking.
func (PanicLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("pebble: fatal: "+format, args...))
}

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

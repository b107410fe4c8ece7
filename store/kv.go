package store

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/kv"
)

// The principal key space's read API (package kv): rows the default
// Applier wrote from kvput and kvdelete events, read from the committed
// store. Every read holds the store's gate for its duration, so it never
// runs into Close (ErrClosed after it), refuses a failed store with its
// failure (ErrFailed, ErrApply), and turns a panic of a failing Pebble into
// ErrFailed: a read answers with an error, never a crash.

// KVPair is one row of a range read: the key without its principal, and
// the row.
type KVPair struct {
	Key []byte
	Row kv.Row
}

// KVSnap is one consistent read of the key space: the rows and the
// position of a single Pebble snapshot, so every row read through it is
// exactly the state after the batch ending at AppliedLSN (the applied
// position commits in the same Pebble batch as the rows).
type KVSnap struct {
	r              pebble.Reader
	applied, epoch uint64
}

// AppliedLSN is the applied position of the state the snapshot reads: a
// reader at or past a client's MinLSN serves read-your-writes; ModLSN of
// every row read is at or below it.
func (x *KVSnap) AppliedLSN() uint64 { return x.applied }

// Epoch is the highest committed leader epoch at the snapshot.
func (x *KVSnap) Epoch() uint64 { return x.epoch }

// Get reads principal's key: its row, or found false. Values are copies.
func (x *KVSnap) Get(principal string, key []byte) (kv.Row, bool, error) {
	if err := kv.CheckRead(principal, key, false, 0); err != nil {
		return kv.Row{}, false, err
	}
	return getRow(x.r, kv.AppendScoped([]byte(keyspace.KV), principal, key))
}

// Range reads principal's keys that start with prefix (empty: all of
// them), in key order, at most limit rows (0: kv.MaxRangeLimit) and about
// kv.MaxRangeBytes of keys and values (at least one row); more reports
// that rows remain after the last one returned (continue after its key).
// Keys and values are copies.
func (x *KVSnap) Range(principal string, prefix []byte, limit int) (pairs []KVPair, more bool, err error) {
	if err := kv.CheckRead(principal, prefix, true, limit); err != nil {
		return nil, false, err
	}
	if limit == 0 {
		limit = kv.MaxRangeLimit
	}
	lower := kv.AppendScoped([]byte(keyspace.KV), principal, prefix)
	it, err := x.r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(lower)})
	if err != nil {
		return nil, false, err
	}
	strip := len(keyspace.KV) + 1 + len(principal)
	size := 0
	for valid := it.First(); valid; valid = it.Next() {
		if len(pairs) == limit || len(pairs) > 0 && size >= kv.MaxRangeBytes {
			more = true
			break
		}
		v, err := it.ValueAndErr()
		if err != nil {
			break // it.Close reports it
		}
		row, err := decodeRow(it.Key(), v)
		if err != nil {
			_ = it.Close()
			return nil, false, err
		}
		row.Value = ownValue(row.Value)
		pairs = append(pairs, KVPair{Key: slices.Clone(it.Key()[strip:]), Row: row})
		size += len(it.Key()) + len(v)
	}
	if err := it.Close(); err != nil {
		return nil, false, fmt.Errorf("store: key-space range of %q: %w", prefix, err)
	}
	return pairs, more, nil
}

// KVRead runs fn on one consistent snapshot of the key space (KVSnap) and
// returns fn's error. fn must not call the Store: the read holds the
// store's gate, and a Close waiting between two holds of one goroutine
// would deadlock it.
func (s *Store) KVRead(fn func(*KVSnap) error) error {
	release, ok := s.life.Hold()
	if !ok {
		return ErrClosed
	}
	defer release()
	if err := s.recv.Err(); err != nil {
		return err
	}
	return guard(func() error {
		snap := s.db.NewSnapshot()
		defer snap.Close()
		applied, epoch, _, err := ReadMeta(snap)
		if err != nil {
			return fmt.Errorf("store: reading the position of a key-space read: %w", err)
		}
		return fn(&KVSnap{r: snap, applied: applied, epoch: epoch})
	})
}

// KVGet reads principal's key from the committed store (KVSnap.Get).
func (s *Store) KVGet(principal string, key []byte) (row kv.Row, found bool, err error) {
	err = s.KVRead(func(x *KVSnap) error {
		row, found, err = x.Get(principal, key)
		return err
	})
	return row, found, err
}

// KVRange reads principal's keys under prefix from the committed store
// (KVSnap.Range).
func (s *Store) KVRange(principal string, prefix []byte, limit int) (pairs []KVPair, more bool, err error) {
	err = s.KVRead(func(x *KVSnap) error {
		pairs, more, err = x.Range(principal, prefix, limit)
		return err
	})
	return pairs, more, err
}

// KVReader returns a kv.Reader of the committed store, by scoped key, for
// the leader's kv.Resolve (under kv.Layer with its kv.Pending). Each Get
// reads the store as it is at that moment: while the leader holds the lock
// under which it resolves and notes, the store changes only rows of
// batches the overlay still holds, and the overlay hides those, so a
// resolution reads one consistent state.
func (s *Store) KVReader() kv.Reader { return storeKVReader{s} }

type storeKVReader struct{ s *Store }

func (r storeKVReader) Get(scoped []byte) (row kv.Row, found bool, err error) {
	release, ok := r.s.life.Hold()
	if !ok {
		return kv.Row{}, false, ErrClosed
	}
	defer release()
	if err := r.s.recv.Err(); err != nil {
		return kv.Row{}, false, err
	}
	err = guard(func() (err error) {
		row, found, err = getRow(r.s.db, append([]byte(keyspace.KV), scoped...))
		return err
	})
	return row, found, err
}

// KVReaderOf returns a kv.Reader of the key space in r, a Pebble store or
// snapshot the caller keeps open (a LedgerLog's own DB, wired without a
// Store: LedgerLogOptions.KV); a Store's is KVReader.
func KVReaderOf(r pebble.Reader) kv.Reader { return pebbleKVReader{r} }

type pebbleKVReader struct{ r pebble.Reader }

func (p pebbleKVReader) Get(scoped []byte) (kv.Row, bool, error) {
	return getRow(p.r, append([]byte(keyspace.KV), scoped...))
}

// getRow reads and decodes the row at key (keyspace.KV + scoped key),
// copying its value out of Pebble's buffer.
func getRow(r pebble.Reader, key []byte) (kv.Row, bool, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return kv.Row{}, false, nil
	}
	if err != nil {
		return kv.Row{}, false, err
	}
	defer closer.Close()
	row, err := decodeRow(key, v)
	if err != nil {
		return kv.Row{}, false, err
	}
	row.Value = ownValue(row.Value)
	return row, true, nil
}

// ownValue copies a value out of Pebble's buffer; an empty value is
// non-nil, as Pending and Resolve hold it.
func ownValue(v []byte) []byte { return append([]byte{}, v...) }

func decodeRow(key, v []byte) (kv.Row, error) {
	row, err := kv.DecodeRow(v)
	if err != nil {
		return kv.Row{}, fmt.Errorf("store: key-space row %q: %w", key, err)
	}
	return row, nil
}

// prefixEnd is the smallest key above every key that starts with p: p with
// its trailing 0xff bytes dropped and the last byte left incremented. p
// starts with keyspace.KV, so some byte is below 0xff.
func prefixEnd(p []byte) []byte {
	end := slices.Clone(p)
	for len(end) > 0 && end[len(end)-1] == 0xff {
		end = end[:len(end)-1]
	}
	end[len(end)-1]++
	return end
}

package session

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// ScanHWMs calls fn for every session with an HWM record in r, in session ID
// order, with the committed HWM, closed flag and last-activity timestamp: the
// session's row, or its newer change in the HWM log (doc.go, "Amortised HWM
// persistence"), which it merges in. It is a read-only view for tools
// (oncewal inspect) and verification: it applies no expiry — a record older
// than WAL clock − horizon that GC has not collected yet is reported as it
// is — and it does not touch any Tracker's cache. It holds the log's
// sessions in memory (at most about LogSessions plus a batch).
//
// r may be a *pebble.DB (also one opened ReadOnly), a snapshot or a batch. A
// record or delta that does not decode stops the scan with an error wrapping
// ErrCorrupt that names the key; an error from fn stops it and is returned as
// is.
func ScanHWMs(r pebble.Reader, fn func(id ID, hwm SeqNo, closed bool, lastTS int64) error) error {
	if r == nil {
		return ErrNilDB
	}
	logged, _, _, err := replayLog(r)
	if err != nil {
		return err
	}
	pending := sortedLogged(logged, false) // logged sessions, by ID
	emit := func(id ID, rec record) error { return fn(id, rec.hwm, rec.closed, rec.lastTS) }
	// emitLogged reports the logged sessions ordered before id (all with
	// id nil) that are not deleted.
	emitLogged := func(id *ID) error {
		for len(pending) > 0 && (id == nil || bytes.Compare(pending[0].id[:], id[:]) < 0) {
			if pending[0].exists {
				if err := emit(pending[0].id, pending[0].rec); err != nil {
					return err
				}
			}
			pending = pending[1:]
		}
		return nil
	}
	lower := []byte(HWMPrefix)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(lower)})
	if err != nil {
		return err
	}
	for valid := it.First(); valid; valid = it.Next() {
		key := it.Key()
		if len(key) != hwmKeyLen {
			continue // ClockKey lives in the same prefix; it has another length
		}
		var id ID
		copy(id[:], key[len(HWMPrefix):])
		if err := emitLogged(&id); err != nil {
			_ = it.Close()
			return err
		}
		if len(pending) > 0 && pending[0].id == id {
			// The log holds a newer state than the row (or its deletion).
			l := pending[0]
			pending = pending[1:]
			if l.exists {
				if err := emit(id, l.rec); err != nil {
					_ = it.Close()
					return err
				}
			}
			continue
		}
		val, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return err
		}
		rec, err := decodeRecord(val)
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("%w: key %x", err, key)
		}
		if err := emit(id, rec); err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return err
	}
	return emitLogged(nil)
}

package session

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// ScanHWMs calls fn for every HWM record in r, in session ID order, with the
// committed HWM, closed flag and last-activity timestamp as stored. It is a
// read-only view for tools (oncewal inspect) and verification: it applies no
// expiry — a row older than WAL clock − horizon that GC has not collected yet
// is reported as it is — and it does not touch any Tracker's cache.
//
// r may be a *pebble.DB (also one opened ReadOnly), a snapshot or a batch. A
// record that does not decode stops the scan with an error wrapping ErrCorrupt
// that names the key; an error from fn stops it and is returned as is.
func ScanHWMs(r pebble.Reader, fn func(id ID, hwm SeqNo, closed bool, lastTS int64) error) error {
	if r == nil {
		return ErrNilDB
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
		var id ID
		copy(id[:], key[len(HWMPrefix):])
		if err := fn(id, rec.hwm, rec.closed, rec.lastTS); err != nil {
			_ = it.Close()
			return err
		}
	}
	return it.Close()
}

package kv

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/oncewal/oncewal/internal/eventid"
	"github.com/oncewal/oncewal/wal"
)

// Reader reads rows by scoped key. ok is false for a key that does not
// exist; an error is a failed read (I/O, a corrupt row), never "absent".
// The Row's Value must stay valid and unchanged after the call.
type Reader interface {
	Get(scoped []byte) (row Row, ok bool, err error)
}

// Resolve evaluates t for principal against r — the state after every
// batch logged before this one — and returns the events that carry its
// effect out and what it answered. It is the leader's half of a
// transaction; replicas only apply the events, which are absolute (puts of
// whole values at stamped versions, deletes), so they need no evaluation
// and every replica ends with the same rows.
//
// The compares are evaluated first, all against r (AND; an empty If
// holds), then the ops of the branch chosen, in order, against r plus
// the branch's earlier ops. A Put becomes a wal.OpKVPut of its value at
// version prior+1 (prior 0 when absent); an Add an OpKVPut of the new
// counter; a Delete of an existing key an OpKVDelete (of an absent key
// nothing); a Get no event. Event i carries session and LSN firstLSN+i:
// the caller must log the events in that order at exactly those LSNs,
// consecutive from firstLSN, since the results report them as ModLSN (the
// replicas stamp rows with the LSN the log gives). The caller stamps
// SeqNo, idempotency key and time, as for any data event.
//
// Errors — ErrInvalidPrincipal, ErrInvalidTxn (Validate), ErrNotCounter,
// ErrOverflow, ErrResultTooLarge, or r's error — come with no events: the
// request is refused and nothing is logged. Resolve is pure: the same r,
// arguments and state give the same events and result.
func Resolve(r Reader, principal string, t *Txn, session eventid.SessionID, firstLSN uint64) ([]wal.Event, Result, error) {
	if err := CheckPrincipal(principal); err != nil {
		return nil, Result{}, err
	}
	if err := t.Validate(); err != nil {
		return nil, Result{}, err
	}
	ok := true
	for i := range t.If {
		c := &t.If[i]
		row, found, err := r.Get(Scoped(principal, c.Key))
		if err != nil {
			return nil, Result{}, fmt.Errorf("kv: reading compare %d's key %q: %w", i, c.Key, err)
		}
		if !compare(c, row, found) {
			ok = false // every compare is still read: a read error refuses alike either way
		}
	}
	ops := t.Then
	if !ok {
		ops = t.Else
	}
	res := Result{Succeeded: ok, Ops: make([]OpResult, 0, len(ops))}
	var events []wal.Event
	// written holds the branch's own writes by scoped key: later ops read
	// them before r.
	written := map[string]*pendingRow{}
	get := func(scoped []byte) (Row, bool, error) {
		if w, ok := written[string(scoped)]; ok {
			return w.row, !w.deleted, nil
		}
		return r.Get(scoped)
	}
	resultBytes := 0
	for i := range ops {
		op := &ops[i]
		scoped := Scoped(principal, op.Key)
		cur, found, err := get(scoped)
		if err != nil {
			return nil, Result{}, fmt.Errorf("kv: reading op %d's key %q: %w", i, op.Key, err)
		}
		out := OpResult{Kind: op.Kind, Found: found}
		lsn := firstLSN + uint64(len(events))
		write := func(value []byte) error {
			prior := uint64(0)
			if found {
				prior = cur.Version
			}
			if prior >= math.MaxInt64 {
				return fmt.Errorf("%w: op %d: key %q is at version %d, the last there is", ErrOverflow, i, op.Key, prior)
			}
			row := Row{Value: value, Version: prior + 1, ModLSN: lsn}
			events = append(events, wal.Event{LSN: lsn, Op: wal.OpKVPut, Session: session, Key: scoped,
				Value: value, Delta: int64(row.Version)})
			written[string(scoped)] = &pendingRow{row: row, lsn: lsn}
			out.Version, out.ModLSN = row.Version, lsn
			return nil
		}
		switch op.Kind {
		case Put:
			err = write(op.Value)
		case Add:
			var n int64
			if found {
				if len(cur.Value) != 8 {
					return nil, Result{}, fmt.Errorf("%w: op %d adds to key %q, whose value is %d bytes, not 8 "+
						"(a little-endian int64): put a counter there first, or add to another key", ErrNotCounter, i, op.Key, len(cur.Value))
				}
				n = int64(binary.LittleEndian.Uint64(cur.Value))
			}
			sum := n + op.Delta
			if (op.Delta > 0 && sum < n) || (op.Delta < 0 && sum > n) {
				return nil, Result{}, fmt.Errorf("%w: op %d: key %q holds %d, adding %d leaves int64", ErrOverflow, i, op.Key, n, op.Delta)
			}
			out.Value = binary.LittleEndian.AppendUint64(make([]byte, 0, 8), uint64(sum))
			err = write(out.Value)
		case Delete:
			if found {
				events = append(events, wal.Event{LSN: lsn, Op: wal.OpKVDelete, Session: session, Key: scoped})
				written[string(scoped)] = &pendingRow{deleted: true, lsn: lsn}
				out.ModLSN = lsn
			}
		case Get:
			if found {
				// A copy: the row may be the overlay's, which the caller must not reach.
				out.Value, out.Version, out.ModLSN = append([]byte{}, cur.Value...), cur.Version, cur.ModLSN
			}
		}
		if err != nil {
			return nil, Result{}, err
		}
		if resultBytes += len(out.Value); resultBytes > MaxResultBytes {
			return nil, Result{}, fmt.Errorf("%w: more than %d bytes of values by op %d", ErrResultTooLarge, MaxResultBytes, i)
		}
		res.Ops = append(res.Ops, out)
	}
	return events, res, nil
}

// compare evaluates c against a key's row (found: it exists). As in etcd, a
// missing key has version 0 and modLSN 0 and does not exist (exists 0); a
// value compare on a missing key is false whatever its result — != too —
// since no operand stands for "no value" (an empty value is a value):
// test existence with TargetExists or TargetVersion.
func compare(c *Compare, row Row, found bool) bool {
	switch c.Target {
	case TargetValue:
		return found && c.Result.holds(bytes.Compare(row.Value, c.Value))
	case TargetCounter:
		var n int64
		if found {
			if len(row.Value) != 8 {
				return false // no counter: no order to hold
			}
			n = int64(binary.LittleEndian.Uint64(row.Value))
		}
		return c.Result.holds(cmp.Compare(n, c.Counter))
	}
	var cur uint64
	if found {
		switch c.Target {
		case TargetVersion:
			cur = row.Version
		case TargetModLSN:
			cur = row.ModLSN
		case TargetExists:
			cur = 1
		}
	}
	return c.Result.holds(cmp.Compare(cur, c.Number))
}

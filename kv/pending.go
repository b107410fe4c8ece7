package kv

import (
	"bytes"

	"github.com/oncewal/oncewal/wal"
)

// Pending is a leader's overlay of the key-space writes of batches it has
// logged but not yet applied to its store: its store lags its log by the
// batches between their WAL write and their apply, and a transaction must
// be resolved against the state after every batch logged before it, or
// two concurrent transactions would both pass a compare only one may.
// Layer(p, store) is that state.
//
// The leader Notes each batch's events (with their LSNs) when it logs
// them and Forgets up to its store's applied LSN after each apply. An
// entry is a key's newest logged write, a row or a tombstone, and the LSN
// that wrote it; Forget drops it once the store shows that write, and
// keeps it while a newer write to the key is still pending.
//
// The zero value is an empty overlay. Not safe for concurrent use: the
// leader calls it under the lock that orders its stamping and logging.
type Pending struct {
	rows map[string]*pendingRow
	// order is every Note's (lsn, key) in LSN order: Forget pops its front.
	order []noted
	head  int
}

type pendingRow struct {
	row     Row
	deleted bool
	lsn     uint64
}

type noted struct {
	lsn uint64
	key string
}

// Note records the key-space writes among events (logged, with their LSNs
// set, in log order; other ops are ignored): an OpKVPut as its row, an
// OpKVDelete as a tombstone, by scoped key, the newest LSN winning. Values
// are copied: events may alias a batch buffer.
func (p *Pending) Note(events []wal.Event) {
	for i := range events {
		ev := &events[i]
		if !ev.Op.IsKV() {
			continue
		}
		if p.rows == nil {
			p.rows = map[string]*pendingRow{}
		}
		k := string(ev.Key)
		if cur, ok := p.rows[k]; ok && cur.lsn > ev.LSN {
			continue
		}
		e := &pendingRow{lsn: ev.LSN, deleted: ev.Op == wal.OpKVDelete}
		if !e.deleted {
			e.row = Row{Value: bytes.Clone(ev.Value), Version: uint64(ev.Delta), ModLSN: ev.LSN}
			if e.row.Value == nil {
				e.row.Value = []byte{}
			}
		}
		p.rows[k] = e
		p.order = append(p.order, noted{lsn: ev.LSN, key: k})
	}
}

// Forget drops every entry whose write is at or below applied: the store
// now shows it (or something newer).
func (p *Pending) Forget(applied uint64) {
	for p.head < len(p.order) && p.order[p.head].lsn <= applied {
		n := p.order[p.head]
		if e, ok := p.rows[n.key]; ok && e.lsn <= applied {
			delete(p.rows, n.key)
		}
		p.order[p.head] = noted{}
		p.head++
	}
	if p.head == len(p.order) {
		p.order, p.head = p.order[:0], 0
	} else if p.head > 1024 && p.head > len(p.order)/2 {
		p.order, p.head = append(p.order[:0], p.order[p.head:]...), 0
	}
}

// Len is the number of keys the overlay holds.
func (p *Pending) Len() int { return len(p.rows) }

// get reads the overlay: known reports whether it holds the key, ok
// whether the key exists there (false: a tombstone).
func (p *Pending) get(scoped []byte) (row Row, ok, known bool) {
	e, known := p.rows[string(scoped)]
	if !known {
		return Row{}, false, false
	}
	return e.row, !e.deleted, true
}

// Layer returns the Reader of r with p over it: a key p holds reads as p
// has it (a tombstone as absent), any other as r has it.
func Layer(p *Pending, r Reader) Reader { return layered{p: p, r: r} }

type layered struct {
	p *Pending
	r Reader
}

func (l layered) Get(scoped []byte) (Row, bool, error) {
	if row, ok, known := l.p.get(scoped); known {
		return row, ok, nil
	}
	return l.r.Get(scoped)
}

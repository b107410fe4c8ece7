package session

import (
	"encoding/binary"
	"errors"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/internal/keyspace"
)

// StatePrefix prefixes the rows of the default session state machine:
//
//	StatePrefix + ID(16) + userKey → version(1) | user value
//
// The user key may be empty. Add stores its counter as 8 bytes little-endian
// user value.
const StatePrefix = keyspace.State

// ErrNilState: Begin on a nil *State.
var ErrNilState = errors.New("session: nil State")

// State is the default session state machine: per-session put / delete / add
// on byte keys, written into the caller's Pebble batch. Reads go to the
// committed store. Safe for concurrent use (each StateTx is not).
type State struct {
	db *pebble.DB
}

// NewState returns the state machine over db.
func NewState(db *pebble.DB) *State { return &State{db: db} }

// Begin starts the state writes of one Pebble batch.
func (s *State) Begin(b *pebble.Batch) *StateTx {
	return &StateTx{s: s, b: b}
}

// StateTx writes session state into one batch and sees its own pending writes:
// an Add after a Put or another Add of the same key in the same batch builds on
// it. On an indexed batch (what the receiver gives an Applier) Add reads the
// batch itself. On a plain one, because only Add reads, the tx remembers each
// pending key as the int64 it would read back (non-8-byte values and
// deletions read as 0), not as bytes.
type StateTx struct {
	s         *State
	b         *pebble.Batch
	writeOnly bool // WriteOnly: Add refused, nothing remembered
	pending   map[string]int64
	kbuf      []byte
	vbuf      []byte
}

func (tx *StateTx) key(id ID, key []byte) []byte {
	tx.kbuf = append(append(append(tx.kbuf[:0], StatePrefix...), id[:]...), key...)
	return tx.kbuf
}

func (tx *StateTx) note(k []byte, v int64) {
	if tx.writeOnly || tx.indexed() {
		return // no Add follows, or Add reads the batch
	}
	if tx.pending == nil {
		tx.pending = make(map[string]int64, 16)
	}
	tx.pending[string(k)] = v
}

func (tx *StateTx) valid() error {
	if tx.s == nil || tx.s.db == nil {
		return ErrNilDB
	}
	if tx.b == nil {
		return ErrNilBatch
	}
	return nil
}

// Put sets key to value in the session (value is copied).
func (tx *StateTx) Put(id ID, key, value []byte) error {
	if err := tx.valid(); err != nil {
		return err
	}
	k := tx.key(id, key)
	tx.vbuf = append(append(tx.vbuf[:0], formatVersion), value...)
	if err := tx.b.Set(k, tx.vbuf, nil); err != nil {
		return err
	}
	tx.note(k, counterOf(value))
	return nil
}

// ErrWriteOnly: Add on a StateTx declared WriteOnly.
var ErrWriteOnly = errors.New("session: Add on a write-only state tx")

// WriteOnly declares that this tx will only Put and Delete: they then
// remember nothing for a later Add, which is refused (ErrWriteOnly, nothing
// written). An Applier that knows a batch has no Add uses it with a plain
// batch.
func (tx *StateTx) WriteOnly() { tx.writeOnly = true }

// indexed reports whether Add can read the batch itself (an indexed batch
// sees its own writes), so that nothing needs to be remembered: a Put then
// costs no map insert (and no key copy), which was a fifth of the default
// Applier's cost per event.
func (tx *StateTx) indexed() bool { return tx.b.Indexed() }

// Delete removes key from the session (absent keys are fine).
func (tx *StateTx) Delete(id ID, key []byte) error {
	if err := tx.valid(); err != nil {
		return err
	}
	k := tx.key(id, key)
	if err := tx.b.Delete(k, nil); err != nil {
		return err
	}
	tx.note(k, 0)
	return nil
}

// Add adds delta to the key's signed 64-bit counter (8 bytes little-endian;
// absent or any other length counts as 0). Overflow wraps (two's complement),
// so every replica computes the same value.
func (tx *StateTx) Add(id ID, key []byte, delta int64) error {
	if err := tx.valid(); err != nil {
		return err
	}
	if tx.writeOnly {
		return ErrWriteOnly
	}
	k := tx.key(id, key)
	cur, ok := tx.pending[string(k)]
	if !ok {
		r := pebble.Reader(tx.s.db)
		if tx.indexed() {
			r = tx.b // the committed store overlaid with this batch
		}
		v, found, err := get(r, k)
		if err != nil {
			return err
		}
		if found {
			cur = counterOf(v)
		}
	}
	n := cur + delta
	var vb [9]byte
	vb[0] = formatVersion
	binary.LittleEndian.PutUint64(vb[1:], uint64(n))
	if err := tx.b.Set(k, vb[:], nil); err != nil {
		return err
	}
	tx.note(k, n)
	return nil
}

func counterOf(v []byte) int64 {
	if len(v) != 8 {
		return 0
	}
	return int64(binary.LittleEndian.Uint64(v))
}

// get returns a copy of the user value (version byte stripped) of a full key.
func (s *State) get(k []byte) ([]byte, bool, error) { return get(s.db, k) }

// get reads the user value of full key k from r (a copy).
func get(r pebble.Reader, k []byte) ([]byte, bool, error) {
	val, closer, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer closer.Close()
	u, err := userValue(val)
	if err != nil {
		return nil, false, err
	}
	return append([]byte{}, u...), true, nil
}

func userValue(v []byte) ([]byte, error) {
	if len(v) < 1 || v[0] != formatVersion {
		return nil, ErrCorrupt
	}
	return v[1:], nil
}

func stateKey(id ID, key []byte) []byte {
	return append(append(append(make([]byte, 0, len(StatePrefix)+len(id)+len(key)), StatePrefix...), id[:]...), key...)
}

// Get returns the committed value of key in the session.
func (s *State) Get(id ID, key []byte) ([]byte, bool, error) {
	if s == nil || s.db == nil {
		return nil, false, ErrNilDB
	}
	return s.get(stateKey(id, key))
}

// Counter returns the committed counter of key as Add reads it.
func (s *State) Counter(id ID, key []byte) (int64, error) {
	v, _, err := s.Get(id, key)
	return counterOf(v), err
}

// Keys returns all committed keys of the session with their values.
func (s *State) Keys(id ID) (map[string][]byte, error) {
	if s == nil || s.db == nil {
		return nil, ErrNilDB
	}
	lower := stateKey(id, nil)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(lower)})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	out := make(map[string][]byte)
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, err
		}
		u, err := userValue(v)
		if err != nil {
			return nil, err
		}
		out[string(it.Key()[len(lower):])] = append([]byte{}, u...)
	}
	return out, it.Error()
}

// Sessions returns, in ID order, the sessions that have at least one committed
// state row. It seeks past each session, so its cost grows with the number of
// sessions, not rows.
func (s *State) Sessions() ([]ID, error) {
	if s == nil || s.db == nil {
		return nil, ErrNilDB
	}
	lower := []byte(StatePrefix)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(lower)})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var ids []ID
	for valid := it.First(); valid; {
		k := it.Key()
		if len(k) < len(StatePrefix)+len(ID{}) {
			return ids, ErrCorrupt
		}
		var id ID
		copy(id[:], k[len(StatePrefix):])
		ids = append(ids, id)
		end := prefixEnd(stateKey(id, nil))
		if end == nil {
			break
		}
		valid = it.SeekGE(end)
	}
	return ids, it.Error()
}

package leader

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/internal/keyspace"
)

// A slot is the leader's durable record of how far one registered follower
// of a shard has acknowledged the log (PostgreSQL's replication slot): the
// WAL below the lowest slot is deleted, nothing at or above it is. Slots live
// in the shard's local store under slotPrefix, one key per follower ID.
//
// Slots belong to one epoch's leader (keyspace.LeaderOnly): a store that
// starts a new epoch starts without them (replication deletes them with
// the raised epoch) and a rebuilt store never inherits them
// (follower.Rebuild), so a promoted store's slots are exactly its registered
// followers', each at its log's start.
//
// A slot only moves forward. It is persisted by the retention pass before any
// segment is deleted, so after a crash the recorded value is at most the
// follower's real position and retention stays conservative. A slot that the
// retention bound dropped (Dropped) no longer pins the WAL; its follower is
// refused with replication.ErrBehindRetention once what it needs is gone,
// until it is rebuilt.
type slot struct {
	ID      string
	Acked   uint64 // highest LSN the follower acknowledged (durably applied)
	Dropped bool   // released by the retention bound
}

// slotPrefix is the slots' key space in the shard store (see follower's key
// layout: m/ is metadata).
var slotPrefix = []byte(keyspace.MetaSlot)

const slotVersion = 1

func slotKey(id string) []byte { return append(slices.Clip(slotPrefix), id...) }

func encodeSlot(s slot) []byte {
	v := []byte{slotVersion, 0}
	if s.Dropped {
		v[1] = 1
	}
	return binary.LittleEndian.AppendUint64(v, s.Acked)
}

// errBadSlot marks an undecodable slot record.
var errBadSlot = corruption.Mark(errors.New("leader: corrupt replication slot record"))

func decodeSlot(id string, v []byte) (slot, error) {
	if len(v) != 10 || v[0] != slotVersion || v[1] > 1 {
		return slot{}, fmt.Errorf("%w: %q: % x", errBadSlot, id, v)
	}
	return slot{ID: id, Dropped: v[1] == 1, Acked: binary.LittleEndian.Uint64(v[2:])}, nil
}

// loadSlots reads every slot of the store, sorted by ID.
func loadSlots(db *pebble.DB) ([]slot, error) {
	upper := keyspace.UpperBound(keyspace.MetaSlot)
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: slotPrefix, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []slot
	for it.First(); it.Valid(); it.Next() {
		id := string(bytes.TrimPrefix(it.Key(), slotPrefix))
		s, err := decodeSlot(id, it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, it.Error()
}

// saveSlots writes slots and deletes the slots of removed IDs in one synced
// batch.
func saveSlots(db *pebble.DB, slots []slot, removed []string) error {
	b := db.NewBatch()
	defer b.Close()
	for _, s := range slots {
		if err := b.Set(slotKey(s.ID), encodeSlot(s), nil); err != nil {
			return err
		}
	}
	for _, id := range removed {
		if err := b.Delete(slotKey(id), nil); err != nil {
			return err
		}
	}
	return b.Commit(pebble.Sync)
}

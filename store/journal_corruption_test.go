package store_test

import (
	"encoding/binary"
	"testing"

	"github.com/oncewal/oncewal/internal/keyspace"
	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/stretchr/testify/require"
)

// TestWindowJournalUndecodableEntryFailsOpen: an entry that does not decode
// must fail the open as corruption, never be skipped — a window rebuilt
// without it would let a retry under a fresh SeqNo apply twice.
func TestWindowJournalUndecodableEntryFailsOpen(t *testing.T) {
	for name, value := range map[string][]byte{
		"empty":         {},
		"wrong version": append([]byte{2}, make([]byte, 16)...),
		"partial key":   append([]byte{1}, make([]byte, 15)...),
	} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, nil)
			k := idempotency.Key{7}
			_, err := r.recv.Apply(r.batch(add(session.NewID(), 1, 1, &k)))
			require.NoError(t, err)

			key := binary.BigEndian.AppendUint64(append([]byte(nil), keyspace.Journal...), 1<<40)
			require.NoError(t, r.db.Set(key, value, nil))
			_, err = store.NewReceiver(r.db, r.tracker, idempotency.NewStore(1000), r.applier, &store.ReceiverOptions{Shard: 3})
			require.ErrorIs(t, err, corruption.Err)

			require.NoError(t, r.db.Delete(key, nil))
			fresh := idempotency.NewStore(1000)
			_, err = store.NewReceiver(r.db, r.tracker, fresh, r.applier, &store.ReceiverOptions{Shard: 3})
			require.NoError(t, err)
			require.True(t, fresh.Contains(k), "the good entry replays once the bad one is gone")
		})
	}
}

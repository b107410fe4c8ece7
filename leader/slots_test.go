package leader_test

import (
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestNewEpochStartsWithFreshSlots: a leader's replication slots describe
// its own epoch; a store that starts a new one (a promotion, here of the
// leader's own directory at a raised epoch) starts with exactly its
// registered followers' slots at its log's start, none dropped — not the
// old epoch's positions and drops.
func TestNewEpochStartsWithFreshSlots(t *testing.T) {
	dir := t.TempDir()
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	o := &leader.Options{Shards: 1, Followers: []string{"f1", "f2"}, SegmentSize: 4 << 10, MaxRetainedBytes: 8 << 10,
		RetentionInterval: time.Hour, Logger: discard(), Listener: func(uint32) replication.Listener { return tr }}
	l := open(t, dir, o)
	id := session.NewID()
	for range 300 {
		_, err := l.Append(wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("n"), Delta: 1})
		require.NoError(t, err)
	}
	require.NoError(t, l.Retain())
	st := l.Stats()[0]
	require.Greater(t, st.Retention.FirstLSN, uint64(1))
	for _, sl := range st.Retention.Slots {
		require.True(t, sl.Dropped, "slot %+v", sl)
	}
	require.NoError(t, l.Close())

	o.Epoch = 2
	l = open(t, dir, o)
	defer l.Close()
	st = l.Stats()[0]
	start := st.Retention.FirstLSN - 1
	require.Equal(t, []leader.SlotStats{{ID: "f1", Acked: start}, {ID: "f2", Acked: start}}, st.Retention.Slots)
}

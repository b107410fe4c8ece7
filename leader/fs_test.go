package leader_test

import (
	"math/rand/v2"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/sim"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestLeaderOnCrashableFS: with Options.FS the whole leader — stores, WAL,
// lock — lives on that filesystem, so a power failure can be simulated: a
// leader reopened on the crash image continues every session after the last
// acknowledged append (its store re-applies what its unsynced writes lost).
func TestLeaderOnCrashableFS(t *testing.T) {
	mem := vfs.NewCrashableMem()
	o := &leader.Options{Shards: 2, FS: mem, Logger: discard(), Store: store.Options{Logger: discard()}}
	l, err := leader.Open("/node", o)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(9, 9))
	ids := []session.ID{testutil.SessionID(rng), testutil.SessionID(rng), testutil.SessionID(rng), testutil.SessionID(rng)}
	oracle := sim.NewOracle()
	for i := range 40 {
		ev := wal.Event{Op: wal.OpAdd, Session: ids[i%len(ids)], Key: []byte("n"), Delta: int64(i)}
		_, err := l.Append(ev)
		require.NoError(t, err)
		oracle.Apply(&ev)
	}
	names, err := mem.List("/node/wal")
	require.NoError(t, err)
	require.NotEmpty(t, names, "the WAL is on the given filesystem")

	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	require.NoError(t, l.Close()) // writes after the clone are lost with the old filesystem
	o.FS = crashed
	l, err = leader.Open("/node", o)
	require.NoError(t, err)
	defer l.Close()
	for _, id := range ids {
		ev := wal.Event{Op: wal.OpAdd, Session: id, Key: []byte("n"), Delta: 1}
		_, err := l.Append(ev)
		require.NoError(t, err)
		oracle.Apply(&ev)
	}
	for s := range uint32(2) {
		sh, err := l.Shard(s)
		require.NoError(t, err)
		require.NoError(t, oracle.VerifyOnly(sh.Store().State(), func(id session.ID) bool { return l.Router().Shard(id) == s }))
	}
	total := 0
	for s := range uint32(2) {
		batches, err := sim.ReadLog(crashed, "/node/wal", s)
		require.NoError(t, err)
		next := map[session.ID]session.SeqNo{}
		for _, evs := range batches {
			for _, ev := range evs {
				next[ev.Session]++
				require.Equal(t, next[ev.Session], ev.Seq, "SeqNos continue across the power failure")
				total++
			}
		}
	}
	require.Equal(t, 44, total)
}

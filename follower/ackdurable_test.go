package follower_test

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestAckedPositionSurvivesPowerFailure: the position an ack reports
// survives a power failure that keeps nothing unsynced, also when the
// acknowledged batch only advanced the position (every event a duplicate:
// a client's retry the new leader logged again after a failover). The
// leader's replication slot rises to that ack and retention deletes the
// WAL below it: a follower that came back below its slot would need a
// segment that is gone (found by the multi-follower simulation: "refused
// unexpectedly … checking the hello against the log at LSN 13: … file
// does not exist").
func TestAckedPositionSurvivesPowerFailure(t *testing.T) {
	id := session.ID{7}
	open := []wal.Event{{Op: wal.OpOpen, Session: id, Seq: 1, Time: 1}}
	first, err := wal.AppendBatch(nil, 0, 1, 1, open)
	require.NoError(t, err)
	// The same event at LSN 2, as a new leader logs a client's retry: the
	// follower discards it (its session's HWM has it) and only its position
	// moves.
	retry, err := wal.AppendBatch(nil, 0, 1, 2, open)
	require.NoError(t, err)

	mem := vfs.NewCrashableMem()
	f, err := follower.Open("/store", testOptions(mem))
	require.NoError(t, err)
	_, err = f.Apply(first)
	require.NoError(t, err)
	res, err := f.Apply(retry)
	require.NoError(t, err)
	require.Equal(t, 0, res.Applied)
	require.Equal(t, uint64(2), res.Ack.AppliedLSN)

	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	require.NoError(t, drill.Kill(f))
	f, err = follower.Open("/store", testOptions(crashed))
	require.NoError(t, err)
	defer f.Close()
	lsn, _ := f.Position()
	require.Equal(t, res.Ack.AppliedLSN, lsn, "the store came back below the position it acknowledged")
}

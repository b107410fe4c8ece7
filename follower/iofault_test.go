package follower_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/sim"
	"github.com/stretchr/testify/require"
)

// TestIOErrors injects write and sync failures into the follower's Pebble WAL
// with vfs/errorfs. Pebble v2 declares such a commit fatal (Logger.Fatalf);
// the follower must surface store.ErrFailed instead of exiting,
// refuse everything after it, and — once reopened with the fault cleared —
// finish delivery with the exactly-once invariant intact.
func TestIOErrors(t *testing.T) {
	w := recordLog(t, sim.WorkloadOptions{Seed: 3, Sessions: 5, Requests: 300, RetryRate: 0.1, BatchSize: 10}, 1, &hostile)
	log := encodeLog(t, w, 0, 1)
	// Pebble's WAL is written with Write and made durable with SyncData.
	kinds := map[string]errorfs.OpKind{"write": errorfs.OpFileWrite, "syncdata": errorfs.OpFileSyncData}
	for name, kind := range kinds {
		for _, failAt := range []int{1, len(log) / 3, len(log) - 1} {
			t.Run(fmt.Sprintf("%s/at-%d", name, failAt), func(t *testing.T) {
				mem := vfs.NewCrashableMem()
				var on atomic.Bool
				inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
					if on.Load() && op.Kind == kind && strings.HasSuffix(op.Path, ".log") {
						return errorfs.ErrInjected
					}
					return nil
				})
				f, err := follower.Open("/follower", testOptions(errorfs.Wrap(mem, inj)))
				require.NoError(t, err)
				for _, raw := range log[:failAt] {
					_, err := f.Apply(raw)
					require.NoError(t, err)
				}
				on.Store(true)
				var failed bool
				for _, raw := range log[failAt:] {
					res, err := f.Apply(raw)
					if err != nil {
						require.ErrorIs(t, err, store.ErrFailed)
						require.True(t, res.Ack.Refused)
						failed = true
						break
					}
				}
				require.True(t, failed, "an injected %v error never surfaced", name)
				// Poisoned: nothing more is applied, not even after the fault clears.
				on.Store(false)
				_, err = f.Apply(log[len(log)-1])
				require.ErrorIs(t, err, store.ErrFailed)
				_ = f.Close() // may report the failure again

				// The process restarts; its disk holds what was synced.
				f, err = follower.Open("/follower", testOptions(mem.CrashClone(vfs.CrashCloneCfg{})))
				require.NoError(t, err)
				for _, raw := range log {
					_, err := f.Apply(raw)
					require.NoError(t, err)
				}
				require.NoError(t, w.Oracle.Verify(f.State()))
				require.NoError(t, f.Close())
			})
		}
	}
}

package leader

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/wal"
)

// PromoteOptions configures Promote.
type PromoteOptions struct {
	// WALDir is where the new leader writes its log. Required. It must be
	// empty or hold this store's own leader log (a leader restarting).
	WALDir string
	// Epoch is the new leader epoch; it must exceed every epoch ever handed
	// to a leader of this shard, which only whoever decides the failover can
	// know. Default: the highest epoch this store has committed + 1 (1 for a
	// fresh store) — enough only if this follower has applied a batch of the
	// current leader (a follower that received nothing has never seen its
	// epoch). A leader restarting on its own store passes its current epoch.
	// At most replication.MaxEpoch (replication.ErrEpochExhausted).
	Epoch uint64
	// Ledger configures the request ledger (TTL, Lease, FailureTTL).
	Ledger idempotency.LedgerOptions
	// Wall is the wall clock (unix nanos). Default time.Now. The WAL clock
	// never goes below the largest time already applied.
	Wall func() int64
	// SegmentSize is the new log's segment size (wal default when 0).
	SegmentSize int64
	// WALFS is the filesystem of the WAL (replication.LedgerLogOptions.FS).
	// Default vfs.Default, whatever the store's Options.FS.
	WALFS vfs.FS
	// OnAppend is replication.LedgerLogOptions.OnAppend.
	OnAppend func(h wal.Header, raw []byte)
}

// Promote turns the follower into the leader of its shard: it stops
// applying shipped batches (Serve returns, Apply answers ErrFollowerClosed),
// persists the new epoch — from then on this store refuses batches of the
// old leader (replication.ErrStaleEpoch) — and returns a LedgerLog whose log
// continues at the applied LSN + 1 and whose Ledger answers from the
// replicated ledger table: requests the old leader completed replay, claims
// it left in flight free themselves when their leases end on the WAL clock.
//
// Only the most advanced follower may be promoted: another follower that
// applied more of the old leader's log holds entries the new log rewrites.
// Such a follower is refused, not silently patched — by its receiver
// (replication.ErrDiverged) and by a Shipper given the new epoch's start
// (ShipperOptions.EpochStartLSN = LedgerLog.EpochStartLSN()) — and must be
// rebuilt. The same holds for the deposed leader's own store.
//
// A fresh, empty follower promoted with epoch 1 is how a first leader
// starts. Close the LedgerLog before the Follower (the store is the
// Follower's).
func Promote(f *follower.Follower, opts PromoteOptions) (*LedgerLog, error) {
	// Stop Serve and Apply for good: this store now follows its own log.
	parts, err := f.Retire()
	if err != nil {
		return nil, err
	}
	fo := parts.Options
	epoch := opts.Epoch
	if epoch == 0 {
		_, stored := f.Position()
		if epoch, err = replication.NextEpoch(stored, "store "+parts.Dir); err != nil {
			return nil, fmt.Errorf("leader: promote: %w", err)
		}
	}
	l, err := OpenLedgerLog(&LedgerLogOptions{
		WALDir:      opts.WALDir,
		Shard:       fo.Shard,
		Epoch:       epoch,
		DB:          f.DB(),
		Tracker:     f.Tracker(),
		Window:      parts.Window,
		Table:       f.LedgerTable(),
		Applier:     fo.Applier,
		State:       f.State(),
		Ledger:      opts.Ledger,
		Wall:        opts.Wall,
		SegmentSize: opts.SegmentSize,
		Logger:      fo.Logger,
		OnAppend:    opts.OnAppend,
		FS:          opts.WALFS,
		// The WAL's disk keeps the store's minimum (usually the same disk).
		MinFreeBytes: fo.MinFreeBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("leader: promote: %w", err)
	}
	if fo.LeaderStore {
		return l, nil
	}
	lsn, _ := l.Position()
	fo.Logger.Info("oncewal follower promoted to leader", "dir", parts.Dir, "shard", fo.Shard, "epoch", epoch,
		"applied_lsn", lsn, "wal", opts.WALDir)
	return l, nil
}

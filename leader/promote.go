package leader

import (
	"errors"
	"fmt"

	"github.com/oncewal/oncewal/internal/badopts"
	"github.com/oncewal/oncewal/internal/rawdb"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
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
	// WALFS is the filesystem of the WAL (LedgerLogOptions.FS).
	// Default vfs.Default, whatever the store's Options.FS.
	WALFS vfs.FS
	// OnAppend is LedgerLogOptions.OnAppend.
	OnAppend func(h wal.Header, raw []byte)
}

// EnsureDefaults fills unset fields with their documented defaults (the
// Epoch's comes from the store: Promote sets it).
func (o *PromoteOptions) EnsureDefaults() *PromoteOptions {
	ensureShared(&o.Wall, nil, &o.WALFS)
	return o
}

// Validate reports every missing or invalid field in one error wrapping
// ErrBadOptions.
func (o *PromoteOptions) Validate() error {
	var errs []error
	if o.WALDir == "" {
		errs = append(errs, errors.New("WALDir is required"))
	}
	if o.SegmentSize < 0 {
		errs = append(errs, fmt.Errorf("SegmentSize %d is negative", o.SegmentSize))
	}
	if err := replication.CheckEpoch("Epoch", o.Epoch); err != nil {
		errs = append(errs, err)
	}
	if err := o.Ledger.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Ledger: %w", err))
	}
	return badopts.Wrap(ErrBadOptions, "PromoteOptions", errs)
}

// Promote opens a leader's log on st, the store of its shard: it persists
// the new epoch — from then on this store refuses batches of the old leader
// (replication.ErrStaleEpoch) — and returns a LedgerLog whose log continues
// at the applied LSN + 1 and whose Ledger answers from the replicated ledger
// table: requests the old leader completed replay, claims it left in flight
// free themselves when their leases end on the WAL clock. A follower's store
// is handed over with follower.Follower.Retire first: nothing else may apply
// to st while the log is open.
//
// Only the most advanced follower may be promoted: another follower that
// applied more of the old leader's log holds entries the new log rewrites.
// Such a follower is refused, not silently patched — by its receiver
// (replication.ErrDiverged) and by a Shipper given the new epoch's start
// (ShipperOptions.EpochStartLSN = LedgerLog.EpochStartLSN()) — and must be
// rebuilt. The same holds for the deposed leader's own store.
//
// A fresh, empty store promoted with epoch 1 is how a first leader starts.
// Close the LedgerLog before the store.
func Promote(st *store.Store, opts PromoteOptions) (*LedgerLog, error) {
	if err := opts.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	if err := st.Err(); err != nil {
		return nil, fmt.Errorf("leader: cannot promote a failed store: %w", err)
	}
	fo := st.Options()
	epoch := opts.Epoch
	if epoch == 0 {
		_, stored := st.Position()
		var err error
		if epoch, err = PromotionEpoch(0, "", stored, "store "+st.Dir()); err != nil {
			return nil, fmt.Errorf("leader: promote: %w", err)
		}
	}
	l, err := OpenLedgerLog(&LedgerLogOptions{
		WALDir:      opts.WALDir,
		Shard:       fo.Shard,
		Epoch:       epoch,
		DB:          rawdb.Of(st),
		KV:          st.KVReader(),
		Tracker:     st.Tracker(),
		Window:      st.Window(),
		Table:       st.LedgerTable(),
		Applier:     fo.Applier,
		State:       st.State(),
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
	return l, nil
}

package store

import (
	"context"
	"io"

	"github.com/cockroachdb/pebble/v2"

	"github.com/oncewal/oncewal/internal/rawdb"
	"github.com/oncewal/oncewal/snapshot"
)

// View reads a store's committed state — an embedder's own Applier rows, say
// — and cannot write: writing outside an Applier would void every guarantee
// (the HWMs, window and position commit in the Applier's batch), so the
// writable Pebble handle stays inside the module. A View is a pebble.Reader.
type View struct {
	r    pebble.Reader
	db   *pebble.DB
	snap *pebble.Snapshot
}

// View returns a live view of the store: each read sees what is committed
// at that moment. Its Close is a no-op (the store's Close closes Pebble).
func (s *Store) View() *View { return &View{r: s.db, db: s.db} }

// Snapshot returns a point-in-time view: every read sees the store as it was
// at the call. Close it to release what it pins.
func (s *Store) Snapshot() *View {
	snap := s.db.NewSnapshot()
	return &View{r: snap, db: s.db, snap: snap}
}

// Get returns the value of key, or pebble.ErrNotFound; close the closer once
// done with the value.
func (v *View) Get(key []byte) ([]byte, io.Closer, error) { return v.r.Get(key) }

// NewIter returns an iterator over the view (pebble.Reader.NewIter).
func (v *View) NewIter(o *pebble.IterOptions) (*pebble.Iterator, error) { return v.r.NewIter(o) }

// NewIterWithContext is NewIter with a context for tracing.
func (v *View) NewIterWithContext(ctx context.Context, o *pebble.IterOptions) (*pebble.Iterator, error) {
	return v.r.NewIterWithContext(ctx, o)
}

// Metrics are Pebble's figures for the whole store (read-only).
func (v *View) Metrics() *pebble.Metrics { return v.db.Metrics() }

// Close releases a Snapshot's view; on a live view it does nothing (it must
// not close the store under its owner).
func (v *View) Close() error {
	if v.snap == nil {
		return nil
	}
	return v.snap.Close()
}

func init() {
	rawdb.Register(func(x any) (*pebble.DB, bool) {
		if s, ok := x.(*Store); ok {
			return s.db, true
		}
		return nil, false
	})
}

// Donor returns a snapshot donor of this store, so that another replica's
// store can be rebuilt from it (follower.Rebuild, follower.Options
// RebuildFrom): a follower's store donates as a leader's does
// (leader.Leader.Donor). opts.Describe defaults to Describe; the rest are
// snapshot.DonorOptions' defaults. Close the Donor before the store.
func (s *Store) Donor(opts *snapshot.DonorOptions) (*snapshot.Donor, error) {
	var o snapshot.DonorOptions
	if opts != nil {
		o = *opts
	}
	if o.Describe == nil {
		o.Describe = Describe
	}
	return snapshot.NewDonor(s.db, &o)
}

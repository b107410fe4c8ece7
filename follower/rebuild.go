package follower

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/internal/ctxtime"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/snapshot"
)

// RebuildMode is Options.Rebuild.
type RebuildMode uint8

const (
	// RebuildAuto, the default (the zero value, as the CLI's
	// --rebuild=auto), rebuilds the store from Options.RebuildFrom; with no
	// RebuildFrom no rebuild is possible and the refusal stands (see
	// Options.Rebuild).
	RebuildAuto RebuildMode = iota
	// RebuildNever leaves a refusal only a rebuild fixes standing.
	RebuildNever
)

// rebuilds reports whether a refusal only a rebuild fixes, or a damaged
// store, is rebuilt: Rebuild is auto and there is a donor to rebuild from.
func (o *Options) rebuilds() bool { return o.Rebuild == RebuildAuto && o.RebuildFrom != nil }

// noRebuild says why a store that only a rebuild fixes is left as it is,
// and what to do, for the log line that reports it.
func (o *Options) noRebuild() string {
	if o.Rebuild == RebuildAuto {
		return "no rebuild is possible: Rebuild is auto but Options.RebuildFrom is nil " +
			"(give the follower a donor: the leader's snapshot.Donor, or grpctransport.NewSnapshotClient of its address; " +
			"oncewal follower --rebuild=auto does)"
	}
	return "Rebuild is never (Options.Rebuild, oncewal follower --rebuild)"
}

func (m RebuildMode) String() string {
	switch m {
	case RebuildNever:
		return "never"
	case RebuildAuto:
		return "auto"
	}
	return fmt.Sprintf("RebuildMode(%d)", uint8(m))
}

// ErrBadRebuildMode: ParseRebuildMode was given neither "auto" nor "never".
var ErrBadRebuildMode = errors.New("follower: rebuild mode is neither auto nor never")

// ParseRebuildMode parses "auto" or "never".
func ParseRebuildMode(s string) (RebuildMode, error) {
	switch s {
	case "auto":
		return RebuildAuto, nil
	case "never":
		return RebuildNever, nil
	}
	return 0, fmt.Errorf("%w: %q", ErrBadRebuildMode, s)
}

// NeedsRebuild reports whether err is a refusal only a rebuild fixes: the
// follower diverged from the leader's history, or needs LSNs the leader's
// log no longer holds.
func NeedsRebuild(err error) bool {
	return errors.Is(err, replication.ErrDiverged) || errors.Is(err, replication.ErrBehindRetention)
}

// Rebuild replaces the store in dir — closed, or absent — with a snapshot
// of opts.Shard from src: snapshot.Fetch, then the staged store loses the
// donor's leader-only rows (keyspace.LeaderOnly: a leader donor's
// replication slots, which would pin or release the wrong WAL if this store
// were promoted) and takes the store's promise to a fencing leader, if
// higher than the donor's (store.PrepareRebuilt), then snapshot.Install.
// The snapshot must have the store's identity (opts' shard and
// decision-changing options), an epoch at
// least the store's, and — when the store is not diverged (reason is not
// replication.ErrDiverged) — an applied LSN at least the store's: a donor
// behind the store would move it backwards. Anything refused leaves the
// store as it was. It fetches as holder opts.ID/shard-NNNN
// (snapshot.Options.Holder, unless opts.Snapshot sets one), so a rebuild
// that is retried — its Begin answer lost, its process killed — releases
// its earlier snapshot on the donor at once.
func Rebuild(ctx context.Context, dir string, opts *Options, src snapshot.Source, reason error) (snapshot.Manifest, snapshot.Stats, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	want := snapshot.Want{Shard: o.Store.Shard, Identity: store.IdentityString(&o.Store), Describe: store.Describe}
	if err := snapshot.Recover(o.Store.FS, dir); err != nil {
		return snapshot.Manifest{}, snapshot.Stats{}, err
	}
	var promise uint64
	if layout, _, err := store.DirLayout(o.Store.FS, dir); err == nil && layout == store.LayoutStore {
		if cut, err := store.Describe(o.Store.FS, dir); err == nil {
			want.MinEpoch = cut.Epoch
			if !errors.Is(reason, replication.ErrDiverged) {
				want.MinLSN = cut.AppliedLSN
			}
		}
		// A store too damaged to read (ErrCorrupt, which a rebuild is
		// for) keeps no promise: its node must be asked again.
		if info, err := store.PeekStore(o.Store.FS, dir); err == nil {
			promise = info.Promise
		}
	}
	so := o.Snapshot
	if so.Holder == "" && o.Store.ID != "" {
		// Stable across restarts: a rebuild killed mid-transfer releases
		// its snapshot (and the donor's log pin) at its next Begin.
		so.Holder = o.Store.ID + "/" + filepath.Base(store.ShardDir("", o.Store.Shard))
	}
	m, st, err := snapshot.Fetch(ctx, src, o.Store.FS, dir, want, &so)
	if err != nil {
		return m, st, err
	}
	if err := store.PrepareRebuilt(snapshot.StagingDir(dir), &o.Store, promise); err != nil {
		// Not installed: the next Recover (every open) removes the staging.
		_ = snapshot.Recover(o.Store.FS, dir)
		return m, st, fmt.Errorf("follower: rebuild of %s: %w", dir, err)
	}
	if err := snapshot.Install(o.Store.FS, dir); err != nil {
		return m, st, err
	}
	return m, st, nil
}

// RunHooks are told what Run does. Every field may be nil.
type RunHooks struct {
	// Opened is called with each Follower Run opens (first, and after each
	// rebuild); it is closed when Serve returns.
	Opened func(*Follower)
	// Rebuilt is called after each rebuild, with the refusal that caused it.
	Rebuilt func(reason error, m snapshot.Manifest, st snapshot.Stats)
}

// Run opens the store in dir and serves d until ctx ends. When the leader
// refuses it in a way only a rebuild fixes (NeedsRebuild) and opts.Rebuild
// is RebuildAuto, Run closes the store, rebuilds it from opts.RebuildFrom
// (Rebuild) and serves on from the snapshot's LSN; a failed rebuild is
// retried after MaxReconnectBackoff, the old store kept meanwhile. A store
// that is damaged (store.ErrCorrupt: met by the open or while serving) is
// rebuilt the same way with RebuildAuto, and returned as the error
// otherwise. Other refusals are handled as Serve handles them
// (opts.StopOnPermanentRefusal). It returns nil when ctx ends.
func Run(ctx context.Context, dir string, opts *Options, d replication.Dialer, hooks *RunHooks) error {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return err
	}
	var h RunHooks
	if hooks != nil {
		h = *hooks
	}
	serveOpts := o
	serveOpts.rebuilder = o.rebuilds()
	for ctx.Err() == nil {
		f, err := OpenContext(ctx, dir, &serveOpts)
		if err != nil && ctx.Err() != nil {
			return nil // stopped while the store opened (after a rebuild, say): a stop, not a failure
		}
		if err == nil {
			if h.Opened != nil {
				h.Opened(f)
			}
			err = f.Serve(ctx, d)
			if cerr := f.Close(); err == nil {
				return cerr
			}
			if !errors.Is(err, ErrPermanentRefusal) {
				err = store.CorruptError(dir, err)
			}
		}
		damaged := errors.Is(err, store.ErrCorrupt)
		switch {
		case damaged && o.rebuilds():
			o.Store.Logger.Error("oncewal follower: the store is damaged; rebuilding it from a snapshot of the leader", "dir", dir, "err", err)
		case !errors.Is(err, ErrPermanentRefusal):
			return err
		case !NeedsRebuild(err) || !o.rebuilds():
			// Serve returns any other refusal only with
			// StopOnPermanentRefusal (it retries the rest itself).
			return err
		}
		o.Store.Logger.Warn("oncewal follower: rebuilding the store from a snapshot", "dir", dir, "shard", o.Store.Shard, "reason", err)
		m, st, rerr := Rebuild(ctx, dir, &o, o.RebuildFrom, err)
		if rerr != nil {
			if ctx.Err() != nil {
				return nil
			}
			o.Store.Logger.Error("oncewal follower: rebuild failed; the old store is kept, retrying", "dir", dir, "err", rerr)
			if err := ctxtime.Sleep(ctx, o.MaxReconnectBackoff); err != nil {
				return nil
			}
			continue
		}
		o.Store.Logger.Info("oncewal follower: store rebuilt from a snapshot", "dir", dir, "shard", o.Store.Shard,
			"applied_lsn", m.Cut.AppliedLSN, "epoch", m.Cut.Epoch, "bytes", st.Bytes, "elapsed", st.Elapsed)
		if h.Rebuilt != nil {
			h.Rebuilt(err, m, st)
		}
	}
	return nil
}

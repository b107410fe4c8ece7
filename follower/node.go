package follower

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/internal/ctxtime"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/internal/lifegate"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/snapshot"
	"github.com/oncewal/oncewal/wal"
)

// ErrBadOptions: Open or OpenNode was given unusable options or an
// unusable shard list (every problem is listed in the joined error).
// Nothing was changed on disk.
var ErrBadOptions = errors.New("follower: bad options")

// ErrNodeServing: Serve was called while another Serve of the node runs.
var ErrNodeServing = errors.New("follower: node already serving")

// NodeOptions configures a Node.
type NodeOptions struct {
	// Follower is the template for every shard's Options (Shard is set per
	// shard). Its defaults are Options' defaults; WindowCapacity bounds each
	// shard's window, so the node's total is WindowCapacity × shards.
	Follower Options
	// PerShard, if set, adjusts one shard's options after the template was
	// copied (a different FS or Applier per shard, …).
	PerShard func(shard uint32, o *Options)
	// ShardCount is the deployment's shard count (oncewal follower
	// --shards). When set, it is recorded in the node directory when the
	// directory is created (ShardCountFileName) and OpenNode refuses another
	// count (*ShardCountError) before anything is created; a directory
	// without the record takes the count of the shards it holds, once.
	// 0: not recorded or checked (a node serving a subset of the shards).
	ShardCount int
	// ReopenBackoff is the first wait before reopening a shard whose store
	// failed; it doubles up to 32× while reopening keeps failing. Default
	// DefaultReopenBackoff; negative is refused.
	ReopenBackoff time.Duration
}

// DefaultReopenBackoff is the default NodeOptions.ReopenBackoff.
const DefaultReopenBackoff = 100 * time.Millisecond

// EnsureDefaults fills zero fields with their documented defaults.
func (o *NodeOptions) EnsureDefaults() *NodeOptions {
	o.Follower.EnsureDefaults()
	if o.ReopenBackoff == 0 {
		o.ReopenBackoff = DefaultReopenBackoff
	}
	return o
}

// Validate reports every invalid field, the Follower template's included,
// in one error wrapping ErrBadOptions.
func (o *NodeOptions) Validate() error { return badOptions("NodeOptions", o.problems()) }

// problems lists every invalid field, the Follower template's included.
func (o *NodeOptions) problems() []error {
	var errs []error
	if o.ReopenBackoff < 0 {
		errs = append(errs, fmt.Errorf("ReopenBackoff %v is negative", o.ReopenBackoff))
	}
	if o.ShardCount < 0 || o.ShardCount > replication.MaxShards {
		errs = append(errs, fmt.Errorf("ShardCount %d is outside 0..%d", o.ShardCount, replication.MaxShards))
	}
	return append(errs, o.Follower.problems()...)
}

// Node is one follower process serving many shards: one Follower (store,
// HWM tracker, window, receiver) per shard in ShardDir(dir, shard). Shards
// share nothing but the process, so they apply in parallel and a shard
// whose link stalls or whose store fails does not stop the others.
type Node struct {
	dir    string
	opts   NodeOptions
	shards []*nodeShard // sorted by shard
	byID   map[uint32]*nodeShard

	wrongShard atomic.Uint64 // batches for a shard the node does not serve
	corrupt    atomic.Uint64 // batches whose header did not decode

	serving atomic.Bool
	// life orders Serve (a run) against shutdown: a Serve that starts as
	// the node closes either returns ErrClosed or is waited for,
	// never runs on closed stores.
	life *lifegate.Gate

	closeOnce sync.Once
	closeErr  error
}

// nodeShard holds one shard's current Follower. mu is held for reading by
// every use of f and for writing while f is replaced (store failure →
// reopen), so a replaced Follower is never used after its Close.
type nodeShard struct {
	shard uint32
	dir   string
	opts  Options

	mu        sync.RWMutex
	f         *Follower
	retired   store.ReceiverStats // counters of earlier incarnations
	retiredBG uint64              // their background errors
	reopens   int
	rebuilds  int
	lastErr   error
	// damagedLogged: the store's damage (store.ErrCorrupt) was logged;
	// reset when the store opens again. Used by serveShard's goroutine
	// (and OpenNode before it).
	damagedLogged bool
	// damagedStamp: storeStamp of the directory after an open failed with
	// store.ErrCorrupt, "" otherwise; without Rebuild the store is not
	// opened again while the stamp is unchanged (invariant 3). Used as
	// damagedLogged.
	damagedStamp string
}

// OpenNode opens (or creates) the store of every shard in shards under dir
// and recovers each from its own position, epoch, HWMs and window journal.
// Shards are opened in parallel; if any fails, the others are closed again —
// except a damaged store (store.ErrCorrupt): its shard starts down (Stats
// Err, logged once with the remedy) while the others serve, and Serve
// rebuilds it when Options.Rebuild is auto. Every shard damaged fails the
// open.
// It is OpenNodeContext without a deadline.
func OpenNode(dir string, shards []uint32, opts *NodeOptions) (*Node, error) {
	return OpenNodeContext(context.Background(), dir, shards, opts)
}

// OpenNodeContext is OpenNode that gives up when ctx ends (each shard's
// store opens with OpenContext). A directory holding a single store, a WAL
// or a leader's node is refused (*LayoutError) before anything is created.
func OpenNodeContext(ctx context.Context, dir string, shards []uint32, opts *NodeOptions) (*Node, error) {
	var o NodeOptions
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	var errs []error
	if len(shards) == 0 {
		errs = append(errs, errors.New("no shards"))
	}
	sorted := slices.Clone(shards)
	slices.Sort(sorted)
	if len(slices.Compact(slices.Clone(sorted))) != len(sorted) {
		errs = append(errs, fmt.Errorf("duplicate shard in %v", shards))
	}
	errs = append(errs, o.problems()...)
	if len(sorted) > 0 && o.ShardCount > 0 && int(sorted[len(sorted)-1]) >= o.ShardCount {
		errs = append(errs, fmt.Errorf("shard %d is outside the deployment's ShardCount %d", sorted[len(sorted)-1], o.ShardCount))
	}
	if err := badOptions("NodeOptions", errs); err != nil {
		return nil, err
	}
	// A single store, a WAL or a leader's directory is refused before
	// anything is created in it.
	switch layout, detail, err := store.DirLayout(o.Follower.Store.FS, dir); {
	case err != nil:
		return nil, fmt.Errorf("follower: node dir %s: %w", dir, err)
	case layout != store.LayoutEmpty && layout != store.LayoutNode:
		return nil, &store.LayoutError{Dir: dir, Found: layout, Want: store.LayoutNode, Detail: detail}
	}
	// A refused start leaves the node directory as it was: the store
	// directories this open creates are removed again if any shard fails
	// (a new store's Open removes only its own when it fails itself).
	fs := o.Follower.Store.FS
	_, statErr := fs.Stat(dir)
	newDir := errors.Is(statErr, os.ErrNotExist)
	had, err := store.NodeShards(fs, dir)
	if err != nil && !newDir {
		return nil, fmt.Errorf("follower: node dir %s: %w", dir, err)
	}
	// The shard count is checked before anything is created; a node
	// directory from before the record takes it from the shards it holds.
	record := o.ShardCount > 0
	if o.ShardCount > 0 && !newDir {
		present := 0
		if len(had) > 0 {
			present = int(had[len(had)-1]) + 1
		}
		if record, err = store.CheckShardCount(fs, dir, o.ShardCount, present); err != nil {
			return nil, err
		}
	}
	if err := wal.MkdirAllSynced(fs, dir); err != nil {
		return nil, fmt.Errorf("follower: node dir %s: %w", dir, err)
	}
	// The count is recorded before any store is created, as a leader
	// does: a crash between creating one shard's store and the next would
	// otherwise leave a directory that counts fewer shards than asked, and
	// every later open would refuse it as another deployment's.
	if record {
		if err := store.RecordShardCount(fs, dir, o.ShardCount); err != nil {
			if newDir {
				_ = fs.Remove(dir)
			}
			return nil, err
		}
	}
	n := &Node{dir: dir, opts: o, byID: make(map[uint32]*nodeShard, len(sorted))}
	for _, s := range sorted {
		so := o.Follower
		so.Store.Shard = s
		if o.PerShard != nil {
			o.PerShard(s, &so)
			so.Store.Shard = s
		}
		ns := &nodeShard{shard: s, dir: store.ShardDir(dir, s), opts: so}
		ns.opts.rebuilder = so.rebuilds()
		n.shards = append(n.shards, ns)
		n.byID[s] = ns
	}
	openErrs := make([]error, len(n.shards))
	damaged := 0
	var wg sync.WaitGroup
	for i, ns := range n.shards {
		wg.Go(func() {
			f, err := OpenContext(ctx, ns.dir, &ns.opts)
			if err != nil {
				openErrs[i] = fmt.Errorf("shard %d: %w", ns.shard, err)
				return
			}
			ns.f = f
		})
	}
	wg.Wait()
	// A damaged store keeps only its own shard down (Serve rebuilds it
	// with Rebuild auto); any other failure, or every shard damaged, fails
	// the open as before.
	for i, err := range openErrs {
		if errors.Is(err, store.ErrCorrupt) {
			damaged++
			openErrs[i] = nil
			n.shards[i].lastErr = err
			n.shards[i].damagedStamp = n.shards[i].stamp()
			n.shards[i].logDamaged(err)
		}
	}
	if damaged == len(n.shards) {
		openErrs = nil
		for _, ns := range n.shards {
			openErrs = append(openErrs, ns.lastErr)
		}
	}
	if err := errors.Join(openErrs...); err != nil {
		for _, ns := range n.shards {
			if ns.f != nil {
				if err := ns.f.Close(); err == nil && !slices.Contains(had, ns.shard) {
					_ = fs.RemoveAll(ns.dir)
				}
			}
		}
		if record {
			_ = fs.Remove(fs.PathJoin(dir, store.ShardCountFileName))
		}
		if newDir {
			_ = fs.Remove(dir) // only if nothing is left in it
		}
		return nil, err
	}
	n.life = lifegate.New()
	return n, nil
}

// Shards returns the shards the node serves, sorted.
func (n *Node) Shards() []uint32 {
	out := make([]uint32, len(n.shards))
	for i, ns := range n.shards {
		out[i] = ns.shard
	}
	return out
}

// Dir is the node directory.
func (n *Node) Dir() string { return n.dir }

func (n *Node) lookup(shard uint32) (*nodeShard, error) {
	ns := n.byID[shard]
	if ns == nil {
		return nil, fmt.Errorf("%w: node does not serve shard %d (serves %v)", replication.ErrWrongShard, shard, n.Shards())
	}
	return ns, nil
}

// Apply applies one shipped batch to the shard named in its header (see
// Follower.Apply). A batch for a shard the node does not serve is refused
// with replication.ErrWrongShard and touches no store; a batch whose header
// does not decode gets the wal error. Batches of different shards may be
// applied concurrently.
func (n *Node) Apply(batch []byte) (store.Result, error) {
	ns, ack, err := n.route(batch)
	if err != nil {
		return store.Result{Ack: ack}, err
	}
	defer ns.mu.RUnlock()
	return ns.f.Apply(batch)
}

// Start is Apply without waiting for the batch's WAL sync (see
// Follower.Start; Serve pipelines this way): wait for each shard's Pendings
// in the order Start returned them, and for all of them before Close.
func (n *Node) Start(batch []byte) *store.Pending {
	ns, ack, err := n.route(batch)
	if err != nil {
		return store.Refused(ack, err)
	}
	defer ns.mu.RUnlock()
	return ns.f.Start(batch)
}

// route finds the open shard of batch and returns it read-locked, or the
// refused ack and the error.
func (n *Node) route(batch []byte) (*nodeShard, replication.Ack, error) {
	h, err := wal.DecodeHeader(batch)
	if err != nil {
		n.corrupt.Add(1)
		return nil, replication.Ack{Refused: true}, err
	}
	ns, err := n.lookup(h.Shard)
	if err != nil {
		n.wrongShard.Add(1)
		return nil, replication.Ack{Shard: h.Shard, Refused: true}, err
	}
	ns.mu.RLock()
	if ns.f == nil {
		err := ns.err()
		ns.mu.RUnlock()
		return nil, replication.Ack{Shard: h.Shard, Refused: true}, err
	}
	return ns, replication.Ack{}, nil
}

func (ns *nodeShard) err() error {
	if ns.lastErr != nil {
		return ns.lastErr
	}
	return ErrClosed
}

// Follower calls fn with shard's current Follower, which stays valid (not
// closed or replaced) until fn returns; fn must not call back into the node. It returns replication.ErrWrongShard
// for a shard the node does not serve, and the store error while a failed
// shard is being reopened.
func (n *Node) Follower(shard uint32, fn func(*Follower) error) error {
	ns, err := n.lookup(shard)
	if err != nil {
		return err
	}
	ns.mu.RLock()
	defer ns.mu.RUnlock()
	if ns.f == nil {
		return ns.err()
	}
	return fn(ns.f)
}

// Position returns shard's applied LSN and epoch.
func (n *Node) Position(shard uint32) (appliedLSN, epoch uint64, err error) {
	err = n.Follower(shard, func(f *Follower) error {
		appliedLSN, epoch = f.Position()
		return nil
	})
	return appliedLSN, epoch, err
}

// Serve serves every shard concurrently, shard s through dial(s), until ctx
// ends or the node is closed; it returns nil then. With
// Options.StopOnPermanentRefusal, a shard the leader refuses for good stops
// alone; Serve returns, once every shard stopped, the joined
// ErrPermanentRefusal errors of those shards. A shard for which dial
// returns nil is not served (its batches can still be given to Apply). Each shard redials on its
// own (Follower.Serve). When a shard's store fails
// (store.ErrFailed) only that shard stops: the node closes its
// Follower and reopens it from disk, retrying with backoff
// (NodeOptions.ReopenBackoff) until the store opens, then resumes serving it
// from its durable position. When a shard's Applier fails
// (replication.ErrApply) the shard stops and stays down (ShardStats.Err)
// until the node is reopened with a fixed Applier; Serve returns that error,
// marked with the shard, once every shard stopped. The other shards are not
// touched.
func (n *Node) Serve(ctx context.Context, dial func(shard uint32) replication.Dialer) error {
	if n.life.Context().Err() != nil {
		return ErrClosed
	}
	if dial == nil {
		return fmt.Errorf("%w: Serve needs a dial function", ErrBadOptions)
	}
	if !n.serving.CompareAndSwap(false, true) {
		return ErrNodeServing
	}
	defer n.serving.Store(false)
	ctx, done, ok := n.life.Enter(ctx)
	if !ok {
		return ErrClosed
	}
	defer done()
	var wg sync.WaitGroup
	errs := make([]error, len(n.shards))
	for i, ns := range n.shards {
		d := dial(ns.shard)
		if d == nil {
			continue
		}
		wg.Go(func() { errs[i] = n.serveShard(ctx, ns, d) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// serveShard serves one shard until ctx ends (nil) or, with
// Options.StopOnPermanentRefusal, the leader refuses it for good (that
// error, marked with the shard). With Options.Rebuild auto, a refusal only
// a rebuild fixes (NeedsRebuild) closes the shard's store, rebuilds it from
// Options.RebuildFrom and reopens it; the other shards are not touched.
func (n *Node) serveShard(ctx context.Context, ns *nodeShard, d replication.Dialer) error {
	log := ns.opts.Store.Logger
	for ctx.Err() == nil {
		ns.mu.RLock()
		f := ns.f
		ns.mu.RUnlock()
		if f != nil {
			// Serve runs without the lock: the follower is replaced only
			// here, after Serve returned.
			err := f.Serve(ctx, d)
			if err == nil || ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return nil // stopped, or the node is closing this follower
			}
			if errors.Is(err, ErrPermanentRefusal) {
				switch {
				case NeedsRebuild(err) && ns.opts.rebuilds():
					n.rebuild(ctx, ns, err)
				default:
					// Serve returns any other refusal only with
					// StopOnPermanentRefusal (it retries the rest itself).
					return fmt.Errorf("shard %d: %w", ns.shard, err)
				}
			} else if err := store.CorruptError(ns.dir, err); errors.Is(err, store.ErrCorrupt) {
				// A damaged block met while serving (also by the Applier's
				// reads: checked before ErrApply, it is not the Applier's
				// fault): reopening would meet it again. Rebuilt (Rebuild
				// auto, in reopen) or down.
				ns.mu.Lock()
				ns.retire(err)
				ns.mu.Unlock()
				ns.logDamaged(err)
				if !ns.opts.rebuilds() {
					<-ctx.Done()
					return nil
				}
			} else if errors.Is(err, store.ErrApply) {
				// Reopening would meet the same batch with the same
				// Applier: the shard stays down until the process
				// restarts with a fixed one (Serve logged it).
				ns.mu.Lock()
				ns.retire(err)
				ns.mu.Unlock()
				return fmt.Errorf("shard %d: %w", ns.shard, err)
			} else {
				log.Error("oncewal node: shard store failed; reopening it", "shard", ns.shard, "err", err)
				ns.mu.Lock()
				ns.retire(err)
				ns.mu.Unlock()
			}
		}
		n.reopen(ctx, ns)
	}
	return nil
}

// rebuild closes ns's store and replaces it with a snapshot from
// ns.opts.RebuildFrom (Rebuild), retrying at the longest redial backoff
// until it succeeds or ctx ends; the old store stays meanwhile. A closed
// donor (snapshot.ErrClosed) is not asked again: after that backoff
// the shard goes back to its Dialer, which reaches the current leader (a
// restarted or a new one, which may no longer refuse it; if it does, the
// next rebuild asks the donor again), as Run does after a failed rebuild.
func (n *Node) rebuild(ctx context.Context, ns *nodeShard, reason error) {
	log := ns.opts.Store.Logger
	ns.mu.Lock()
	ns.retire(reason)
	ns.mu.Unlock()
	log.Warn("oncewal node: rebuilding a shard store from a snapshot", "shard", ns.shard, "reason", reason)
	for ctx.Err() == nil {
		m, st, err := Rebuild(ctx, ns.dir, &ns.opts, ns.opts.RebuildFrom, reason)
		if err == nil {
			ns.mu.Lock()
			ns.rebuilds++
			ns.mu.Unlock()
			log.Info("oncewal node: shard store rebuilt from a snapshot", "shard", ns.shard,
				"applied_lsn", m.Cut.AppliedLSN, "epoch", m.Cut.Epoch, "bytes", st.Bytes, "elapsed", st.Elapsed)
			return
		}
		closed := errors.Is(err, snapshot.ErrClosed)
		if closed {
			log.Error("oncewal node: rebuild failed: the donor is closed; the old store is kept, redialling the leader", "shard", ns.shard, "err", err)
		} else {
			log.Error("oncewal node: rebuild failed; the old store is kept, retrying", "shard", ns.shard, "err", err)
		}
		if ctxtime.Sleep(ctx, ns.opts.MaxReconnectBackoff) != nil || closed {
			return
		}
	}
}

// retire closes the current follower after a failure. Caller holds ns.mu.
func (ns *nodeShard) retire(cause error) {
	if ns.f == nil {
		return
	}
	st := ns.f.Stats()
	ns.retired = ns.retired.Add(st.Receiver)
	ns.retiredBG += st.BackgroundErrors
	_ = ns.f.Close() // returns the store failure again; the store is wedged
	ns.f = nil
	ns.lastErr = cause
}

// logDamaged logs, once per damaged spell of the shard, that its store is
// damaged (store.ErrCorrupt, whose text holds the remedy) and what the node
// does about it.
func (ns *nodeShard) logDamaged(err error) {
	if ns.damagedLogged {
		return
	}
	ns.damagedLogged = true
	does := "the shard stays down (the other shards serve) until the store is replaced: " + ns.opts.noRebuild()
	if ns.opts.rebuilds() {
		does = "the shard is rebuilt from the leader's snapshot (the other shards serve meanwhile)"
	}
	ns.opts.Store.Logger.Error("oncewal node: shard store is damaged; "+does, "shard", ns.shard, "err", err)
}

// stamp is storeStamp of ns's store directory, on the filesystem its store
// opens on (PerShard may set one of its own).
func (ns *nodeShard) stamp() string { return storeStamp(ns.opts.Store.FS, ns.dir) }

// reopen opens ns's store again, retrying with backoff until it opens or
// ctx ends. A damaged store (store.ErrCorrupt) is rebuilt with Rebuild auto;
// otherwise it is retried quietly (logged once) once its directory changed
// (invariant 3), in case the operator replaces it.
func (n *Node) reopen(ctx context.Context, ns *nodeShard) {
	backoff := n.opts.ReopenBackoff
	for ctx.Err() == nil {
		if errors.Is(ns.lastErr, store.ErrCorrupt) && ns.opts.rebuilds() {
			n.rebuild(ctx, ns, ns.lastErr)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		// Invariant 3: opening it again would only take its lock (a
		// concurrent oncewal inspect would be told it is locked, not
		// damaged) to meet the same damage.
		if ns.damagedStamp != "" && !ns.opts.rebuilds() && ns.stamp() == ns.damagedStamp {
			backoff = min(2*backoff, 32*n.opts.ReopenBackoff)
			continue
		}
		f, err := OpenContext(ctx, ns.dir, &ns.opts)
		ns.mu.Lock()
		if err == nil {
			ns.f, ns.lastErr, ns.damagedLogged, ns.damagedStamp = f, nil, false, ""
			ns.reopens++
			ns.mu.Unlock()
			return
		}
		ns.lastErr, ns.damagedStamp = err, ""
		if errors.Is(err, store.ErrCorrupt) {
			ns.damagedStamp = ns.stamp()
		}
		ns.mu.Unlock()
		if errors.Is(err, store.ErrCorrupt) {
			ns.logDamaged(err)
		} else {
			ns.opts.Store.Logger.Error("oncewal node: reopening shard store failed", "shard", ns.shard, "err", err, "retry_in", backoff)
		}
		backoff = min(2*backoff, 32*n.opts.ReopenBackoff)
	}
}

// ShardStats is one shard's part of NodeStats.
type ShardStats struct {
	Shard      uint32
	AppliedLSN uint64
	Epoch      uint64
	// Stats are the counters of the current incarnation plus every earlier
	// one (a shard reopened after a store failure keeps its history); Link,
	// Ledger and the gauges are the current incarnation's.
	Stats
	WindowBytes int64 // memory the shard's window holds (allocated up front)
	Reopens     int   // times the store was reopened after a failure
	Rebuilds    int   // times the store was rebuilt from a snapshot (Options.Rebuild)
	Err         error // non-nil while the shard is down (failed, reopening)
}

// NodeStats is a node's readable state: per shard and totals.
type NodeStats struct {
	Shards []ShardStats // sorted by shard
	// Totals over all shards. The window bound holds per shard; the node's
	// window memory is the sum.
	Total          store.ReceiverStats
	WindowLen      int
	WindowCapacity int
	WindowBytes    int64
	Down           int    // shards currently failed
	WrongShard     uint64 // batches refused: shard not served by this node
	Corrupt        uint64 // batches whose header did not decode (Node.Apply)
}

// Stats returns a snapshot of every shard and the totals.
func (n *Node) Stats() NodeStats {
	st := NodeStats{WrongShard: n.wrongShard.Load(), Corrupt: n.corrupt.Load()}
	for _, ns := range n.shards {
		ns.mu.RLock()
		ss := ShardStats{Shard: ns.shard, Reopens: ns.reopens, Rebuilds: ns.rebuilds, Err: ns.lastErr}
		ss.Receiver = ns.retired
		ss.BackgroundErrors = ns.retiredBG
		ss.WindowCapacity = ns.opts.Store.WindowCapacity
		if ns.f != nil {
			fs := ns.f.Stats()
			fs.Receiver = ss.Receiver.Add(fs.Receiver)
			fs.BackgroundErrors += ss.BackgroundErrors
			ss.Stats = fs
			ss.AppliedLSN, ss.Epoch = ns.f.Position()
		} else {
			st.Down++
		}
		ns.mu.RUnlock()
		ss.WindowBytes = WindowBytes(ss.WindowCapacity)
		st.Shards = append(st.Shards, ss)
		st.Total = st.Total.Add(ss.Receiver)
		st.WindowLen += ss.WindowLen
		st.WindowCapacity += ss.WindowCapacity
		st.WindowBytes += ss.WindowBytes
	}
	return st
}

// WindowBytes is the memory an idempotency window of the given capacity
// holds, all of it allocated when the window is created (see
// idempotency.StoreBytes); 0 for a capacity <= 0.
func WindowBytes(capacity int) int64 {
	if capacity <= 0 {
		return 0
	}
	return idempotency.StoreBytes(capacity)
}

// Close stops Serve, waits for it, and closes every shard's store (in
// parallel, each as Follower.Close). It returns the joined errors of shards
// that failed to close cleanly. Close is idempotent.
func (n *Node) Close() error { return n.shutdown(true) }

func (n *Node) shutdown(clean bool) error {
	n.closeOnce.Do(func() {
		n.life.Close()
		errs := make([]error, len(n.shards))
		var wg sync.WaitGroup
		for i, ns := range n.shards {
			wg.Go(func() {
				ns.mu.Lock()
				defer ns.mu.Unlock()
				if ns.f == nil {
					return
				}
				var err error
				if clean {
					err = ns.f.Close()
				} else {
					err = ns.f.kill()
				}
				st := ns.f.Stats()
				ns.retired = ns.retired.Add(st.Receiver)
				ns.retiredBG += st.BackgroundErrors
				ns.f = nil
				ns.lastErr = ErrClosed
				if err != nil {
					errs[i] = fmt.Errorf("shard %d: %w", ns.shard, err)
				}
			})
		}
		wg.Wait()
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

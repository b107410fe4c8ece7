package metrics

import (
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/prometheus/client_golang/prometheus"
)

// FollowerCollector exports one Follower's metrics (see the package doc).
type FollowerCollector struct {
	current  CurrentFollower
	store    *storeDescs
	link     *linkDescs
	rebuilds *prometheus.Desc
}

var _ prometheus.Collector = (*FollowerCollector)(nil)

// CurrentFollower returns the Follower a process serves one store with now,
// and how many times that store was rebuilt from a snapshot. follower.Run
// closes its Follower and opens a new one after every rebuild
// (RunHooks.Opened, RunHooks.Rebuilt): a collector or readiness check bound
// to the first would report a closed store for ever after. f is nil before
// the first open.
type CurrentFollower func() (f *follower.Follower, rebuilds int)

// NewFollowerCollector returns the Collector of f's store and link metrics,
// labelled with f's shard.
func NewFollowerCollector(f *follower.Follower) *FollowerCollector {
	return NewFollowerCollectorOf(func() (*follower.Follower, int) { return f, 0 })
}

// NewFollowerCollectorOf returns the Collector of whichever Follower current
// returns at each scrape (see CurrentFollower), with its rebuilds as
// oncewal_follower_store_rebuilds_total. The receiver's counters are those
// of the Follower open now: after a rebuild they start again from zero, as
// after a restart of the process (Prometheus's rate() takes resets).
func NewFollowerCollectorOf(current CurrentFollower) *FollowerCollector {
	return &FollowerCollector{current: current, store: newStoreDescs("oncewal_follower_"), link: newLinkDescs(),
		rebuilds: newRebuildsDesc()}
}

func newRebuildsDesc() *prometheus.Desc {
	return prometheus.NewDesc("oncewal_follower_store_rebuilds_total",
		"Times the shard's store was replaced by a snapshot of its donor (--rebuild=auto).", []string{"shard"}, nil)
}

// Describe implements prometheus.Collector.
func (c *FollowerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range append(c.store.all, c.link.all...) {
		ch <- d
	}
	ch <- c.rebuilds
}

// Collect implements prometheus.Collector.
func (c *FollowerCollector) Collect(ch chan<- prometheus.Metric) {
	f, rebuilds := c.current()
	if f == nil {
		return
	}
	st := f.Stats()
	applied, epoch := f.Position()
	shard := f.Shard()
	c.store.emit(ch, shard, applied, epoch, st.Stats, f.View())
	c.link.emit(ch, shard, st, time.Now())
	emitter(ch).counter(c.rebuilds, uint64(rebuilds), shardLabel(shard))
}

// NodeCollector exports a follower Node's metrics: every shard's store and
// link metrics, its reopens and rebuilds and whether it is down, and the
// node's own refusals.
type NodeCollector struct {
	n                                    *follower.Node
	store                                *storeDescs
	link                                 *linkDescs
	reopens, rebuilds, down, nodeRefused *prometheus.Desc
}

var _ prometheus.Collector = (*NodeCollector)(nil)

// NewNodeCollector returns the Collector of n's metrics.
func NewNodeCollector(n *follower.Node) *NodeCollector {
	return &NodeCollector{n: n, store: newStoreDescs("oncewal_follower_"), link: newLinkDescs(),
		reopens: prometheus.NewDesc("oncewal_follower_store_reopens_total",
			"Reopens of a shard's store after it failed.", []string{"shard"}, nil),
		rebuilds: newRebuildsDesc(),
		down: prometheus.NewDesc("oncewal_follower_store_down",
			"1 while the shard's store is failed (being reopened).", []string{"shard"}, nil),
		nodeRefused: prometheus.NewDesc("oncewal_follower_node_batches_refused_total",
			"Batches the node refused before any store: a shard it does not serve, or a header that did not decode.", []string{"reason"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *NodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range append(c.store.all, c.link.all...) {
		ch <- d
	}
	ch <- c.reopens
	ch <- c.rebuilds
	ch <- c.down
	ch <- c.nodeRefused
}

// Collect implements prometheus.Collector.
func (c *NodeCollector) Collect(ch chan<- prometheus.Metric) {
	e := emitter(ch)
	now := time.Now()
	st := c.n.Stats()
	for _, ss := range st.Shards {
		// The store's fsync histogram is read while the node keeps the
		// shard's Follower (it may be replaced after a failure).
		_ = c.n.Follower(ss.Shard, func(f *follower.Follower) error {
			if m, ok := fsyncHistogram(f.View(), c.store.fsync, shardLabel(ss.Shard)); ok {
				ch <- m
			}
			return nil
		})
		c.store.emit(e, ss.Shard, ss.AppliedLSN, ss.Epoch, ss.Stats.Stats, nil)
		c.link.emit(e, ss.Shard, ss.Stats, now)
		e.counter(c.reopens, uint64(ss.Reopens), shardLabel(ss.Shard))
		e.counter(c.rebuilds, uint64(ss.Rebuilds), shardLabel(ss.Shard))
		e.flag(c.down, ss.Err != nil, shardLabel(ss.Shard))
	}
	e.counter(c.nodeRefused, st.WrongShard, "wrong_shard")
	e.counter(c.nodeRefused, st.Corrupt, "corrupt")
}

package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Etcd is the Coordinator on etcd; NewEtcd makes one.
type Etcd struct {
	opts EtcdOptions
	cli  *clientv3.Client
	// ctx is the sessions' and observers' life: it ends at Close, after
	// the held sessions were closed (their revokes need it).
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	held   map[*etcdLeadership]struct{}
	// workers are the observers, watchers and lease keepers: Close waits
	// for them before closing the client they use.
	workers sync.WaitGroup
}

// NewEtcd connects to etcd. The connection is lazy: an unreachable etcd
// shows as ErrUnavailable on the first call, not here.
func NewEtcd(opts *EtcdOptions) (*Etcd, error) {
	o := *opts
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: o.Endpoints, DialTimeout: o.DialTimeout, TLS: o.TLS, Logger: slogZap(o.Logger),
		// A connection to a peer that died without closing it (a host
		// lost, a partition that outlasts TCP's retries) would hold a
		// pending campaign or watch forever: gRPC pings, sent while a call
		// is open, find it dead and the client dials again. Well above
		// etcd's --grpc-keepalive-min-time (5 s), which answers pings at
		// about that pace with GOAWAY too_many_pings; and only with an open
		// call (PermitWithoutStream unset), which etcd enforces too.
		DialKeepAliveTime:    keepAliveTime,
		DialKeepAliveTimeout: max(time.Second, o.LeaseTTL/3),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: connect to %v: %w", ErrUnavailable, o.Endpoints, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Etcd{opts: o, cli: cli, ctx: ctx, cancel: cancel, held: map[*etcdLeadership]struct{}{}}, nil
}

// keepAliveTime is how often the etcd client pings a quiet connection.
const keepAliveTime = 10 * time.Second

func (c *Etcd) electionPrefix(cluster string) string {
	return c.opts.Prefix + "/" + cluster + "/leader"
}

func (c *Etcd) dataKey(cluster, key string) string {
	return c.opts.Prefix + "/" + cluster + "/data/" + key
}

// unavailable words an etcd failure: the caller's own end stays
// recognisable as its context error.
func unavailable(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("coord: %s: %w", what, cerr)
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
}

// Campaign implements Coordinator (invariants 1–3).
func (c *Etcd) Campaign(ctx context.Context, cluster string, me Candidate) (Leadership, error) {
	if err := checkCampaign(cluster, me); err != nil {
		return nil, err
	}
	val, err := json.Marshal(me)
	if err != nil {
		return nil, fmt.Errorf("%w: candidate %+v: %w", ErrBadInput, me, err)
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	// The session lives on the coordinator's context, not the campaign's:
	// a leadership outlives the call that won it.
	// The lease is granted here, under the caller's ctx: NewSession would
	// grant it under the session's context, and wait forever for an
	// unreachable etcd.
	grant, t, err := c.grantLease(ctx)
	if err != nil {
		return nil, unavailable(ctx, "campaign "+cluster+": grant a lease", err)
	}
	s, err := concurrency.NewSession(c.cli, concurrency.WithTTL(int(grant.TTL)), concurrency.WithLease(grant.ID), concurrency.WithContext(c.ctx))
	if err != nil {
		t.end()
		_, _ = c.cli.Revoke(ctx, grant.ID)
		return nil, unavailable(ctx, "campaign "+cluster+": open a session", err)
	}
	// end stops the keeper before the lease goes, so that Deadline has
	// passed before another candidate can win.
	end := func() {
		t.end()
		_ = s.Close()
	}
	// The keeper runs from the grant on, so that the deadline at the win
	// is that of the last renewal while waiting (invariant 7). It is added
	// to the workers under mu, so that Close waits for every keeper.
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		end()
		return nil, ErrClosed
	}
	c.workers.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.workers.Done()
		c.keep(t, s, grant.TTL)
	}()
	e := concurrency.NewElection(s, c.electionPrefix(cluster))
	// Invariant 3: Campaign waits for older keys only, not for its own
	// lease; end the wait when the term ends (its lease ended, or may
	// have: invariant 7).
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-t.Done():
			cancel()
		case <-cctx.Done():
		}
	}()
	err = e.Campaign(cctx, string(val))
	cancel()
	if err != nil {
		ended := false
		select {
		case <-t.Done():
			ended = true
		default:
		}
		end()
		if ended && ctx.Err() == nil {
			return nil, fmt.Errorf("%w: the lease ended (or its deadline passed) while campaigning for %s", ErrLostLeadership, cluster)
		}
		return nil, unavailable(ctx, "campaign "+cluster, err)
	}
	l := &etcdLeadership{c: c, s: s, e: e, t: t, cluster: cluster, key: e.Key(), rev: e.Rev(),
		leader: Leader{Candidate: me, Epoch: uint64(e.Rev())}}
	if err := l.Guarded(ctx); err != nil {
		end()
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		end()
		return nil, ErrClosed
	}
	c.held[l] = struct{}{}
	c.mu.Unlock()
	c.opts.Logger.Info("coord: elected", "cluster", cluster, "id", me.ID, "addr", me.Addr, "epoch", l.leader.Epoch)
	return l, nil
}

// Observe implements Coordinator (invariant 5).
func (c *Etcd) Observe(ctx context.Context, cluster string) (<-chan Leader, error) {
	if err := checkCluster(cluster); err != nil {
		return nil, err
	}
	pfx := c.electionPrefix(cluster) + "/"
	ch := make(chan Leader)
	if err := c.startFollow(ctx, func(ctx context.Context) {
		defer close(ch)
		follow(ctx, c.cli, pfx, ch, leaderView(pfx), func(a, b Leader) bool { return a == b })
	}); err != nil {
		return nil, err
	}
	return ch, nil
}

// Watch implements Coordinator (invariant 8).
func (c *Etcd) Watch(ctx context.Context, cluster, prefix string) (<-chan map[string][]byte, error) {
	if err := checkCluster(cluster); err != nil {
		return nil, err
	}
	space := c.dataKey(cluster, "")
	ch := make(chan map[string][]byte)
	if err := c.startFollow(ctx, func(ctx context.Context) {
		defer close(ch)
		follow(ctx, c.cli, space+prefix, ch, dataView(space), equalData)
	}); err != nil {
		return nil, err
	}
	return ch, nil
}

// startFollow runs fn as a worker whose context ends with ctx or at Close.
func (c *Etcd) startFollow(ctx context.Context, fn func(context.Context)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	fctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	c.workers.Add(1)
	go func() {
		defer c.workers.Done()
		defer stop()
		defer cancel()
		fn(fctx)
	}()
	return nil
}

func (c *Etcd) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Get implements Coordinator.
func (c *Etcd) Get(ctx context.Context, cluster, key string) ([]byte, bool, error) {
	if err := checkCluster(cluster); err != nil {
		return nil, false, err
	}
	if err := checkOps([]Op{{key: key}}); err != nil {
		return nil, false, err
	}
	if c.isClosed() {
		return nil, false, ErrClosed
	}
	r, err := c.cli.Get(ctx, c.dataKey(cluster, key))
	if err != nil {
		return nil, false, unavailable(ctx, "get "+key, err)
	}
	if len(r.Kvs) == 0 {
		return nil, false, nil
	}
	return r.Kvs[0].Value, true, nil
}

// Update implements Coordinator (invariant 9): a transaction compared on
// the key's ModRevision (CreateRevision 0 when absent), whose Else reads
// the key again for the next try.
func (c *Etcd) Update(ctx context.Context, cluster, key string, fn func([]byte, bool) ([]byte, error)) error {
	if err := checkUpdate(cluster, key, fn); err != nil {
		return err
	}
	if c.isClosed() {
		return ErrClosed
	}
	k := c.dataKey(cluster, key)
	r, err := c.cli.Get(ctx, k)
	if err != nil {
		return unavailable(ctx, "update "+key, err)
	}
	kvs := r.Kvs
	for {
		var old []byte
		ok := len(kvs) > 0
		cmp := clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
		if ok {
			old = kvs[0].Value
			cmp = clientv3.Compare(clientv3.ModRevision(k), "=", kvs[0].ModRevision)
		}
		v, err := fn(old, ok)
		if err != nil {
			return fmt.Errorf("coord: update %s of %s: %w", key, cluster, err)
		}
		if v == nil && !ok {
			return nil
		}
		op := clientv3.OpPut(k, string(v))
		if v == nil {
			op = clientv3.OpDelete(k)
		}
		tr, err := c.cli.Txn(ctx).If(cmp).Then(op).Else(clientv3.OpGet(k)).Commit()
		if err != nil {
			return unavailable(ctx, "update "+key, err)
		}
		if tr.Succeeded {
			return nil
		}
		kvs = tr.Responses[0].GetResponseRange().Kvs
	}
}

// LeaseTTL implements Coordinator: EtcdOptions.LeaseTTL. etcd grants at
// least its own minimum (1.5 election timeouts: 1.5 s with its default
// 1 s), so a leadership's lease may be longer, never shorter; its
// Deadline counts the TTL etcd granted.
func (c *Etcd) LeaseTTL() time.Duration { return c.opts.LeaseTTL }

// Close implements Coordinator: held sessions are closed (their leases
// revoked) first, so that other candidates win without waiting a TTL.
func (c *Etcd) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed = true
	held := c.held
	c.held = nil
	c.mu.Unlock()
	for l := range held {
		l.t.end()
		_ = l.s.Close()
	}
	c.cancel()
	c.workers.Wait()
	return c.cli.Close()
}

// etcdLeadership is one term on etcd: the session whose lease holds the
// election key, and the key's create revision.
type etcdLeadership struct {
	c       *Etcd
	s       *concurrency.Session
	e       *concurrency.Election
	t       *term
	cluster string
	key     string
	rev     int64
	leader  Leader
}

func (l *etcdLeadership) Leader() Leader        { return l.leader }
func (l *etcdLeadership) Epoch() uint64         { return l.leader.Epoch }
func (l *etcdLeadership) Done() <-chan struct{} { return l.t.Done() }

// Deadline implements Leadership (invariant 7).
func (l *etcdLeadership) Deadline() time.Time { return l.t.Deadline() }

// Guarded implements Leadership (invariant 2).
func (l *etcdLeadership) Guarded(ctx context.Context, ops ...Op) error {
	if err := checkOps(ops); err != nil {
		return err
	}
	select {
	case <-l.t.Done():
		return l.lost("its lease ended or may have (invariant 7)")
	default:
	}
	tops := make([]clientv3.Op, len(ops))
	for i, op := range ops {
		k := l.c.dataKey(l.cluster, op.key)
		if op.delete {
			tops[i] = clientv3.OpDelete(k)
		} else {
			tops[i] = clientv3.OpPut(k, string(op.value))
		}
	}
	r, err := l.c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)).Then(tops...).Commit()
	if err != nil {
		return unavailable(ctx, "guarded write for "+l.cluster, err)
	}
	if !r.Succeeded {
		l.t.end()
		return l.lost("its election key is gone")
	}
	return nil
}

func (l *etcdLeadership) lost(why string) error {
	l.c.mu.Lock()
	closed := l.c.closed
	l.c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return fmt.Errorf("%w: %s at epoch %d: %s", ErrLostLeadership, l.cluster, l.leader.Epoch, why)
}

// Resign implements Leadership.
func (l *etcdLeadership) Resign(ctx context.Context) error {
	l.c.mu.Lock()
	delete(l.c.held, l)
	l.c.mu.Unlock()
	// The term ends (Deadline passes) before the key goes: the next
	// candidate may win as soon as it is deleted.
	l.t.end()
	err := l.e.Resign(ctx)
	// Closing the session revokes its lease, so the key goes even when the
	// delete above failed.
	_ = l.s.Close()
	if err != nil {
		return unavailable(ctx, "resign "+l.cluster, err)
	}
	return nil
}

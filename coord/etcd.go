package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// observeRetry paces an observer's reads while etcd does not answer: a
// read is cheap, and a new leader should be seen soon after etcd returns.
const observeRetry = 200 * time.Millisecond

// Etcd is the Coordinator on etcd; NewEtcd makes one.
type Etcd struct {
	opts EtcdOptions
	cli  *clientv3.Client
	// ctx is the sessions' and observers' life: it ends at Close, after
	// the held sessions were closed (their revokes need it).
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool
	held      map[*etcdLeadership]struct{}
	observers sync.WaitGroup
}

// NewEtcd connects to etcd. The connection is lazy: an unreachable etcd
// shows as ErrUnavailable on the first call, not here.
func NewEtcd(opts *EtcdOptions) (*Etcd, error) {
	o := *opts
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: o.Endpoints, DialTimeout: o.DialTimeout, TLS: o.TLS})
	if err != nil {
		return nil, fmt.Errorf("%w: connect to %v: %w", ErrUnavailable, o.Endpoints, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Etcd{opts: o, cli: cli, ctx: ctx, cancel: cancel, held: map[*etcdLeadership]struct{}{}}, nil
}

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
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	// The session lives on the coordinator's context, not the campaign's:
	// a leadership outlives the call that won it.
	// The lease is granted here, under the caller's ctx: NewSession would
	// grant it under the session's context, and wait forever for an
	// unreachable etcd.
	ttl := int(c.opts.LeaseTTL / time.Second)
	grant, err := c.cli.Grant(ctx, int64(ttl))
	if err != nil {
		return nil, unavailable(ctx, "campaign "+cluster+": grant a lease", err)
	}
	s, err := concurrency.NewSession(c.cli, concurrency.WithTTL(ttl), concurrency.WithLease(grant.ID), concurrency.WithContext(c.ctx))
	if err != nil {
		_, _ = c.cli.Revoke(ctx, grant.ID)
		return nil, unavailable(ctx, "campaign "+cluster+": open a session", err)
	}
	e := concurrency.NewElection(s, c.electionPrefix(cluster))
	// Invariant 3: Campaign waits for older keys only, not for its own
	// lease; end the wait when the session ends.
	cctx, cancel := context.WithCancel(ctx)
	stop := make(chan struct{})
	go func() {
		select {
		case <-s.Done():
			cancel()
		case <-stop:
		}
	}()
	err = e.Campaign(cctx, string(val))
	close(stop)
	cancel()
	if err != nil {
		ended := false
		select {
		case <-s.Done():
			ended = true
		default:
		}
		_ = s.Close()
		if ended && ctx.Err() == nil {
			return nil, fmt.Errorf("%w: the session's lease ended while campaigning for %s", ErrLostLeadership, cluster)
		}
		return nil, unavailable(ctx, "campaign "+cluster, err)
	}
	l := &etcdLeadership{c: c, s: s, e: e, cluster: cluster, key: e.Key(), rev: e.Rev(),
		leader: Leader{Candidate: me, Epoch: uint64(e.Rev())}}
	if err := l.Guarded(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = s.Close()
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
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	ch := make(chan Leader)
	octx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	c.observers.Add(1)
	go func() {
		defer c.observers.Done()
		defer close(ch)
		defer stop()
		defer cancel()
		c.observe(octx, c.electionPrefix(cluster)+"/", ch)
	}()
	return ch, nil
}

// observe reads the lowest-created key, reports it if it changed, and
// reads again after any event under the prefix (or a broken watch).
func (c *Etcd) observe(ctx context.Context, pfx string, ch chan<- Leader) {
	var last Leader
	sent := false
	for {
		r, err := c.cli.Get(ctx, pfx, clientv3.WithFirstCreate()...)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(observeRetry):
				continue
			}
		}
		var cur Leader
		if len(r.Kvs) > 0 {
			kv := r.Kvs[0]
			var who Candidate
			if json.Unmarshal(kv.Value, &who) != nil {
				// Not a candidate's value: still the key that leads.
				who = Candidate{ID: strings.TrimPrefix(string(kv.Key), pfx)}
			}
			cur = Leader{Candidate: who, Epoch: uint64(kv.CreateRevision)}
		}
		if !sent || cur != last {
			select {
			case ch <- cur:
				last, sent = cur, true
			case <-ctx.Done():
				return
			}
		}
		wctx, wcancel := context.WithCancel(ctx)
		wch := c.cli.Watch(wctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision+1))
		select {
		case <-wch:
		case <-ctx.Done():
		}
		wcancel()
		if ctx.Err() != nil {
			return
		}
	}
}

// Get implements Coordinator.
func (c *Etcd) Get(ctx context.Context, cluster, key string) ([]byte, bool, error) {
	if err := checkCluster(cluster); err != nil {
		return nil, false, err
	}
	if err := checkOps([]Op{{key: key}}); err != nil {
		return nil, false, err
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
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
		_ = l.s.Close()
	}
	c.cancel()
	c.observers.Wait()
	return c.cli.Close()
}

// etcdLeadership is one term on etcd: the session whose lease holds the
// election key, and the key's create revision.
type etcdLeadership struct {
	c       *Etcd
	s       *concurrency.Session
	e       *concurrency.Election
	cluster string
	key     string
	rev     int64
	leader  Leader
}

func (l *etcdLeadership) Leader() Leader        { return l.leader }
func (l *etcdLeadership) Epoch() uint64         { return l.leader.Epoch }
func (l *etcdLeadership) Done() <-chan struct{} { return l.s.Done() }

// Guarded implements Leadership (invariant 2).
func (l *etcdLeadership) Guarded(ctx context.Context, ops ...Op) error {
	if err := checkOps(ops); err != nil {
		return err
	}
	select {
	case <-l.s.Done():
		return l.lost("its session ended")
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
	err := l.e.Resign(ctx)
	// Closing the session revokes its lease, so the key goes even when the
	// delete above failed.
	_ = l.s.Close()
	if err != nil {
		return unavailable(ctx, "resign "+l.cluster, err)
	}
	return nil
}

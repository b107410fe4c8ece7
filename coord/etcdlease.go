package coord

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// deadlineMargin is what a deadline keeps back from a granted TTL for the
// two clocks that measure it running at different rates: etcd's leader
// times the lease from when it renewed it, this process from when it sent
// the renewal. A tenth of the TTL (1 s of the default 10 s) is far above
// the drift of clocks that NTP disciplines (it slews by at most 500 ppm,
// 5 ms in 10 s), and leaves a leader that stops at its deadline a margin
// for the scheduling delay of its own timer.
func deadlineMargin(ttl time.Duration) time.Duration { return ttl / 10 }

// leaseDeadline is invariant 7's bound: etcd renews a lease to its TTL at
// the latest when it answers, which is after the request was sent, and
// expires it no sooner than TTL after that.
func leaseDeadline(sent time.Time, ttlSeconds int64) time.Time {
	ttl := time.Duration(ttlSeconds) * time.Second
	return sent.Add(ttl - deadlineMargin(ttl))
}

// keep renews the session's lease every TTL/3 with its own KeepAliveOnce
// calls (whose internal retries only send later than sent), on top
// of the session's KeepAlive, because only a call of its own tells it
// when the renewal that etcd answered was sent: the client's keep-alive
// loop times its deadline from the answer's arrival (lease.go,
// recvKeepAlive), which is later than etcd's renewal, and so not a sound
// bound. A renewal only lengthens the lease, so the session's own can
// only make the real expiry later than t's deadline. It ends t when etcd
// says the lease is gone or the session ends, and returns when t ends,
// closing the session: a term that ended must not keep its key alive
// through the session's keep-alive (its deadline passed while etcd was
// slow, say), or every other candidate would wait behind a leader that
// knows it is not one. The revoke is best effort; unanswered, the lease
// expires a TTL after its last renewal.
func (c *Etcd) keep(t *term, s *concurrency.Session, ttlSeconds int64) {
	defer func() { _ = s.Close() }()
	period := time.Duration(ttlSeconds) * time.Second / 3
	wait := period
	for {
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-t.Done():
			timer.Stop()
			return
		case <-s.Done():
			timer.Stop()
			t.end()
			return
		}
		sent := time.Now()
		// An answer later than the deadline could extend nothing (the
		// term ends then), nor one later than the next renewal's time.
		ctx, cancel := context.WithDeadline(c.ctx, minTime(t.Deadline(), sent.Add(period)))
		r, err := c.cli.KeepAliveOnce(ctx, s.Lease())
		cancel()
		switch {
		case err == nil:
			t.extend(leaseDeadline(sent, r.TTL))
			wait = period - time.Since(sent)
		case r != nil && r.TTL <= 0:
			c.opts.Logger.Warn("coord: the leadership's lease is gone", "lease", int64(s.Lease()))
			t.end()
			return
		default:
			wait = retryPause
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// grantLease grants a lease of the configured TTL under ctx and starts the
// term that its renewals extend; its deadline runs from the grant's send.
func (c *Etcd) grantLease(ctx context.Context) (*clientv3.LeaseGrantResponse, *term, error) {
	sent := time.Now()
	g, err := c.cli.Grant(ctx, int64(c.opts.LeaseTTL/time.Second))
	if err != nil {
		return nil, nil, err
	}
	return g, newTerm(leaseDeadline(sent, g.TTL)), nil
}

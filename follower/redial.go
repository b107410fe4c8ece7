package follower

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/replication"
)

// redialBackoff paces Serve's redials: the un-jittered wait starts at first,
// doubles after every failed attempt up to max, and returns to first once a
// connection works. Each wait is drawn from [1−jitter, 1+jitter] times it, so
// followers that lost the same leader at the same moment do not redial it in
// step.
type redialBackoff struct {
	first, max time.Duration
	jitter     float64
	next       time.Duration
}

func newRedialBackoff(o *Options) *redialBackoff {
	b := &redialBackoff{first: o.ReconnectBackoff, max: o.MaxReconnectBackoff, jitter: max(0, o.ReconnectJitter)}
	b.reset()
	return b
}

func (b *redialBackoff) reset() { b.next = b.first }

// capped reports whether the waits have reached max.
func (b *redialBackoff) capped() bool { return b.next >= b.max }

// wait returns the next wait, jittered by r ∈ [0, 1), and doubles the one
// after it.
func (b *redialBackoff) wait(r float64) time.Duration {
	d := float64(b.next) * (1 + b.jitter*(2*r-1))
	if b.next > b.max/2 {
		b.next = b.max
	} else {
		b.next *= 2
	}
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

// linkStreak is a run of failed connection attempts — dials that failed, or
// connections that ended before they delivered a batch (a leader refusing
// the hello ends the stream at once) — logged so that a misconfiguration
// (a wrong CA, a wrong shard) says why once, loudly, instead of at every
// retry: the first failure at Warn (Error for a refusal no retry can fix),
// the first wait at the backoff cap at Error if nothing was yet, the rest at
// Debug, and the end of the streak at Info.
type linkStreak struct {
	failures int
	since    time.Time
	errored  bool
}

// permanentReasons are the failures no retry can fix — only an operator
// can (wrong shard, fenced, diverged or unknown follower, a follower behind
// the leader's retained log, a hello the leader rejects, a certificate
// either side refuses) — with the names LinkStats.Refusals and the metrics
// use, most specific first (a refusal may wrap several).
var permanentReasons = [...]struct {
	name string
	err  error
}{
	{"wrong_shard", replication.ErrWrongShard},
	{"fenced", replication.ErrFenced},
	{"stale_epoch", replication.ErrStaleEpoch},
	{"diverged", replication.ErrDiverged},
	{"behind_retention", replication.ErrBehindRetention},
	{"unknown_follower", replication.ErrUnknownFollower},
	{"bad_follower_id", replication.ErrBadFollowerID},
	{"bad_hello", replication.ErrBadHello},
	{"auth", replication.ErrAuthFailed},
}

// PermanentReasons lists the names of the permanent failures LinkStats
// counts (LinkStats.Refusals keys), in order.
func PermanentReasons() []string {
	out := make([]string, len(permanentReasons))
	for i, r := range permanentReasons {
		out[i] = r.name
	}
	return out
}

// permanentReason names err's permanent reason, or "" for a failure a retry
// may fix.
func permanentReason(err error) string {
	for _, r := range permanentReasons {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return ""
}

// permanent reports whether err is a failure no retry can fix.
func permanent(err error) bool { return permanentReason(err) != "" }

// fail records a failed attempt; capped says the wait that follows is at
// the backoff cap.
func (s *linkStreak) fail(log *slog.Logger, err error, capped bool, wait time.Duration) {
	s.failures++
	level, msg := slog.LevelDebug, "oncewal follower: cannot connect to the leader, retrying"
	switch {
	case s.failures == 1:
		s.since = time.Now()
		level = slog.LevelWarn
		if permanent(err) {
			level, s.errored = slog.LevelError, true
		}
	case !s.errored && capped:
		level, s.errored = slog.LevelError, true
		msg = "oncewal follower: still cannot connect to the leader, retrying at the longest backoff"
	}
	log.Log(context.Background(), level, msg, "err", err, "attempts", s.failures,
		"for", time.Since(s.since).Round(time.Millisecond), "next_in", wait.Round(time.Millisecond))
}

// end closes a streak when a connection works.
func (s *linkStreak) end(log *slog.Logger) {
	if s.failures > 0 {
		log.Info("oncewal follower: connected to the leader", "failed_attempts", s.failures,
			"after", time.Since(s.since).Round(time.Millisecond))
	}
	*s = linkStreak{}
}

// LinkStats describe a follower's connection to its leader (Serve).
type LinkStats struct {
	// Connected: a connection is in service (dialled, not yet dropped).
	Connected bool
	// Attempts counts connection attempts (dials).
	Attempts uint64
	// Failures counts attempts that failed: the dial, or the connection
	// before it delivered a batch (a refused hello ends it at once).
	Failures uint64
	// Permanent counts the failures no retry can fix; Refusals breaks them
	// down by reason (PermanentReasons: wrong_shard, fenced, stale_epoch,
	// diverged, behind_retention, unknown_follower, bad_follower_id,
	// bad_hello, auth — a certificate either side refused).
	Permanent uint64
	Refusals  map[string]uint64
	// LastBatch is when the last batch arrived (unix ns; 0: none yet).
	LastBatch int64
}

type linkCounters struct {
	connected          atomic.Bool
	attempts, failures atomic.Uint64
	refusals           [len(permanentReasons)]atomic.Uint64
	lastBatch          atomic.Int64
}

func (c *linkCounters) failed(err error) {
	c.failures.Add(1)
	for i := range permanentReasons {
		if errors.Is(err, permanentReasons[i].err) {
			c.refusals[i].Add(1)
			return
		}
	}
}

func (c *linkCounters) snapshot() LinkStats {
	st := LinkStats{Connected: c.connected.Load(), Attempts: c.attempts.Load(), Failures: c.failures.Load(),
		LastBatch: c.lastBatch.Load(), Refusals: make(map[string]uint64, len(permanentReasons))}
	for i, r := range permanentReasons {
		n := c.refusals[i].Load()
		st.Refusals[r.name] = n
		st.Permanent += n
	}
	return st
}

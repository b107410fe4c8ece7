package follower

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
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
// retry: a refusal at Error when its reason is new to the streak (with what
// happens next and the remedy), another first failure at Warn, the first
// wait at the backoff cap at Error if nothing was yet, the rest at Debug,
// and the end of the streak at Info.
type linkStreak struct {
	failures int
	since    time.Time
	errored  bool
	reason   string // the refusal reason last logged at Error
}

// refusalReasons are the refusals the leader (or the transport's
// authentication) gives, with the names LinkStats.Refusals and the metrics
// use, most specific first (a refusal may wrap several). Every one but
// duplicate_follower is permanent: no retry can fix it, only an operator
// can. A duplicate ID passes by itself when the other connection turns out
// dead (a restarted follower whose old connection the leader had not seen
// end), so it is retried even with StopOnPermanentRefusal. remedy is what
// the operator does, %[1]s the follower's ID.
var refusalReasons = [...]struct {
	name   string
	err    error
	retry  bool
	remedy string
}{
	{"wrong_shard", replication.ErrWrongShard, false,
		"start this follower with the shard the leader ships (oncewal follower --shard), or point --leader at that shard's leader"},
	{"fenced", replication.ErrFenced, false,
		"this leader was deposed by a newer epoch: point --leader at the current leader"},
	{"stale_epoch", replication.ErrStaleEpoch, false,
		"this leader was deposed by a newer epoch: point --leader at the current leader"},
	{"diverged", replication.ErrDiverged, false,
		"this store holds entries the leader's log does not: rebuild it (oncewal follower --rebuild auto, the default, fetches a snapshot)"},
	{"behind_retention", replication.ErrBehindRetention, false,
		"the leader no longer holds the log this store needs: rebuild it (oncewal follower --rebuild auto, the default), or keep more log on the leader (oncewal leader --max-retained-bytes)"},
	{"unknown_follower", replication.ErrUnknownFollower, false,
		"add %[1]s to the leader's --followers (oncewal leader --followers ...,%[1]s), or start this follower with a registered --id"},
	{"identity_mismatch", replication.ErrIdentityMismatch, false,
		"give this follower the certificate issued for --id %[1]s (oncewal gencerts DIR --followers ...,%[1]s writes follower-%[1]s.pem and follower-%[1]s-key.pem for --tls-cert and --tls-key), or start it with the --id its certificate names"},
	{"duplicate_follower", replication.ErrDuplicateFollower, true,
		"another process is using --id %[1]s; give each follower its own --id"},
	{"bad_follower_id", replication.ErrBadFollowerID, false,
		"give this follower an --id of 1-64 bytes of [A-Za-z0-9._-]"},
	{"bad_hello", replication.ErrBadHello, false,
		"run the same oncewal version on the leader and its followers"},
	{"auth", replication.ErrAuthFailed, false,
		"the leader and this follower must trust each other's certificates: check --tls-ca, --tls-cert and --tls-key on both sides (same CA, not expired, the leader's name in its certificate)"},
}

// PermanentReasons lists the names of the refusals LinkStats.Refusals
// counts, in order: the permanent ones, and duplicate_follower (retried;
// see refusalReasons).
func PermanentReasons() []string {
	out := make([]string, len(refusalReasons))
	for i, r := range refusalReasons {
		out[i] = r.name
	}
	return out
}

// refusalReason is the index in refusalReasons of err's reason, or -1 for
// a failure that is no refusal.
func refusalReason(err error) int {
	for i, r := range refusalReasons {
		if errors.Is(err, r.err) {
			return i
		}
	}
	return -1
}

// permanent reports whether err is a failure no retry can fix.
func permanent(err error) bool {
	i := refusalReason(err)
	return i >= 0 && !refusalReasons[i].retry
}

// remedy is what the operator does about err, "" when the failure is no
// refusal.
func remedy(err error, id string) string {
	i := refusalReason(err)
	if i < 0 {
		return ""
	}
	r := refusalReasons[i].remedy
	if !strings.Contains(r, "%[1]s") {
		return r // Sprintf would append %!(EXTRA string=id)
	}
	return fmt.Sprintf(r, id)
}

// fail records a failed attempt; capped says the wait that follows is at
// the backoff cap; next says what Serve does now (retry, stop, rebuild)
// and id is the follower's, for the remedy.
func (s *linkStreak) fail(log *slog.Logger, err error, capped bool, wait time.Duration, next, id string) {
	s.failures++
	if s.failures == 1 {
		s.since = time.Now()
	}
	attrs := []any{"err", err, "attempts", s.failures, "for", time.Since(s.since).Round(time.Millisecond), "next_in", wait.Round(time.Millisecond)}
	if i := refusalReason(err); i >= 0 {
		r := refusalReasons[i]
		if r.name == s.reason {
			log.Debug("oncewal follower: refused by the leader again", append(attrs, "reason", r.name)...)
			return
		}
		// Once per reason: the operator reads why, what happens now and
		// what to do; the retries that follow repeat nothing new.
		s.reason, s.errored = r.name, true
		log.Error("oncewal follower: the leader refused this follower; "+next, append(attrs, "reason", r.name, "remedy", remedy(err, id))...)
		return
	}
	level, msg := slog.LevelDebug, "oncewal follower: cannot connect to the leader, retrying"
	switch {
	case s.failures == 1:
		level = slog.LevelWarn
	case !s.errored && capped:
		level, s.errored = slog.LevelError, true
		msg = "oncewal follower: still cannot connect to the leader, retrying at the longest backoff"
	}
	log.Log(context.Background(), level, msg, attrs...)
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
	// Permanent counts the failures no retry can fix; Refusals breaks the
	// refusals down by reason (PermanentReasons: wrong_shard, fenced,
	// stale_epoch, diverged, behind_retention, unknown_follower,
	// identity_mismatch, duplicate_follower — retried, not counted in Permanent —,
	// bad_follower_id, bad_hello, auth — a certificate either side
	// refused).
	Permanent uint64
	Refusals  map[string]uint64
	// LastBatch is when the last batch arrived (unix ns; 0: none yet).
	LastBatch int64
	// HeartbeatInterval is the interval the leader of the connection in
	// service promised (0: not connected, or a leader that sends none).
	HeartbeatInterval time.Duration
	// LastHeard is when the leader last sent anything on the connection
	// in service, a batch or a heartbeat (unix ns; 0: not connected or
	// not known); LeaderLSN and LeaderWALTime are from its last heartbeat.
	LastHeard     int64
	LeaderLSN     uint64
	LeaderWALTime int64
	// LastError is why the last connection ended or the last attempt
	// failed ("" before the first); readiness quotes it.
	LastError string
}

type linkCounters struct {
	connected          atomic.Bool
	attempts, failures atomic.Uint64
	refusals           [len(refusalReasons)]atomic.Uint64
	lastBatch          atomic.Int64
	conn               atomic.Pointer[replication.FollowerConn] // in service
	lastErr            atomic.Pointer[string]
}

// serving records conn as the connection in service.
func (c *linkCounters) serving(conn replication.FollowerConn) {
	c.conn.Store(&conn)
	c.connected.Store(true)
}

// dropped records the end of the connection in service, and why.
func (c *linkCounters) dropped(err error) {
	c.connected.Store(false)
	c.conn.Store(nil)
	c.setErr(err)
}

func (c *linkCounters) setErr(err error) {
	if err != nil {
		msg := err.Error()
		c.lastErr.Store(&msg)
	}
}

func (c *linkCounters) failed(err error) {
	c.failures.Add(1)
	c.setErr(err)
	if i := refusalReason(err); i >= 0 {
		c.refusals[i].Add(1)
	}
}

func (c *linkCounters) snapshot() LinkStats {
	st := LinkStats{Connected: c.connected.Load(), Attempts: c.attempts.Load(), Failures: c.failures.Load(),
		LastBatch: c.lastBatch.Load(), Refusals: make(map[string]uint64, len(refusalReasons))}
	for i, r := range refusalReasons {
		n := c.refusals[i].Load()
		st.Refusals[r.name] = n
		if !r.retry {
			st.Permanent += n
		}
	}
	if p := c.lastErr.Load(); p != nil {
		st.LastError = *p
	}
	if p := c.conn.Load(); p != nil && st.Connected {
		if lc, ok := (*p).(replication.LivenessConn); ok && lc.HeartbeatInterval() > 0 {
			heard, hb := lc.LastHeard()
			st.HeartbeatInterval, st.LastHeard = lc.HeartbeatInterval(), heard.UnixNano()
			st.LeaderLSN, st.LeaderWALTime = hb.LastLSN, hb.WALTime
		}
	}
	return st
}

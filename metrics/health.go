package metrics

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /metrics from g (the Prometheus text format), /healthz
// (200 "ok": the process is alive and serving) and /readyz (200 "ready"
// when ready returns nil, else 503 and the error; nil ready: always ready).
func Handler(g prometheus.Gatherer, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, notReadyBody(err))
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// notReadyBody is the /readyz answer for err: "not ready: " once, then the
// reasons. A check that wrapped ErrNotReady with fmt.Errorf("%w: …") led
// its text with "not ready" itself; it is said once, not twice.
func notReadyBody(err error) string {
	return "not ready: " + strings.TrimPrefix(err.Error(), ErrNotReady.Error()+": ")
}

// ErrNotReady wraps every readiness failure.
var ErrNotReady = errors.New("not ready")

// NotReady returns an error wrapping ErrNotReady (and whatever format
// wraps with %w) whose text is the reason alone: the /readyz handler puts
// "not ready: " before it, once.
func NotReady(format string, args ...any) error {
	return notReady{fmt.Errorf(format, args...)}
}

type notReady struct{ err error }

func (e notReady) Error() string   { return e.err.Error() }
func (e notReady) Unwrap() []error { return []error{ErrNotReady, e.err} }

// shardReady is the readiness of one follower shard: its store open, a
// connection to the leader in service, and its WAL-clock lag
// (follower.Stats.WALLag) at most maxLag (maxLag <= 0: not checked).
func shardReady(shard uint32, st follower.Stats, down error, maxLag time.Duration, now time.Time) error {
	switch {
	case down != nil:
		return NotReady("shard %d: store down: %w", shard, down)
	case !st.Link.Connected && st.Link.LastError != "":
		return NotReady("shard %d: not connected to the leader: %s", shard, st.Link.LastError)
	case !st.Link.Connected:
		return NotReady("shard %d: not connected to the leader", shard)
	case st.DiskFull:
		return NotReady("shard %d: the disk is nearly full; not applying", shard)
	case st.WriteStalled && st.BackgroundErrors > 0:
		return NotReady("shard %d: store writes stalled, Pebble's background work failing (disk full?)", shard)
	}
	if lag := st.WALLag(now, LagIdle); maxLag > 0 && lag > maxLag {
		return NotReady("shard %d: %v behind the leader (more than %v)", shard, lag.Round(time.Millisecond), maxLag)
	}
	return nil
}

// FollowerReady is the readiness check of a single-shard follower (see
// NodeReady).
func FollowerReady(f *follower.Follower, maxLag time.Duration) func() error {
	return FollowerReadyOf(func() (*follower.Follower, int) { return f, 0 }, maxLag)
}

// FollowerReadyOf is FollowerReady of whichever Follower current returns
// (see CurrentFollower): not ready before the first open.
func FollowerReadyOf(current CurrentFollower, maxLag time.Duration) func() error {
	return func() error {
		f, _ := current()
		if f == nil {
			return NotReady("the store is not open")
		}
		return shardReady(f.Shard(), f.Stats(), nil, maxLag, time.Now())
	}
}

// NodeReady is the readiness check of a follower node: every shard's store
// is open, connected to its leader, and at most maxLag behind it on the
// WAL clock (follower.Stats.WALLag; maxLag <= 0 skips the lag check).
func NodeReady(n *follower.Node, maxLag time.Duration) func() error {
	return func() error {
		now := time.Now()
		var why []string
		var errs []any
		for _, ss := range n.Stats().Shards {
			if err := shardReady(ss.Shard, ss.Stats, ss.Err, maxLag, now); err != nil {
				why = append(why, "%w")
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			return nil
		}
		// One line for /readyz: "not ready: shard 0: …; shard 2: …".
		return NotReady(strings.Join(why, "; "), errs...)
	}
}

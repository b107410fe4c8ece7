package follower_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/metrics"
	"github.com/oncewal/oncewal/replication"
	"github.com/stretchr/testify/require"
)

// scriptDialer answers the n-th Dial (from 1) with script(n): an error, a
// connection that ends before delivering anything (what a leader refusing
// the hello looks like), or one that delivers a batch and then stays up.
type scriptDialer struct {
	script func(n int) (refused bool, err error)
	mu     sync.Mutex
	dials  []time.Time
}

func (d *scriptDialer) Dial(ctx context.Context, _ replication.Ack) (replication.FollowerConn, error) {
	d.mu.Lock()
	d.dials = append(d.dials, time.Now())
	n := len(d.dials)
	d.mu.Unlock()
	refused, err := d.script(n)
	if err != nil {
		return nil, err
	}
	return &scriptConn{refused: refused}, nil
}

func (d *scriptDialer) times() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.dials...)
}

type scriptConn struct {
	refused bool
	sent    bool
}

func (c *scriptConn) Recv(ctx context.Context) ([]byte, error) {
	if c.refused {
		return nil, fmt.Errorf("%w: leader ended the stream", replication.ErrDisconnected)
	}
	if !c.sent {
		c.sent = true
		return []byte("not a batch"), nil // any delivery shows the link works
	}
	<-ctx.Done()
	return nil, ctx.Err()
}
func (c *scriptConn) Send(context.Context, replication.Ack) error { return nil }
func (c *scriptConn) Close() error                                { return nil }

// logRecords is a slog.Handler keeping every record.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *logRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecords) WithGroup(string) slog.Handler      { return h }

// link returns the records of the redial loop, as "LEVEL message".
func (h *logRecords) link() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if isLinkLine(r.Message) {
			out = append(out, r.Level.String()+" "+r.Message)
		}
	}
	return out
}

func serveUntil(t *testing.T, o *follower.Options, d *scriptDialer, done func(dials int) bool) {
	t.Helper()
	f, err := follower.Open("f", o)
	require.NoError(t, err)
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- f.Serve(ctx, d) }()
	for !done(len(d.times())) {
		require.NoError(t, ctx.Err(), "dials so far: %d", len(d.times()))
		time.Sleep(time.Millisecond)
	}
	cancel()
	require.NoError(t, <-served)
}

// TestServeBacksOffRefusals: a leader that accepts the connection and then
// refuses the hello made the follower redial at its first backoff forever
// (38 times in 4 s) because a successful Dial reset the backoff. Attempts
// that deliver nothing now keep backing off up to the cap; the streak is
// logged once at Warn, once at Error when it reaches the cap, and at Info
// when a connection works again.
func TestServeBacksOffRefusals(t *testing.T) {
	badCA := fmt.Errorf("%w: dial: tls: failed to verify certificate: x509: certificate signed by unknown authority", replication.ErrDisconnected)
	t.Run("refused after accept", func(t *testing.T) {
		testBackoff(t, func(n int) (bool, error) { return true, nil })
	})
	t.Run("dial error", func(t *testing.T) {
		testBackoff(t, func(n int) (bool, error) { return false, badCA })
	})
}

func testBackoff(t *testing.T, failure func(n int) (bool, error)) {
	const failures = 8
	ms := time.Millisecond
	logs := &logRecords{}
	o := &follower.Options{Store: store.Options{FS: vfs.NewMem(), Logger: slog.New(logs), PebbleOptions: smallMemtable}, ReconnectBackoff: 5 * ms, MaxReconnectBackoff: 40 * ms, ReconnectJitter: -1}
	d := &scriptDialer{script: func(n int) (bool, error) {
		if n <= failures {
			return failure(n)
		}
		return false, nil
	}}
	serveUntil(t, o, d, func(n int) bool {
		return n > failures && len(logs.link()) > 0 && strings.HasPrefix(logs.link()[len(logs.link())-1], "INFO")
	})

	// Waits of 5, 10, 20, 40, 40, 40, 40, 40 ms: the 9th dial comes no
	// sooner than 235 ms after the first (it was 40 ms, 8 × 5 ms).
	times := d.times()
	require.GreaterOrEqual(t, times[failures].Sub(times[0]), 235*ms)
	for i := 1; i <= failures; i++ {
		wantMin := min(5*ms<<(i-1), 40*ms)
		require.GreaterOrEqual(t, times[i].Sub(times[i-1]), wantMin, "wait before dial %d", i+1)
	}

	got := logs.link()
	var warn, errs, info int
	for _, l := range got {
		switch {
		case strings.HasPrefix(l, "WARN"):
			warn++
		case strings.HasPrefix(l, "ERROR"):
			errs++
		case strings.HasPrefix(l, "INFO"):
			info++
		}
	}
	require.Equal(t, []int{1, 1, 1}, []int{warn, errs, info}, "link log lines:\n%s", strings.Join(got, "\n"))
	require.True(t, strings.HasPrefix(got[0], "WARN"), "the streak starts at Warn: %q", got)
}

// TestServeLogsPermanentRefusalOnce: a refusal no retry can fix is logged at
// Error at its first occurrence and not again while it repeats.
func TestServeLogsPermanentRefusalOnce(t *testing.T) {
	logs := &logRecords{}
	o := &follower.Options{Store: store.Options{FS: vfs.NewMem(), Logger: slog.New(logs), PebbleOptions: smallMemtable}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 4 * time.Millisecond}
	refusal := fmt.Errorf("dial: %w: hello for shard 1, serving 0", replication.ErrWrongShard)
	d := &scriptDialer{script: func(int) (bool, error) { return false, refusal }}
	serveUntil(t, o, d, func(n int) bool { return n >= 20 })
	got := logs.link()
	require.NotEmpty(t, got)
	require.True(t, strings.HasPrefix(got[0], "ERROR"), "first line: %q", got[0])
	for _, l := range got[1:] {
		require.True(t, strings.HasPrefix(l, "DEBUG"), "after the first line only Debug: %q", got)
	}
}

// isLinkLine reports whether msg is one of the redial loop's lines (not,
// say, "batch refused").
func isLinkLine(msg string) bool {
	return strings.Contains(msg, "connect") || strings.Contains(msg, "refused this follower") || strings.Contains(msg, "refused by the leader")
}

// withAttrs returns the redial loop's records as "LEVEL message k=v …".
func (h *logRecords) withAttrs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if !isLinkLine(r.Message) {
			continue
		}
		line := r.Level.String() + " " + r.Message
		r.Attrs(func(a slog.Attr) bool {
			line += " " + a.Key + "=" + a.Value.String()
			return true
		})
		out = append(out, line)
	}
	return out
}

// TestRefusalLogSaysWhatNext: the Error line of a refusal says what the
// follower does now and what the operator does about it, once per reason:
// a retry (with the wait) and the remedy of that reason, again only when
// the reason changes; with StopOnPermanentRefusal, that it stops. It said
// "refused for good; stopping" — also while it went on retrying.
func TestRefusalLogSaysWhatNext(t *testing.T) {
	unknown := fmt.Errorf("dial: %w: %w: \"f3\" is not registered", replication.ErrRefused, replication.ErrUnknownFollower)
	wrongShard := fmt.Errorf("dial: %w: %w: hello for shard 1, serving 0", replication.ErrRefused, replication.ErrWrongShard)
	duplicate := fmt.Errorf("dial: %w: %w: \"f3\" is already connected", replication.ErrRefused, replication.ErrDuplicateFollower)
	for _, tc := range []struct {
		name   string
		stop   bool
		script func(n int) error
		want   []string // the Error lines, in order, each holding every "|"-separated part
	}{
		{"unknown follower", false, func(int) error { return unknown },
			[]string{"the leader refused this follower; retrying in|reason=unknown_follower|remedy=add f3 to the leader's --followers"}},
		{"reason changes", false, func(n int) error {
			if n <= 5 {
				return unknown
			}
			return wrongShard
		}, []string{"retrying in|reason=unknown_follower", "retrying in|reason=wrong_shard|remedy=start this follower with the shard the leader ships (oncewal follower --shard)"}},
		{"stop on refusal", true, func(int) error { return wrongShard },
			[]string{"the leader refused this follower; stopping: StopOnPermanentRefusal is set|reason=wrong_shard"}},
		{"duplicate ID is retried even with stop on refusal", true, func(int) error { return duplicate },
			[]string{"retrying in|reason=duplicate_follower|remedy=another process is using --id f3; give each follower its own --id"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &logRecords{}
			o := &follower.Options{Store: store.Options{FS: vfs.NewMem(), Logger: slog.New(logs), PebbleOptions: smallMemtable, ID: "f3"}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 2 * time.Millisecond, StopOnPermanentRefusal: tc.stop}
			f, err := follower.Open("f", o)
			require.NoError(t, err)
			defer f.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d := &scriptDialer{script: func(n int) (bool, error) {
				if n >= 12 {
					cancel()
				}
				return false, tc.script(n)
			}}
			err = f.Serve(ctx, d)
			if tc.stop && tc.name == "stop on refusal" {
				require.ErrorIs(t, err, follower.ErrPermanentRefusal)
				require.Len(t, d.times(), 1)
			} else {
				require.NoError(t, err)
				require.GreaterOrEqual(t, len(d.times()), 12)
			}
			var errorLines []string
			for _, l := range logs.withAttrs() {
				if strings.HasPrefix(l, "ERROR") {
					errorLines = append(errorLines, l)
				} else {
					require.True(t, strings.HasPrefix(l, "DEBUG"), "a repeated refusal logs at Debug: %q", l)
				}
			}
			require.Len(t, errorLines, len(tc.want), "one Error line per reason:\n%s", strings.Join(errorLines, "\n"))
			for i, w := range tc.want {
				for _, part := range strings.Split(w, "|") {
					require.Contains(t, errorLines[i], part)
				}
			}
		})
	}
}

// TestPebbleLinesLabelled: Pebble's own lines reach the follower's logger
// with component=pebble, its routine ones (WAL recovery at open) at Debug,
// not at Info beside the follower's own lines.
func TestPebbleLinesLabelled(t *testing.T) {
	logs := &logRecords{}
	f, err := follower.Open("f", &follower.Options{Store: store.Options{FS: vfs.NewMem(), Logger: slog.New(logs), PebbleOptions: smallMemtable}})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	logs.mu.Lock()
	defer logs.mu.Unlock()
	var pebbleLines int
	for _, r := range logs.recs {
		var component string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "component" {
				component = a.Value.String()
			}
			return true
		})
		if component == "pebble" {
			pebbleLines++
			require.Equal(t, slog.LevelDebug, r.Level, "routine Pebble line %q", r.Message)
		} else {
			require.NotContains(t, r.Message, "WALs", "a Pebble line without component=pebble")
		}
	}
	require.NotZero(t, pebbleLines, "no Pebble line reached the logger")
}

// silentDialer hands out connections whose leader promised heartbeats
// every 10ms; a connection whose heard() stays fixed is a leader that
// stopped (SIGSTOP, a hung process, a cut network that TCP has not
// noticed yet), one whose heard() follows the clock is an idle, live one.
type silentDialer struct {
	live  bool
	dials atomic.Int64
}

func (d *silentDialer) Dial(ctx context.Context, _ replication.Ack) (replication.FollowerConn, error) {
	d.dials.Add(1)
	return &silentConn{live: d.live, since: time.Now()}, nil
}

type silentConn struct {
	live  bool
	since time.Time
}

func (c *silentConn) Recv(ctx context.Context) ([]byte, error) {
	<-ctx.Done() // no batch ever
	return nil, ctx.Err()
}
func (c *silentConn) Send(context.Context, replication.Ack) error { return nil }
func (c *silentConn) Close() error                                { return nil }
func (c *silentConn) HeartbeatInterval() time.Duration            { return 10 * time.Millisecond }
func (c *silentConn) LastHeard() (time.Time, replication.Heartbeat) {
	if c.live {
		return time.Now(), replication.Heartbeat{LastLSN: 7}
	}
	return c.since, replication.Heartbeat{}
}

// TestServeDropsSilentLeader: a leader that promised heartbeats and sends
// nothing for LeaderTimeout is taken for stopped: Serve drops the
// connection (Link.Connected false, LastError naming
// replication.ErrLeaderSilent) and redials, and the readiness check says
// why; an idle leader that keeps sending heartbeats keeps its connection.
// (A SIGSTOPped leader left its followers connected and ready.)
func TestServeDropsSilentLeader(t *testing.T) {
	for _, live := range []bool{false, true} {
		t.Run(fmt.Sprintf("live=%v", live), func(t *testing.T) {
			logs := &logRecords{}
			f, err := follower.Open("f", &follower.Options{Store: store.Options{FS: vfs.NewMem(), Logger: slog.New(logs), PebbleOptions: smallMemtable}, LeaderTimeout: 50 * time.Millisecond, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 2 * time.Millisecond})
			require.NoError(t, err)
			defer f.Close()
			ctx, cancel := context.WithCancel(context.Background())
			d := &silentDialer{live: live}
			served := make(chan error, 1)
			go func() { served <- f.Serve(ctx, d) }()
			if live {
				// Several LeaderTimeouts pass on one connection.
				deadline := time.Now().Add(300 * time.Millisecond)
				for time.Now().Before(deadline) {
					st := f.Stats().Link
					require.LessOrEqual(t, d.dials.Load(), int64(1), "a live leader's connection was dropped: %+v", st)
					time.Sleep(5 * time.Millisecond)
				}
				st := f.Stats().Link
				require.True(t, st.Connected)
				require.Equal(t, 10*time.Millisecond, st.HeartbeatInterval)
				require.Equal(t, uint64(7), st.LeaderLSN)
				require.NoError(t, metrics.FollowerReady(f, 0)())
			} else {
				for start := time.Now(); d.dials.Load() < 3; time.Sleep(time.Millisecond) {
					require.Less(t, time.Since(start), 10*time.Second, "the silent leader's connection was never dropped: %+v", f.Stats().Link)
				}
				cancel()
				require.NoError(t, <-served)
				served <- nil
				st := f.Stats().Link
				require.False(t, st.Connected)
				require.Contains(t, st.LastError, replication.ErrLeaderSilent.Error())
				require.Contains(t, st.LastError, "no batch, no heartbeat")
				err := metrics.FollowerReady(f, 0)()
				require.ErrorIs(t, err, metrics.ErrNotReady)
				require.Contains(t, err.Error(), "not connected to the leader: "+replication.ErrLeaderSilent.Error())
				var warned bool
				for _, l := range logs.withAttrs() {
					warned = warned || strings.HasPrefix(l, "WARN") && strings.Contains(l, replication.ErrLeaderSilent.Error())
				}
				require.True(t, warned, "the drop is logged at Warn: %q", logs.withAttrs())
			}
			cancel()
			<-served
		})
	}
}

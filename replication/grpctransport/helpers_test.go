package grpctransport

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// logRecorder is a slog handler that keeps every record's message and
// attributes as one line, for tests that assert a log line was written.
type logRecorder struct {
	mu    *sync.Mutex
	lines *[]string
	attrs []slog.Attr
}

func newLogRecorder() (*slog.Logger, *logRecorder) {
	r := &logRecorder{mu: new(sync.Mutex), lines: new([]string)}
	return slog.New(r), r
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	for _, a := range r.attrs {
		b.WriteString(" " + a.String())
	}
	rec.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	r.mu.Lock()
	*r.lines = append(*r.lines, b.String())
	r.mu.Unlock()
	return nil
}
func (r *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *r
	c.attrs = append(append([]slog.Attr(nil), r.attrs...), as...)
	return &c
}
func (r *logRecorder) WithGroup(string) slog.Handler { return r }

func (r *logRecorder) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), *r.lines...)
}

// find returns the first line containing every part.
func (r *logRecorder) find(parts ...string) (string, bool) {
	for _, l := range r.Lines() {
		ok := true
		for _, p := range parts {
			if !strings.Contains(l, p) {
				ok = false
				break
			}
		}
		if ok {
			return l, true
		}
	}
	return "", false
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// checkGoroutines fails the test if goroutines of gRPC or this package are
// still running a few seconds after the test's cleanups closed everything.
func checkGoroutines(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		var last []string
		deadline := time.Now().Add(5 * time.Second)
		for {
			last = leaked()
			if len(last) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%d goroutines outlived Close:\n%s", len(last), strings.Join(last, "\n\n"))
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func leaked() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "checkGoroutines") || strings.Contains(g, "leaked()") {
			continue
		}
		if strings.Contains(g, "google.golang.org/grpc") || strings.Contains(g, "replication/grpctransport.") ||
			strings.Contains(g, "oncewal/follower.") || strings.Contains(g, "oncewal/replication.") {
			out = append(out, g)
		}
	}
	return out
}

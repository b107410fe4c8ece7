package follower

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/snapshot"
)

func TestRedialBackoff(t *testing.T) {
	ms := time.Millisecond
	b := newRedialBackoff(&Options{ReconnectBackoff: 100 * ms, MaxReconnectBackoff: 5 * time.Second, ReconnectJitter: -1})
	var got []time.Duration
	var capped []bool
	for range 9 {
		capped = append(capped, b.capped())
		got = append(got, b.wait(0.9))
	}
	want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 5000 * ms, 5000 * ms, 5000 * ms}
	for i := range want {
		if got[i] != want[i] || capped[i] != (i >= 6) {
			t.Fatalf("waits %v (capped %v), want %v, capped from the 7th", got, capped, want)
		}
	}
	b.reset()
	if d := b.wait(0.5); d != 100*ms {
		t.Fatalf("after reset: %v, want 100ms", d)
	}

	// ±50 %: r spans [0, 1) onto [0.5, 1.5) times the backoff.
	j := newRedialBackoff(&Options{ReconnectBackoff: 100 * ms, MaxReconnectBackoff: time.Second, ReconnectJitter: 0.5})
	if d := j.wait(0); d != 50*ms {
		t.Fatalf("r=0: %v, want 50ms", d)
	}
	if d := j.wait(0.5); d != 200*ms {
		t.Fatalf("r=0.5: %v, want the backoff itself (200ms)", d)
	}
	if d := j.wait(math.Nextafter(1, 0)); d < 599*ms || d > 600*ms {
		t.Fatalf("r→1: %v, want 600ms at most, barely less", d)
	}

	// A huge cap neither overflows the doubling nor the jittered wait.
	h := newRedialBackoff(&Options{ReconnectBackoff: time.Duration(math.MaxInt64 / 3), MaxReconnectBackoff: math.MaxInt64, ReconnectJitter: 1})
	for range 4 {
		if d := h.wait(math.Nextafter(1, 0)); d < 0 {
			t.Fatalf("overflowed: %v", d)
		}
	}
}

func TestRedialOptions(t *testing.T) {
	o := (&Options{}).EnsureDefaults()
	if o.ReconnectBackoff != 100*time.Millisecond || o.MaxReconnectBackoff != 5*time.Second || o.ReconnectJitter != 0.5 {
		t.Fatalf("defaults: %v, %v, %v", o.ReconnectBackoff, o.MaxReconnectBackoff, o.ReconnectJitter)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	// A first wait above the default cap raises the cap with it.
	if o := (&Options{ReconnectBackoff: 10 * time.Second}).EnsureDefaults(); o.MaxReconnectBackoff != 10*time.Second || o.Validate() != nil {
		t.Fatalf("cap %v for a 10s first wait: %v", o.MaxReconnectBackoff, o.Validate())
	}
	for _, bad := range []Options{
		{ReconnectBackoff: time.Second, MaxReconnectBackoff: time.Millisecond},
		{ReconnectJitter: 1.5},
		{ReconnectJitter: math.NaN()},
		{ReconnectBackoff: -time.Second},
	} {
		if err := bad.EnsureDefaults().Validate(); err == nil {
			t.Errorf("%+v: validated", bad)
		}
	}
	if err := (&Options{ReconnectJitter: -1}).EnsureDefaults().Validate(); err != nil {
		t.Errorf("negative jitter (none): %v", err)
	}
}

// TestAfterRefusal: what Serve says it does after a refusal — rebuild (for
// Run and Node with Rebuild auto, only at a refusal a rebuild fixes), stop
// (StopOnPermanentRefusal, only at a permanent one), else retry.
func TestAfterRefusal(t *testing.T) {
	diverged := fmt.Errorf("%w: %w", replication.ErrRefused, replication.ErrDiverged)
	unknown := fmt.Errorf("%w: %w", replication.ErrRefused, replication.ErrUnknownFollower)
	duplicate := fmt.Errorf("%w: %w", replication.ErrRefused, replication.ErrDuplicateFollower)
	for _, tc := range []struct {
		name            string
		rebuilder, stop bool
		err             error
		next            string
		stops           bool
	}{
		{"diverged, rebuild", true, false, diverged, "rebuilding the store from a snapshot", true},
		{"diverged, rebuild and stop", true, true, diverged, "rebuilding the store from a snapshot", true},
		{"unknown, rebuild", true, false, unknown, "retrying in 2s, then at most every 5s", false},
		{"unknown, stop", false, true, unknown, "stopping: StopOnPermanentRefusal is set", true},
		{"diverged, neither", false, false, diverged, "retrying in 2s", false},
		{"duplicate, stop", true, true, duplicate, "retrying in 2s", false},
	} {
		f := &Follower{opts: Options{rebuilder: tc.rebuilder, StopOnPermanentRefusal: tc.stop, MaxReconnectBackoff: 5 * time.Second}}
		next, stops := f.afterRefusal(tc.err, 2*time.Second)
		if !strings.Contains(next, tc.next) || stops != tc.stops {
			t.Errorf("%s: %q, stop %v; want %q, stop %v", tc.name, next, stops, tc.next, tc.stops)
		}
	}
}

// TestRebuildDefault: the library's rebuild default is auto, as the CLI's;
// auto with no donor cannot rebuild, so it is valid and leaves the refusal
// standing, and the refusal's log line says what to do.
func TestRebuildDefault(t *testing.T) {
	var zero Options
	if zero.Rebuild != RebuildAuto {
		t.Fatalf("zero Options.Rebuild is %v, want auto", zero.Rebuild)
	}
	if err := zero.EnsureDefaults().Validate(); err != nil {
		t.Fatalf("auto without RebuildFrom refused: %v", err)
	}
	diverged := fmt.Errorf("hello: %w", replication.ErrDiverged)
	for _, tc := range []struct {
		name     string
		o        Options
		stop     bool
		contains string
	}{
		{"auto without a donor", Options{}, false, "Rebuild is auto but Options.RebuildFrom is nil"},
		{"never", Options{Rebuild: RebuildNever}, false, "Rebuild is never"},
		{"auto with a donor under Run", Options{RebuildFrom: nopSource{}, rebuilder: true}, true, "rebuilding the store"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &Follower{opts: *tc.o.EnsureDefaults()}
			next, stop := f.afterRefusal(diverged, time.Second)
			if stop != tc.stop || !strings.Contains(next, tc.contains) {
				t.Fatalf("afterRefusal: %q, stop %v; want %q, stop %v", next, stop, tc.contains, tc.stop)
			}
		})
	}
}

// nopSource is a donor that is never asked.
type nopSource struct{ snapshot.Source }

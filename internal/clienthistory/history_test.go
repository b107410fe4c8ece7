package clienthistory

import (
	"runtime"
	"testing"

	"github.com/oncewal/oncewal/client"
)

// failRecorder is the test's testing.TB but that it records a failure
// instead of failing the test, so that the checks' own verdicts can be
// tested.
type failRecorder struct {
	testing.TB
	failed bool
}

func (r *failRecorder) Helper()               {}
func (r *failRecorder) Errorf(string, ...any) { r.failed = true }
func (r *failRecorder) Fatalf(string, ...any) { r.failed = true; runtime.Goexit() }
func (r *failRecorder) FailNow()              { r.failed = true; runtime.Goexit() }

// fails reports whether check failed.
func fails(t *testing.T, check func(testing.TB)) bool {
	r := &failRecorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); check(r) }()
	<-done
	return r.failed
}

// record records request id of client c answered at ticks [call, ret].
func (h *History) record(c, id string, call, ret int64, res client.Result, err error) {
	r := h.NewRequest(c, id)
	r.answers = append(r.answers, Answer{Res: res, Err: err, Call: call, Ret: ret})
}

func TestCheckEpochsGrow(t *testing.T) {
	for _, tc := range []struct {
		name     string
		yCall    int64
		yEpoch   uint64
		wantFail bool
	}{
		{"a later answer at a lower epoch: a deposed leader answered", 3, 5, true},
		{"a later answer at the same epoch", 3, 7, false},
		{"an answer at a lower epoch sent before the higher one returned", 1, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h History
			h.record("c0", "x", 0, 2, client.Result{Epoch: 7}, nil)
			h.record("c1", "y", tc.yCall, 4, client.Result{Epoch: tc.yEpoch}, nil)
			// An error answer constrains nothing.
			h.record("c1", "z", 5, 6, client.Result{Epoch: 1}, client.ErrOutcomeUnknown)
			if got := fails(t, func(tb testing.TB) { h.CheckEpochsGrow(tb) }); got != tc.wantFail {
				t.Fatalf("CheckEpochsGrow failed = %v, want %v", got, tc.wantFail)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	var h History
	h.record("c0", "acked", 0, 1, client.Result{}, nil)
	h.record("c0", "unknown", 2, 3, client.Result{}, client.ErrOutcomeUnknown)
	h.record("c0", "unavailable", 4, 5, client.Result{}, client.ErrUnavailable)
	for _, tc := range []struct {
		name string
		eff  map[string]int64
		fail bool
	}{
		{"exactly once", map[string]int64{"req/acked": 1, "req/unknown": 1, Total: 2}, false},
		{"unknown not run", map[string]int64{"req/acked": 1, Total: 1}, false},
		{"acknowledged but lost", map[string]int64{"req/unknown": 1, Total: 1}, true},
		{"applied twice", map[string]int64{"req/acked": 2, Total: 2}, true},
		{"unknown applied twice", map[string]int64{"req/acked": 1, "req/unknown": 2, Total: 3}, true},
		{"ran though told it did not", map[string]int64{"req/acked": 1, "req/unavailable": 1, Total: 2}, true},
		{"total off", map[string]int64{"req/acked": 1, Total: 2}, true},
	} {
		if got := fails(t, func(tb testing.TB) { h.Check(tb, "replica", tc.eff) }); got != tc.fail {
			t.Errorf("%s: Check failed = %v, want %v", tc.name, got, tc.fail)
		}
	}
}

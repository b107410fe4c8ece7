package sim

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestOptionsValidate: Run and RunFailover refuse what they cannot carry
// out with ErrBadOptions, every problem named, before anything runs; the
// generators' options have the same Validate.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		run   func() error
		names []string
	}{
		{"Run", func() error {
			_, err := Run(context.Background(), Options{Promote: true, Diverge: true, LateJoiners: -1,
				Workload: WorkloadOptions{RetryRate: 2, LateRate: math.NaN()}})
			return err
		}, []string{"2 followers", "late joiners", "RetryRate", "LateRate"}},
		{"RunFailover", func() error {
			_, err := RunFailover(FailoverOptions{Requests: -1, Counters: -3})
			return err
		}, []string{"Requests", "Counters"}},
		{"RunElections", func() error {
			_, err := RunElections(context.Background(), ElectionOptions{Members: 1, Faults: -1, LeaseTTL: time.Millisecond,
				Workload: WorkloadOptions{Requests: 5000, CloseRate: 2}})
			return err
		}, []string{"Members 1", "Faults -1", "LeaseTTL", "window", "CloseRate"}},
		{"WorkloadOptions", func() error { return (&WorkloadOptions{CloseRate: -0.5}).EnsureDefaults().Validate() }, []string{"CloseRate"}},
		{"HostileOptions", func() error { return (&HostileOptions{Reappends: 1.5, LateWrites: -1}).Validate() }, []string{"Reappends", "LateWrites"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if !errors.Is(err, ErrBadOptions) {
				t.Fatalf("%v, want ErrBadOptions", err)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("%v does not name %s", err, n)
				}
			}
		})
	}
	if err := (&Options{}).EnsureDefaults().Validate(); err != nil {
		t.Fatalf("the defaults are refused: %v", err)
	}
}

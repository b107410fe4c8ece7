package testutil_test

import (
	"testing"
	"time"

	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

func TestClock(t *testing.T) {
	start := testutil.ClockStart.UnixNano()
	for _, tc := range []struct {
		name  string
		clock *testutil.Clock
		reads []int64 // Now, Now, Advance(time.Second), Now
	}{
		{"still", testutil.NewClock(), []int64{start, start, start + int64(time.Second)}},
		{"ticking", testutil.NewTickingClock(1), []int64{start + 1, start + 2, start + 3 + int64(time.Second)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := []int64{tc.clock.Now(), tc.clock.Now()}
			tc.clock.Advance(time.Second)
			got = append(got, tc.clock.Now())
			require.Equal(t, tc.reads, got)
		})
	}
}

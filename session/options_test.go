package session_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

func TestTrackerOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    session.TrackerOptions
		bad  []string // every problem named in the one error
	}{
		{"zero is the defaults", session.TrackerOptions{}, nil},
		{"log off", session.TrackerOptions{LogBatches: -1}, nil},
		{"negative cache", session.TrackerOptions{CacheSize: -1}, []string{"CacheSize"}},
		{"all at once", session.TrackerOptions{CacheSize: -1, RetentionHorizon: -time.Second, LogSessions: -2},
			[]string{"CacheSize", "RetentionHorizon", "LogSessions"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			err := o.EnsureDefaults().Validate()
			if tc.bad == nil {
				require.NoError(t, err)
				require.Equal(t, session.DefaultCacheSize, o.CacheSize)
				return
			}
			require.ErrorIs(t, err, session.ErrBadOptions)
			for _, f := range tc.bad {
				require.True(t, strings.Contains(err.Error(), f), "%v does not name %s", err, f)
			}
			_, err = session.OpenTracker(testutil.MemDB(t), &tc.o)
			require.True(t, errors.Is(err, session.ErrBadOptions), "OpenTracker: %v", err)
		})
	}
}

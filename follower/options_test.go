package follower_test

import (
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/follower"
	"github.com/stretchr/testify/require"
)

// TestNodeOptionsValidate: a negative ReopenBackoff is refused (it used to
// become the default silently, so OpenNode's check never fired), together
// with the template's problems, in one error.
func TestNodeOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    follower.NodeOptions
		bad  []string
	}{
		{"zero is the defaults", follower.NodeOptions{}, nil},
		{"negative backoff", follower.NodeOptions{ReopenBackoff: -time.Millisecond}, []string{"ReopenBackoff"}},
		{"all at once", follower.NodeOptions{ReopenBackoff: -1,
			Follower: follower.Options{WindowCapacity: -1, RetentionHorizon: -time.Hour}},
			[]string{"ReopenBackoff", "WindowCapacity", "RetentionHorizon"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			err := o.EnsureDefaults().Validate()
			if tc.bad == nil {
				require.NoError(t, err)
				require.Equal(t, follower.DefaultReopenBackoff, o.ReopenBackoff)
				return
			}
			require.Error(t, err)
			for _, f := range tc.bad {
				require.True(t, strings.Contains(err.Error(), f), "%v does not name %s", err, f)
			}
			dir := t.TempDir()
			_, err = follower.OpenNode(dir, []uint32{0}, &tc.o)
			require.ErrorIs(t, err, follower.ErrBadNodeOptions)
		})
	}
}

// Package ctxtime holds the one context-aware sleep the retry loops of
// replication, snapshot and follower share.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends, whichever comes first, and returns
// ctx.Err() in the second case. A d ≤ 0 returns nil at once.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

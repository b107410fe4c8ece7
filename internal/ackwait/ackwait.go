// Package ackwait waits for acknowledgements by polling a position, for the
// module's benchmarks and tests that drive a bare leader.Shipper or
// leader.Fanout. Embedders have one way to wait for acks,
// leader.Shard.WaitAcked (and Leader.WaitAcked over every shard), which the
// acks themselves wake; the shipping stack's own wait is unexported so that
// it is not a second spelling.
package ackwait

import (
	"context"
	"time"
)

// poll is how often Until rereads the position: far below a batch's round
// trip, so a benchmark's measured time hardly moves.
const poll = 100 * time.Microsecond

// Until returns nil once acked reports lsn or more, acked's error, or
// ctx's error when ctx ends first.
func Until(ctx context.Context, lsn uint64, acked func() (uint64, error)) error {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		at, err := acked()
		if err != nil {
			return err
		}
		if at >= lsn {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// All is the position every follower of ids has acknowledged (a Fanout's
// AckAll): the least of acked over them.
func All(ids []string, acked func(id string) (uint64, error)) func() (uint64, error) {
	return func() (uint64, error) {
		var least uint64
		for i, id := range ids {
			at, err := acked(id)
			if err != nil {
				return 0, err
			}
			if i == 0 || at < least {
				least = at
			}
		}
		return least, nil
	}
}

package client

import (
	"time"

	"google.golang.org/grpc/backoff"
)

// delay is the wait before the retry that follows `waits` earlier waits of
// a call, under cfg, with r uniform in [0, 1): gRPC's connection backoff
// (grpc/grpc doc/connection-backoff.md) over gRPC's own backoff.Config.
//
// It is written here because gRPC v1.85 computes this delay only in
// google.golang.org/grpc/internal/backoff (Exponential.Backoff), which is
// not importable; its public backoff package has the Config alone. gRPC's
// service-config retryPolicy cannot take the loop's place either: it
// retries by status code only, while NotLeader, InFlight and
// SessionExpired arrive in the reply body of a successful call, and a
// redirect changes the address, which a channel's retry cannot.
func delay(cfg backoff.Config, waits int, r float64) time.Duration {
	d, limit := float64(cfg.BaseDelay), float64(cfg.MaxDelay)
	for ; d < limit && waits > 0; waits-- {
		d *= cfg.Multiplier
	}
	d = min(d, limit)
	// Jitter keeps clients that failed together from retrying in lockstep.
	d *= 1 + cfg.Jitter*(2*r-1)
	return time.Duration(max(d, 0))
}

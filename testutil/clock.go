package testutil

import (
	"sync/atomic"
	"time"
)

// ClockStart is where a Clock starts: 2026-01-01 00:00 UTC.
var ClockStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a wall clock in Unix nanoseconds that the test moves by hand,
// for the Now/Wall options of the ledger and the leader: expiry, leases
// and retention then depend on the steps a test takes, never on how fast
// it runs. Safe for concurrent use.
type Clock struct {
	ns   atomic.Int64
	tick int64
}

// NewClock is a Clock at ClockStart that moves only by Advance.
func NewClock() *Clock {
	c := &Clock{}
	c.ns.Store(ClockStart.UnixNano())
	return c
}

// NewTickingClock is a Clock at ClockStart that also moves by tick on
// every Now, like a leader's strictly increasing WAL clock: no two readings
// are equal.
func NewTickingClock(tick time.Duration) *Clock {
	c := NewClock()
	c.tick = int64(tick)
	return c
}

// Now is the clock's time in Unix nanoseconds (after its tick, if any).
func (c *Clock) Now() int64 { return c.ns.Add(c.tick) }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

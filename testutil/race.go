//go:build race

package testutil

// RaceEnabled reports whether the race detector is on: -race slows Pebble
// about tenfold, so long tests scale down (see their comments).
const RaceEnabled = true

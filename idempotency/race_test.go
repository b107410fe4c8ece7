//go:build race

package idempotency

const raceEnabled = true

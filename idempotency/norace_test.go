//go:build !race

package idempotency

const raceEnabled = false

//go:build race

package replication_test

// raceEnabled: -race slows Pebble ~10x; long tests scale down (see their comments).
const raceEnabled = true

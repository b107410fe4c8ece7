//go:build race

package sim

// raceEnabled: the race detector slows a run several times over.
const raceEnabled = true

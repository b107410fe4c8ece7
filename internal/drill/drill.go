// Package drill stops a store, follower or node the way a killed process
// stops — Serve cancelled wherever it is, the store closed without the
// clean-shutdown flush, so the next Open replays Pebble's WAL — for this
// module's fault drills: the simulation, the benchmarks and the tests.
// Embedders get Close; a kill is not part of the public surface (issue 25).
// The owning packages register in init; Kill asks each.
package drill

import "fmt"

var killers []func(any) (error, bool)

// Register adds a killer answering ok for the types it knows; called from
// init only, so no lock.
func Register(kill func(x any) (err error, ok bool)) { killers = append(killers, kill) }

// Kill kills x. x of a type no package registered is a bug in this module,
// not bad input, hence the panic.
func Kill(x any) error {
	for _, k := range killers {
		if err, ok := k(x); ok {
			return err
		}
	}
	panic(fmt.Sprintf("drill: cannot kill a %T", x))
}

// Package rawdb hands the writable Pebble handle under a store (a
// store.Store, a follower.Follower) to this module's own packages — the
// leader's slots and epoch writes, snapshot donors, the simulation and the
// benchmarks — without a public method that would hand it to embedders too
// (they get store.View, which cannot write). The owning packages register a
// getter in init; Of asks each.
package rawdb

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

var getters []func(any) (*pebble.DB, bool)

// Register adds a getter; called from init only, so no lock.
func Register(get func(any) (*pebble.DB, bool)) { getters = append(getters, get) }

// Of returns the Pebble handle under x. x of a type no package registered is
// a bug in this module, not bad input, hence the panic.
func Of(x any) *pebble.DB {
	for _, get := range getters {
		if db, ok := get(x); ok {
			return db
		}
	}
	panic(fmt.Sprintf("rawdb: %T has no Pebble handle", x))
}

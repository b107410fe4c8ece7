// Package testutil holds test helpers only (store snapshots, directory
// digests). Only _test.go files import it (TestOnlyTestsImport checks): the
// simulation the demo runs is package sim.
package testutil

// Package testutil holds test helpers only: in-memory Pebble stores
// (MemDB, OpenDB), a hand-moved clock (Clock), seeded session IDs
// (SessionID), fault filesystems on Pebble's errorfs (FailNth, and CrashFS
// over vfs.NewCrashableMem + CrashClone; SyncGate, which holds a sync in
// flight), directory copies and images
// (CopyDir, TempCopy, DirImage, TreeDigest, TreeState), store snapshots
// (SnapshotDB), TLS certificates for both ends (TLSPair), a TCP proxy that
// breaks connections (FaultProxy) and golden files.
// Only _test.go files import it (TestOnlyTestsImport checks): the
// simulation the demo runs is package sim.
//
// It imports no package of this module but leaves that import nothing of
// it (TestTestutilImportsOnlyLeaves checks), so that the internal tests of
// any package (package wal's own tests, say) can use it without an import
// cycle.
package testutil

//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

import "os"

// sharedLock is a no-op where POSIX record locks are unavailable: inspect
// then relies on being pointed at a store no follower is running on.
func sharedLock(*os.File) error { return nil }

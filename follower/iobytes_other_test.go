//go:build !linux

package follower_test

func diskWriteBytes() int64 { return -1 }

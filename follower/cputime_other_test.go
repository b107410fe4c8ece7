//go:build !unix

package follower_test

import "time"

// cpuTime is not measured on this platform (the cpu-ms/s metric reads 0).
func cpuTime() time.Duration { return 0 }

package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"github.com/oncewal/oncewal/replication"
)

// flagCheck collects every bad flag value of a command line, so that one
// usage error names them all (as the library's Options.Validate does) and
// the command refuses them before it touches anything.
type flagCheck struct {
	problems []string
}

func (c *flagCheck) failf(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// inRange requires lo <= v <= hi and reports whether it holds. Written as a
// negated conjunction so that a NaN, which compares false with everything,
// is refused too.
func inRange[T cmp.Ordered](c *flagCheck, name string, v, lo, hi T) bool {
	if !(v >= lo && v <= hi) {
		c.failf("--%s %v is out of range [%v, %v]", name, v, lo, hi)
		return false
	}
	return true
}

// atLeast requires v >= lo (NaN refused) and reports whether it holds.
func atLeast[T cmp.Ordered](c *flagCheck, name string, v, lo T) bool {
	if !(v >= lo) {
		c.failf("--%s %v must be >= %v", name, v, lo)
		return false
	}
	return true
}

// hostPort requires addr to be host:port with a numeric port — 1..65535 for
// an address to dial (dial), 0..65535 for one to listen on, where 0 picks a
// free port. A dial address needs a host.
func hostPort(c *flagCheck, name, addr string, dial bool) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		c.failf("--%s %q is not host:port: %v", name, addr, err)
		return
	}
	lo := uint64(0)
	if dial {
		lo = 1
		if host == "" {
			c.failf("--%s %q names no host", name, addr)
		}
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p < lo {
		c.failf("--%s %q: port %q is not a number in %d..65535", name, addr, port, lo)
	}
}

// refuse reports the collected problems as a usage error and returns
// exitUsage, or returns false when there are none.
func (c *flagCheck) refuse(fs *flag.FlagSet, stderr io.Writer) (int, bool) {
	if len(c.problems) == 0 {
		return 0, false
	}
	return usageError(fs, stderr, "%s", strings.Join(c.problems, "; ")), true
}

// checkEpochFlag refuses an --epoch above replication.MaxEpoch: no epoch
// may leave no room above it (a promotion's highest + 1 would wrap to 0).
func checkEpochFlag(c *flagCheck, epoch uint64) {
	if err := replication.CheckEpoch("--epoch", epoch); err != nil {
		c.failf("%v", err)
	}
}

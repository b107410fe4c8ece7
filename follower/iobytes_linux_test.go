package follower_test

import (
	"bytes"
	"os"
	"strconv"
)

// diskWriteBytes is the bytes this process has caused to be written to
// storage so far (/proc/self/io write_bytes: counted when pages are
// dirtied, so it includes data the page cache has not written back yet),
// or -1 if unknown.
func diskWriteBytes() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("write_bytes: ")); ok {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

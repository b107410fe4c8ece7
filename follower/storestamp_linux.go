package follower

import (
	"fmt"
	"os"
	"syscall"
)

// fileStamp is fi's device, inode and change time, which no copy tool
// preserves.
func fileStamp(fi os.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return fmt.Sprintf(" %d:%d %d.%d", st.Dev, st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
}

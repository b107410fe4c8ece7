package follower

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// storeStamp describes what the store directory dir holds on disk, without
// opening it: every entry's name, size and modification time and, where the
// platform tells (fileStamp), its file identity and change time; the
// directory's own identity too. The LOCK file is left out: taking Pebble's
// lock truncates it, so an open's one trace would read as a change. A node
// reopens a damaged store it does not rebuild only once its stamp differs
// from the one taken after the failed open (invariant 3): the operator
// replaced, restored or moved it. The ctime in fileStamp catches a copy
// restored in place with its sizes and times preserved (cp -a). A nil fs
// is the operating system's, as for store.Options.FS.
func storeStamp(fs vfs.FS, dir string) string {
	if fs == nil {
		fs = vfs.Default
	}
	var b strings.Builder
	st, err := fs.Stat(dir)
	if err != nil {
		// Absent or unreadable: a state of its own (moved aside), compared
		// like any other.
		return "error: " + err.Error()
	}
	fmt.Fprintf(&b, ".%s\n", fileStamp(st))
	names, err := fs.List(dir)
	if err != nil {
		return "error: " + err.Error()
	}
	slices.Sort(names)
	for _, name := range names {
		if name == "LOCK" {
			continue
		}
		fi, err := fs.Stat(fs.PathJoin(dir, name))
		if err != nil {
			fmt.Fprintf(&b, "%s error %v\n", name, err)
			continue
		}
		fmt.Fprintf(&b, "%s %d %d%s\n", name, fi.Size(), fi.ModTime().UnixNano(), fileStamp(fi))
	}
	return b.String()
}

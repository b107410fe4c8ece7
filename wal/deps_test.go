package wal

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestLeafDependencies: wal is a leaf of the module. It may link Pebble's vfs
// (its filesystem seam), the leaf type packages and package corruption, but
// not Pebble itself, the idempotency window (golang-lru) or any oncewal
// package that does, so a tool that only reads or writes the log stays small
// and cannot reach the store.
func TestLeafDependencies(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Skip("no go command to list dependencies with")
		}
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	allowedOwn := map[string]bool{
		"github.com/oncewal/oncewal/wal":                   true,
		"github.com/oncewal/oncewal/internal/eventid":      true,
		"github.com/oncewal/oncewal/internal/ledgerrecord": true,
		"github.com/oncewal/oncewal/corruption":            true, // the corruption class; standard library only
	}
	sawVFS := false
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case dep == "github.com/cockroachdb/pebble/v2":
			t.Errorf("wal links the Pebble root package")
		case strings.Contains(dep, "golang-lru"):
			t.Errorf("wal links %s", dep)
		case strings.HasPrefix(dep, "github.com/oncewal/oncewal/") && !allowedOwn[dep]:
			t.Errorf("wal links %s; only the leaf type packages are allowed", dep)
		case dep == "github.com/cockroachdb/pebble/v2/vfs":
			sawVFS = true
		}
	}
	if !sawVFS {
		// The FS seam is vfs.FS: its absence means the listing is not wal's.
		t.Fatalf("pebble/v2/vfs not among wal's dependencies: wrong package listed?\n%s", out)
	}
}

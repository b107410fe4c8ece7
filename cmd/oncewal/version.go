package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

const versionSynopsis = `version

Prints the module version and the VCS revision this binary was built from
(from the build information the Go toolchain embeds; "(devel)" and "unknown"
for a build outside version control or from go run), and the Go version.
"oncewal --version" is the same.`

func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", versionSynopsis, stderr)
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	bi, _ := debug.ReadBuildInfo()
	fmt.Fprintln(stdout, versionLine(bi))
	return exitOK
}

// versionLine renders build information (nil: none embedded) as one line:
// "oncewal VERSION (revision REV[+dirty], TIME) GOVERSION".
func versionLine(bi *debug.BuildInfo) string {
	version, rev, at, dirty := "(devel)", "unknown", "", false
	goVersion := runtime.Version()
	if bi != nil {
		if v := bi.Main.Version; v != "" {
			version = v
		}
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if dirty {
		rev += "+dirty"
	}
	if at != "" {
		rev += ", " + at
	}
	return fmt.Sprintf("oncewal %s (revision %s) %s", version, rev, goVersion)
}

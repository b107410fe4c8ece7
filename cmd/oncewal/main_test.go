package main

import (
	"bytes"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

// runCmd runs the oncewal command line in-process.
func runCmd(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return o.String(), e.String(), code
}

func TestUsage(t *testing.T) {
	out, errOut, code := runCmd(t, "help")
	if code != exitOK || errOut != "" {
		t.Fatalf("help: code %d, stderr %q", code, errOut)
	}
	for _, c := range []string{"demo", "waldump", "inspect", "bench", "help"} {
		if !strings.Contains(out, "\n  "+c+" ") {
			t.Errorf("usage does not list %q:\n%s", c, out)
		}
	}

	_, errOut, code = runCmd(t)
	if code != exitUsage || !strings.Contains(errOut, "Usage:") {
		t.Errorf("no arguments: code %d, stderr %q", code, errOut)
	}
	_, errOut, code = runCmd(t, "frobnicate")
	if code != exitUsage || errOut != "oncewal: unknown command \"frobnicate\"\nrun 'oncewal help' for the commands\n" {
		t.Errorf("unknown command: code %d, stderr %q", code, errOut)
	}
	_, errOut, code = runCmd(t, "help", "frobnicate")
	if code != exitUsage || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Errorf("help on unknown command: code %d, stderr %q", code, errOut)
	}
}

func TestHelpSubcommand(t *testing.T) {
	for _, tc := range []struct{ cmd, want, noArg string }{
		{"waldump", "-from LSN", "want exactly one"},
		{"inspect", "read-only", "want a DIR"},
	} {
		out, _, code := runCmd(t, "help", tc.cmd)
		if code != exitOK || !strings.Contains(out, "usage: oncewal "+tc.cmd) || !strings.Contains(out, tc.want) {
			t.Errorf("help %s: code %d, stdout:\n%s", tc.cmd, code, out)
		}
		out, errOut, code := runCmd(t, tc.cmd, "-h")
		if code != exitOK || !strings.Contains(out, "usage: oncewal "+tc.cmd) || errOut != "" {
			t.Errorf("%s -h: code %d, stdout:\n%s\nstderr:\n%s", tc.cmd, code, out, errOut)
		}
		_, errOut, code = runCmd(t, tc.cmd, "--no-such-flag", "x")
		if code != exitUsage || !strings.Contains(errOut, "no-such-flag") {
			t.Errorf("%s with a bad flag: code %d, stderr:\n%s", tc.cmd, code, errOut)
		}
		_, errOut, code = runCmd(t, tc.cmd)
		if code != exitUsage || !strings.Contains(errOut, tc.noArg) {
			t.Errorf("%s without its argument: code %d, stderr:\n%s", tc.cmd, code, errOut)
		}
		if tc.cmd == "inspect" {
			continue // several directories compare their positions
		}
		_, errOut, code = runCmd(t, tc.cmd, "a", "b")
		if code != exitUsage || !strings.Contains(errOut, "want exactly one") {
			t.Errorf("%s with two arguments: code %d, stderr:\n%s", tc.cmd, code, errOut)
		}
	}
}

func TestParseArgsInterleaved(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pos  []string
		json bool
		from uint64
	}{
		{[]string{"PATH"}, []string{"PATH"}, false, 0},
		{[]string{"PATH", "--json"}, []string{"PATH"}, true, 0},
		{[]string{"--json", "PATH"}, []string{"PATH"}, true, 0},
		{[]string{"PATH", "--from", "7", "--json"}, []string{"PATH"}, true, 7},
		{[]string{"-from=7", "A", "B", "-json"}, []string{"A", "B"}, true, 7},
		{[]string{"--", "--json"}, []string{"--json"}, false, 0},
		{[]string{"A", "--", "-x", "--from"}, []string{"A", "-x", "--from"}, false, 0},
		{[]string{}, nil, false, 0},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		j := fs.Bool("json", false, "")
		from := fs.Uint64("from", 0, "")
		pos, _, ok := parseArgs(fs, tc.args, io.Discard)
		if !ok || !slices.Equal(pos, tc.pos) || *j != tc.json || *from != tc.from {
			t.Errorf("parseArgs(%q) = %q ok=%v json=%v from=%d; want %q json=%v from=%d",
				tc.args, pos, ok, *j, *from, tc.pos, tc.json, tc.from)
		}
	}
}

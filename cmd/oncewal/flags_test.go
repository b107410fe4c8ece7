package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/replication/grpctransport"
	"github.com/oncewal/oncewal/wal"
)

// TestHelpEveryCommand: asked-for help is output — stdout, exit 0, nothing
// on stderr — for every subcommand, however it is asked for.
func TestHelpEveryCommand(t *testing.T) {
	for _, c := range commands {
		for _, args := range [][]string{{c.name, "-h"}, {c.name, "--help"}, {"help", c.name}} {
			out, errOut, code := runCmd(t, args...)
			if code != exitOK || errOut != "" || !strings.HasPrefix(out, "usage: oncewal "+c.name) {
				t.Errorf("%q: exit %d, stderr %q, stdout:\n%s", args, code, errOut, out)
			}
		}
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		out, errOut, code := runCmd(t, args...)
		if code != exitOK || errOut != "" || !strings.HasPrefix(out, "oncewal ") ||
			!strings.Contains(out, "(revision ") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("%q: exit %d, stderr %q, stdout %q", args, code, errOut, out)
		}
	}
	if _, _, code := runCmd(t, "version", "extra"); code != exitUsage {
		t.Errorf("version with an argument: exit %d", code)
	}

	bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Path: "github.com/oncewal/oncewal", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.time", Value: "2026-11-20T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"}}}
	if got, want := versionLine(bi), "oncewal v1.2.3 (revision 0123abcd+dirty, 2026-11-20T10:00:00Z) go1.99"; got != want {
		t.Errorf("versionLine = %q, want %q", got, want)
	}
	if got, want := versionLine(nil), "oncewal (devel) (revision unknown) "+runtime.Version(); got != want {
		t.Errorf("versionLine(nil) = %q, want %q", got, want)
	}
}

// TestFlagsRefusedAtStart: every numeric or address flag out of its range
// is a usage error (exit 2) naming the flag, before the command creates or
// opens anything.
func TestFlagsRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	demo := []string{"demo", "--dir", target}
	gencerts := []string{"gencerts", target}
	leader := []string{"leader", "--dir", target, "--followers", "a,b", "--insecure", "--listen", "127.0.0.1:0", "--generate", "100"}
	follower := []string{"follower", "--dir", target, "--id", "a", "--insecure", "--leader", "127.0.0.1:7070"}
	promote := []string{"promote", "--dir", target}
	with := func(base []string, more ...string) []string { return append(append([]string(nil), base...), more...) }
	for _, tc := range []struct {
		args []string
		want []string // in stderr
	}{
		{with(demo, "--retry-rate", "NaN"), []string{"--retry-rate NaN is out of range [0, 1]"}},
		{with(demo, "--late-rate", "+Inf"), []string{"--late-rate +Inf is out of range"}},
		{with(demo, "--late-rate", "-0.1"), []string{"--late-rate -0.1 is out of range"}},
		{with(demo, "--retry-rate", "1.5"), []string{"--retry-rate 1.5 is out of range"}},
		{with(demo, "--late-rate", "0.5", "--retry-rate", "0.5"), []string{"--late-rate + --retry-rate must be < 1"}},
		{with(demo, "--followers", "0"), []string{"--followers 0 is out of range"}},
		{with(demo, "--promote"), []string{"--promote needs --followers >= 2"}},
		{with(demo, "--sessions", "0"), []string{"--sessions 0 is out of range"}},
		{with(demo, "--events", "-5"), []string{"--events -5 is out of range"}},
		{with(demo, "--events", "99999999999"), []string{"--events 99999999999 is out of range"}},
		{with(demo, "--restarts", "-1"), []string{"--restarts -1 is out of range"}},
		{with(demo, "--shards", "0"), []string{"--shards 0 is out of range"}},
		{with(demo, "--shards", "65537"), []string{"--shards 65537 is out of range"}},
		{with(demo, "--shards", "2", "--network"), []string{"does not combine with --network"}},
		{with(demo, "--faults", "medium"), []string{`--faults "medium"`}},
		// Every problem named in one error.
		{with(demo, "--retry-rate", "NaN", "--sessions", "0", "--restarts", "-2"),
			[]string{"--retry-rate NaN", "--sessions 0", "--restarts -2"}},

		{with(gencerts, "--days", "99999999"), []string{"--days 99999999 is out of range [1, 36500]"}},
		{with(gencerts, "--days", "0"), []string{"--days 0 is out of range"}},
		{with(gencerts, "--hosts", " , "), []string{"--hosts names no host"}},
		// Bad identity names: every one named, nothing written.
		{with(gencerts, "--followers", "f1,,f2", "--clients", "a/b"),
			[]string{pki.ErrBadName.Error() + `: "" is not 1-64 bytes`, `"a/b": byte '/' at 1`}},
		{with(gencerts, "--followers", "f1,f2,f1"), []string{pki.ErrBadName.Error() + `: follower "f1" is given twice`}},
		{with(gencerts, "--node", "f1"), []string{`"f1" names both the node and a follower`}},
		{with(gencerts, "--node", " "), []string{"--node is empty"}},
		{with(gencerts, "--clients", "app,app"), []string{`client "app" is given twice`}},

		{with(leader, "--stats-interval", "-1s"), []string{"--stats-interval -1s must be >= 0s"}},
		{with(leader, "--epoch", "-1"), []string{"-epoch"}},
		{with(leader, "--generate", "-1"), []string{"--generate -1 is out of range"}},
		{with(leader, "--sessions", "0"), []string{"--sessions 0 is out of range"}},
		{with(leader, "--batch", "0"), []string{"--batch 0 is out of range"}},
		{with(leader, "--clients", "0"), []string{"--clients 0 is out of range"}},
		{with(leader, "--clients", "-3"), []string{"--clients -3 is out of range"}},
		{with(leader, "--clients", "1025"), []string{"--clients 1025 is out of range"}},
		{with(leader, "--clients", "x"), []string{"-clients"}},
		{with(leader, "--sessions", "4", "--clients", "5"), []string{"--clients 5 exceeds --sessions 4"}},
		{with(leader, "--generate", "0", "--ack-log", filepath.Join(dir, "acked")), []string{"--ack-log needs --generate"}},
		{with(leader, "--sessions", "0", "--clients", "0"), []string{"--sessions 0", "--clients 0"}},
		{with(leader, "--batch", "1000000"), []string{"--batch 1000000 is out of range"}},
		{with(leader, "--shards", "0"), []string{"--shards 0 is out of range"}},
		{with(leader, "--shards", "65537"), []string{"--shards 65537 is out of range"}},
		{with(leader, "--max-retained-bytes", "0"), []string{"--max-retained-bytes 0 is out of range"}},
		{with(leader, "--retention-interval", "0s"), []string{"--retention-interval 0s is out of range"}},
		{with(leader, "--segment-size", "100"), []string{"--segment-size 100 is out of range"}},
		{with(leader, "--min-free-bytes", "0"), []string{"--min-free-bytes must be positive or -1"}},
		{with(follower, "--min-free-bytes", "-2"), []string{"--min-free-bytes must be positive or -1"}},
		{with(follower, "--memtable-size", "1000"), []string{"--memtable-size 1000 is out of range"}},
		{with(leader, "--memtable-size", "4294967296"), []string{"--memtable-size 4294967296 is out of range"}},
		{with(leader, "--retry-rate", "NaN"), []string{"--retry-rate NaN is out of range"}},
		{with(leader, "--ack", "most"), []string{`--ack "most" is not one of`}},
		{with(leader, "--followers", "a,a"), []string{`"a" listed twice`}},
		{with(leader, "--listen", "127.0.0.1"), []string{`--listen "127.0.0.1" is not host:port`}},
		{with(leader, "--listen", "127.0.0.1:65536"), []string{`port "65536" is not a number`}},
		{with(leader, "--shards", "0", "--batch", "0", "--ack", "x"), []string{"--shards 0", "--batch 0", `--ack "x"`}},

		{with(follower, "--leader", "127.0.0.1"), []string{`--leader "127.0.0.1" is not host:port`}},
		{with(follower, "--leader", ":7070"), []string{`--leader ":7070" names no host`}},
		{with(follower, "--leader", "localhost:0"), []string{`port "0" is not a number in 1..65535`}},
		{with(follower, "--leader", "localhost:grpc"), []string{`port "grpc" is not a number`}},
		{with(follower, "--stats-interval", "-1s"), []string{"--stats-interval -1s must be >= 0s"}},
		{with(follower, "--shard", "4294967296"), []string{"--shard 4294967296 is out of range"}},
		{with(follower, "--shards", "-1"), []string{"--shards -1 is out of range"}},
		{with(follower, "--shards", "65537"), []string{"--shards 65537 is out of range"}},
		{with(follower, "--id", "a b"), []string{"--id"}},
		{with(follower, "--metrics-addr", "9090"), []string{`--metrics-addr "9090" is not host:port`}},
		{with(follower, "--ready-max-lag", "-1s"), []string{"--ready-max-lag -1s must be >= 0s"}},
		{with(follower, "--leader-timeout", "-1s"), []string{"--leader-timeout -1s must be >= 0s"}},
		{with(leader, "--metrics-addr", "localhost:http"), []string{`port "http" is not a number`}},
		{with(follower, "--log-format", "xml"), []string{`--log-format "xml": want text or json`}},
		{with(leader, "--log-level", "loud"), []string{`--log-level "loud": want debug, info, warn or error`}},

		{with(promote, "--epoch", "x"), []string{"-epoch"}},
		{with(promote, "--peers", ","), []string{"empty entry"}},
	} {
		out, errOut, code := runCmd(t, tc.args...)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d; stderr:\n%s", tc.args, code, exitUsage, errOut)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%q: stderr lacks %q:\n%s", tc.args, w, errOut)
			}
		}
		// The error, then one line pointing at -h: the help itself would
		// scroll the error away (it did: 50–90 lines after it).
		hint := "run 'oncewal " + tc.args[0] + " -h' for the flags\n"
		if !strings.HasSuffix(errOut, hint) || strings.Contains(errOut, "usage: oncewal") || strings.Count(errOut, "\n") != 2 || out != "" {
			t.Errorf("%q: want the error and %q on stderr, no help, nothing on stdout; stdout %q, stderr:\n%s", tc.args, hint, out, errOut)
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Fatalf("%q created %s before refusing its flags", tc.args, target)
		}
	}
}

// TestWaldumpNotASegment: a file that cannot be a segment is an error (exit
// 1, errNotSegment named), not "no batches"; an empty file named as a
// segment is a real (empty) segment.
func TestWaldumpNotASegment(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.bin")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	paths := []string{empty}
	if st, err := os.Stat(os.DevNull); err == nil && !st.Mode().IsRegular() {
		paths = append(paths, os.DevNull)
	}
	for _, p := range paths {
		for _, args := range [][]string{{"waldump", p}, {"waldump", "--json", p}} {
			out, errOut, code := runCmd(t, args...)
			if code != exitFailure || !strings.Contains(errOut, "not a WAL segment") || out != "" {
				t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
			}
		}
	}

	seg := filepath.Join(dir, wal.SegmentName(0, 1))
	if err := os.WriteFile(seg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCmd(t, "waldump", seg)
	if code != exitOK || !strings.Contains(out, "no batches") {
		t.Errorf("empty named segment: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestFollowerStatsLineAccounts: the follower's periodic stats line carries
// every term of the accounting identity (it once lacked refused and too-old
// events, so 14,888 events against 14,792 applied showed no cause).
func TestFollowerStatsLineAccounts(t *testing.T) {
	r := store.ReceiverStats{Events: 1000, Applied: 500, DiscardedPosition: 1, DiscardedHWM: 2, DiscardedWindow: 3,
		DiscardedInBatch: 4, SkippedClosed: 5, SkippedTooOld: 6, RefusedEvents: 479}
	if r.Accounted() != r.Events {
		t.Fatalf("fixture does not account: %d of %d", r.Accounted(), r.Events)
	}
	attrs := followerStatsAttrs(7, 1, follower.Stats{Stats: store.Stats{Receiver: r}}, grpctransport.DialerStats{})
	kv := map[string]uint64{}
	for i := 0; i+1 < len(attrs); i += 2 {
		if v, ok := attrs[i+1].(uint64); ok {
			kv[attrs[i].(string)] = v
		}
	}
	var sum uint64
	for _, k := range []string{"applied", "discarded_position", "discarded_hwm", "discarded_window",
		"discarded_in_batch", "skipped_closed", "skipped_too_old", "refused_events"} {
		v, ok := kv[k]
		if !ok {
			t.Errorf("stats line lacks %s: %v", k, attrs)
		}
		sum += v
	}
	if sum != kv["events"] {
		t.Errorf("stats line terms sum to %d, events %d: %v", sum, kv["events"], attrs)
	}
}

// TestLogFlags: --log-format json gives one JSON object per line,
// --log-level drops what is below it, --debug lowers it to debug.
func TestLogFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		json      bool
		wantLevel []string // levels of the lines written by Debug, Info, Warn, Error
	}{
		{nil, false, []string{"INFO", "WARN", "ERROR"}},
		{[]string{"--log-format", "json"}, true, []string{"INFO", "WARN", "ERROR"}},
		{[]string{"--log-format", "json", "--log-level", "warn"}, true, []string{"WARN", "ERROR"}},
		{[]string{"--log-level", "error"}, false, []string{"ERROR"}},
		{[]string{"--debug"}, false, []string{"DEBUG", "INFO", "WARN", "ERROR"}},
	} {
		fs := newFlagSet("t", "t", io.Discard)
		lf := addLogFlags(fs)
		if _, _, ok := parseArgs(fs, tc.args, io.Discard); !ok {
			t.Fatalf("%q: parse failed", tc.args)
		}
		var c flagCheck
		if lf.check(&c); len(c.problems) > 0 {
			t.Fatalf("%q: %v", tc.args, c.problems)
		}
		var buf bytes.Buffer
		log := lf.logger(&buf)
		log.Debug("d")
		log.Info("i")
		log.Warn("w")
		log.Error("e")
		var levels []string
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if tc.json {
				var rec struct{ Level string }
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("%q: not JSON: %q", tc.args, line)
				}
				levels = append(levels, rec.Level)
			} else if _, after, ok := strings.Cut(line, "level="); ok {
				levels = append(levels, strings.Fields(after)[0])
			}
		}
		if strings.Join(levels, ",") != strings.Join(tc.wantLevel, ",") {
			t.Errorf("%q: levels %q, want %q", tc.args, levels, tc.wantLevel)
		}
	}
}

// TestSessionShare: --clients partitions --sessions, every client with at
// least one.
func TestSessionShare(t *testing.T) {
	for _, tc := range [][2]int{{30, 4}, {100, 1}, {4, 4}, {7, 3}, {1_000_000, 1024}} {
		sessions, clients := tc[0], tc[1]
		sum := 0
		for i := range clients {
			n := sessionShare(sessions, clients, i)
			if n < sessions/clients || n > sessions/clients+1 || n < 1 {
				t.Errorf("%d sessions, %d clients: client %d has %d", sessions, clients, i, n)
			}
			sum += n
		}
		if sum != sessions {
			t.Errorf("%d sessions, %d clients: shares sum to %d", sessions, clients, sum)
		}
	}
}

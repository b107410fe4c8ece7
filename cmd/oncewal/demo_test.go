package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestDemoRebuild: with --rebuild a follower joins late, after retention
// dropped the start of the WAL, and another is given a zombie leader's
// diverged batch; both are refused for that reason, rebuilt from the
// leader's snapshot and then verified against the oracle like every other
// follower, and --json says which were rebuilt.
func TestDemoRebuild(t *testing.T) {
	stdout, stderr, code := runCmd(t, "demo", "--followers", "3", "--rebuild", "--events", "3000", "--sessions", "12",
		"--faults", "heavy", "--restarts", "2", "--json")
	if code != 0 {
		t.Fatalf("demo exit %d: %s\n%s", code, stderr, stdout)
	}
	var rep demoReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Verified || len(rep.Followers) != 3 || rep.Promoted == "" {
		t.Fatalf("demo --rebuild: verified %v, %d follower entries, promoted %q:\n%s", rep.Verified, len(rep.Followers), rep.Promoted, stdout)
	}
	var late, diverged []string
	for _, f := range rep.Followers {
		if f.Promoted {
			continue
		}
		if !f.Verified {
			t.Fatalf("follower %s not verified against the oracle: %+v", f.ID, f)
		}
		if f.Late {
			late = append(late, f.ID)
			if !f.Rebuilt || !slices.ContainsFunc(f.Refused, func(r string) bool { return strings.HasSuffix(r, "behind retention") }) {
				t.Fatalf("late joiner %s was not refused behind retention and rebuilt: %+v", f.ID, f)
			}
		}
		if slices.ContainsFunc(f.Refused, func(r string) bool { return strings.HasSuffix(r, "diverged") }) {
			diverged = append(diverged, f.ID)
			if !f.Rebuilt {
				t.Fatalf("diverged follower %s was not rebuilt: %+v", f.ID, f)
			}
		}
		if !f.Rebuilt && len(f.Refused) > 0 {
			t.Fatalf("follower %s refused and not rebuilt: %+v", f.ID, f)
		}
	}
	if len(late) != 1 || len(diverged) != 1 {
		t.Fatalf("late joiners %v, diverged followers %v; want one of each:\n%s", late, diverged, stdout)
	}
	if _, stderr, code := runCmd(t, "demo", "--followers", "2", "--rebuild"); code != 2 || !strings.Contains(stderr, "--rebuild needs --followers >= 3") {
		t.Fatalf("demo --followers 2 --rebuild: exit %d, %s", code, stderr)
	}
}

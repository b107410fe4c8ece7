package follower

import (
	"strings"
	"testing"
)

// TestRemedyTexts: every refusal's remedy reads whole — the follower's ID
// where the text names it, and no formatting residue where it does not
// (found by the nemesis: a stale_epoch remedy ended in %!(EXTRA string=a)).
func TestRemedyTexts(t *testing.T) {
	for _, r := range refusalReasons {
		got := remedy(r.err, "f9")
		if strings.Contains(got, "%!") {
			t.Errorf("%s: remedy %q", r.name, got)
		}
		if strings.Contains(r.remedy, "%[1]s") && !strings.Contains(got, "f9") {
			t.Errorf("%s: remedy %q does not name the follower", r.name, got)
		}
	}
}

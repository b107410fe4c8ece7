package store

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestJournalPlan runs the scripted journal pruning in testdata/journal:
// journal.plan (compact, or which oldest entries go) and the bookkeeping
// of a committed batch (note, committed), without a store or a window.
// Commands:
//
//	journal capacity=N
//	<LSN> <keys> <evicted>
//	    ...the live entries, oldest first: each entry's LSN, key count and
//	    the window's Evictions once its keys were recorded
//	plan keys=N evictions=E
//	    what a batch recording N keys decides, the window's Evictions being E
//	commit lsn=LSN keys=N evictions=E after=E2 [window=W]
//	    a batch at LSN recording N keys commits: planned at E evictions,
//	    E2 once its keys were recorded; W is the window's size (what a
//	    compacted entry holds besides the batch's keys)
//
// plan and commit print the decision; commit and journal then the live
// entries.
func TestJournalPlan(t *testing.T) {
	var j *journal
	var capacity int
	datadriven.RunTest(t, "testdata/journal", func(t *testing.T, td *datadriven.TestData) string {
		switch td.Cmd {
		case "journal":
			j = &journal{}
			td.ScanArgs(t, "capacity", &capacity)
			for _, line := range strings.Split(td.Input, "\n") {
				if strings.TrimSpace(line) == "" {
					continue
				}
				var e journalEntry
				if _, err := fmt.Sscan(line, &e.lsn, &e.n, &e.evicted); err != nil {
					t.Fatalf("%s: entry %q: %v", td.Pos, line, err)
				}
				j.entries = append(j.entries, e)
				j.total += e.n
			}
			return j.String()
		case "plan", "commit":
			var keys, window int
			var lsn, evictions, after uint64
			td.ScanArgs(t, "keys", &keys)
			td.ScanArgs(t, "evictions", &evictions)
			p := j.plan(keys, evictions, capacity)
			out := p.String(j)
			if td.Cmd == "plan" {
				return out
			}
			td.ScanArgs(t, "lsn", &lsn)
			td.ScanArgs(t, "after", &after)
			td.MaybeScanArgs(t, "window", &window)
			n := keys
			if p.compact {
				n += window
			}
			j.note(p, lsn, n)
			j.committed(after)
			return out + j.String()
		}
		t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
		return ""
	})
}

// String describes p's decision over j's live entries.
func (p journalPlan) String(j *journal) string {
	switch {
	case p.compact:
		return "compact: one entry, the window and the batch's keys, replaces every live entry\n"
	case p.prune == 0:
		return "prune nothing\n"
	}
	var lsns []string
	for _, e := range j.entries[j.head : j.head+p.prune] {
		lsns = append(lsns, fmt.Sprint(e.lsn))
	}
	return fmt.Sprintf("prune LSN %s\n", strings.Join(lsns, ", "))
}

// String lists j's live entries and key count.
func (j *journal) String() string {
	var b strings.Builder
	for _, e := range j.entries[j.head:] {
		fmt.Fprintf(&b, "entry LSN %d: %d keys, evicted %d\n", e.lsn, e.n, e.evicted)
	}
	fmt.Fprintf(&b, "%d keys\n", j.total)
	return b.String()
}

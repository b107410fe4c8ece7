package session

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestGCPass runs the scripted garbage collections in testdata/gc: which
// sessions' HWMs one CollectGarbage pass collects on the WAL clock
// (gcPass), from the sessions as it looks at them. Commands:
//
//	gc clock=HOURS horizon=DURATION [limit=N]
//	row NAME [last=HOURS] [closed]
//	logged NAME last=HOURS [own=HOURS|own=gone]
//	    ...the HWM rows from the cursor on, in key order, in the state the
//	    tx sees (no last: the tx itself collected it); then the logged
//	    sessions, oldest change first, with this tx's own view of one when
//	    it changed it (own=gone: collected). Times are hours on the WAL
//	    clock; limit defaults to 0 (no limit).
//
// gc prints each session's fate: collect, keep, left for the next pass
// (rows past the limit), or the walk's stop.
func TestGCPass(t *testing.T) {
	datadriven.RunTest(t, "testdata/gc", func(t *testing.T, td *datadriven.TestData) string {
		if td.Cmd != "gc" {
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
		}
		var clock int64
		var horizon string
		g := gcPass{}
		td.ScanArgs(t, "clock", &clock)
		td.ScanArgs(t, "horizon", &horizon)
		td.MaybeScanArgs(t, "limit", &g.limit)
		h, err := time.ParseDuration(horizon)
		if err != nil {
			t.Fatal(err)
		}
		g.cutoff = Cutoff(clock*int64(time.Hour), h)
		var out strings.Builder
		rowsDone, walkDone := false, false
		for _, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				t.Fatalf("%s: line %q", td.Pos, line)
			}
			state, own, hasOwn := gcScriptArgs(t, f[2:])
			fmt.Fprintf(&out, "%s %s: ", f[0], f[1])
			switch {
			case f[0] == "row" && rowsDone, f[0] == "row" && g.rowsDone():
				rowsDone = true
				out.WriteString("left for the next pass\n")
			case f[0] == "row":
				out.WriteString(gcFate(g.row(state)))
			case f[0] == "logged" && walkDone:
				out.WriteString("not walked\n")
			case f[0] == "logged":
				collect, more := g.logged(state, own, hasOwn)
				if walkDone = !more; walkDone {
					out.WriteString("stop\n")
					continue
				}
				out.WriteString(gcFate(collect))
			default:
				t.Fatalf("%s: line %q", td.Pos, line)
			}
		}
		return out.String()
	})
}

func gcFate(collect bool) string {
	if collect {
		return "collect\n"
	}
	return "keep\n"
}

// gcScriptArgs reads a session line's state (last=, closed) and own view.
func gcScriptArgs(t *testing.T, args []string) (state, own HWM, hasOwn bool) {
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		switch k {
		case "last":
			state = HWM{Seq: 1, LastTS: gcHours(t, v), Known: true}
		case "closed":
			state.Closed = true
		case "own":
			hasOwn = true
			if v != "gone" {
				own = HWM{Seq: 2, LastTS: gcHours(t, v), Known: true}
			}
		default:
			t.Fatalf("unknown argument %q", a)
		}
	}
	return state, own, hasOwn
}

func gcHours(t *testing.T, v string) int64 {
	var h int64
	if _, err := fmt.Sscan(v, &h); err != nil {
		t.Fatalf("hours %q: %v", v, err)
	}
	return h * int64(time.Hour)
}

package leader

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestPlanRetention runs the scripted retention passes in
// testdata/retention: planRetention over the slots, the local store's
// position and the log's segments, the plan out. Commands:
//
//	segments
//	<first LSN> <size>
//	    ...the log's segments in LSN order (the last one is being written),
//	    for the plans that follow
//	plan local=LSN [max=BYTES]
//	<slot ID> <acked LSN> [dropped]
//	    ...the slots; max is the retention bound (default 0: none)
func TestPlanRetention(t *testing.T) {
	datadriven.Walk(t, "testdata/retention", func(t *testing.T, path string) {
		var segs []wal.SegmentInfo
		datadriven.RunTest(t, path, func(t *testing.T, td *datadriven.TestData) string {
			switch td.Cmd {
			case "segments":
				segs = nil
				for _, f := range scriptLines(t, td) {
					var s wal.SegmentInfo
					if _, err := fmt.Sscan(strings.Join(f, " "), &s.FirstLSN, &s.Size); err != nil {
						t.Fatalf("%s: segment %q: %v", td.Pos, f, err)
					}
					segs = append(segs, s)
				}
				return ""
			case "plan":
				var local uint64
				var maxBytes int64
				td.ScanArgs(t, "local", &local)
				td.MaybeScanArgs(t, "max", &maxBytes)
				var slots []slot
				for _, f := range scriptLines(t, td) {
					s := slot{ID: f[0], Dropped: len(f) == 3 && f[2] == "dropped"}
					if _, err := fmt.Sscan(f[1], &s.Acked); err != nil || len(f) > 3 || (len(f) == 3 && !s.Dropped) {
						t.Fatalf("%s: slot %q: want ID ACKED [dropped]", td.Pos, f)
					}
					slots = append(slots, s)
				}
				p := planRetention(slots, local, segs, maxBytes)
				out := fmt.Sprintf("delete below %d, retain %d bytes\n", p.DeleteBelow, p.Retained)
				if len(p.Drop) > 0 {
					out += fmt.Sprintf("drop %s\n", strings.Join(p.Drop, ", "))
				}
				return out
			}
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
			return ""
		})
	})
}

// scriptLines splits a command's input into its non-empty lines' fields.
func scriptLines(t *testing.T, td *datadriven.TestData) [][]string {
	var lines [][]string
	for _, line := range strings.Split(td.Input, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			lines = append(lines, f)
		}
	}
	return lines
}

func TestSlotCodec(t *testing.T) {
	for _, s := range []slot{{"f1", 0, false}, {"f-2.x", 1<<64 - 1, true}} {
		got, err := decodeSlot(s.ID, encodeSlot(s))
		require.NoError(t, err)
		require.Equal(t, s, got)
	}
	for _, bad := range [][]byte{nil, {1}, {2, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {1, 2, 0, 0, 0, 0, 0, 0, 0, 0}} {
		_, err := decodeSlot("x", bad)
		require.ErrorIs(t, err, errBadSlot)
		require.ErrorIs(t, err, corruption.Err)
	}
}

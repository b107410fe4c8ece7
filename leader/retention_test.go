package leader

import (
	"testing"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

func TestPlanRetention(t *testing.T) {
	// Four segments of 100 bytes: LSNs 1-10, 11-20, 21-30, 31-(active).
	segs := []wal.SegmentInfo{{FirstLSN: 1, Size: 100}, {FirstLSN: 11, Size: 100}, {FirstLSN: 21, Size: 100}, {FirstLSN: 31, Size: 100}}
	for _, tc := range []struct {
		name     string
		slots    []slot
		local    uint64
		maxBytes int64
		want     retentionPlan
	}{
		{"no followers: the local store alone pins", nil, 35, 0,
			retentionPlan{DeleteBelow: 35, Retained: 100}},
		{"lowest slot pins", []slot{{"a", 25, false}, {"b", 12, false}}, 35, 0,
			retentionPlan{DeleteBelow: 12, Retained: 300}},
		{"the segment holding a slot's last batch is kept", []slot{{"a", 20, false}}, 35, 0,
			retentionPlan{DeleteBelow: 20, Retained: 300}},
		{"and the one before it goes", []slot{{"a", 21, false}}, 35, 0,
			retentionPlan{DeleteBelow: 21, Retained: 200}},
		{"local store behind every slot pins", []slot{{"a", 30, false}}, 5, 0,
			retentionPlan{DeleteBelow: 5, Retained: 400}},
		{"dropped slot does not pin", []slot{{"a", 3, true}, {"b", 30, false}}, 35, 0,
			retentionPlan{DeleteBelow: 30, Retained: 200}},
		{"bound drops the laggard", []slot{{"dead", 2, false}, {"b", 22, false}}, 35, 250,
			retentionPlan{DeleteBelow: 22, Drop: []string{"dead"}, Retained: 200}},
		{"bound drops several", []slot{{"x", 2, false}, {"y", 12, false}, {"z", 33, false}}, 35, 150,
			retentionPlan{DeleteBelow: 33, Drop: []string{"x", "y"}, Retained: 100}},
		{"bound never drops a slot at the local position", []slot{{"a", 2, false}}, 2, 150,
			retentionPlan{DeleteBelow: 2, Retained: 400}},
		{"within the bound nothing is dropped", []slot{{"a", 2, false}}, 35, 400,
			retentionPlan{DeleteBelow: 2, Retained: 400}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, planRetention(tc.slots, tc.local, segs, tc.maxBytes))
		})
	}
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

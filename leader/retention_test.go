package leader

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPlanRetention(t *testing.T) {
	// Four segments of 100 bytes: LSNs 1-10, 11-20, 21-30, 31-(active).
	segs := []segment{{1, 100}, {11, 100}, {21, 100}, {31, 100}}
	for _, tc := range []struct {
		name     string
		slots    []slot
		local    uint64
		maxBytes int64
		want     retentionPlan
	}{
		{"no followers: the local store alone pins", nil, 35, 0,
			retentionPlan{DeleteBelow: 36, Retained: 100}},
		{"lowest slot pins", []slot{{"a", 25, false}, {"b", 12, false}}, 35, 0,
			retentionPlan{DeleteBelow: 13, Retained: 300}},
		{"a slot at a segment's last LSN frees it", []slot{{"a", 20, false}}, 35, 0,
			retentionPlan{DeleteBelow: 21, Retained: 200}},
		{"local store behind every slot pins", []slot{{"a", 30, false}}, 5, 0,
			retentionPlan{DeleteBelow: 6, Retained: 400}},
		{"dropped slot does not pin", []slot{{"a", 3, true}, {"b", 30, false}}, 35, 0,
			retentionPlan{DeleteBelow: 31, Retained: 100}},
		{"bound drops the laggard", []slot{{"dead", 2, false}, {"b", 22, false}}, 35, 250,
			retentionPlan{DeleteBelow: 23, Drop: []string{"dead"}, Retained: 200}},
		{"bound drops several", []slot{{"x", 2, false}, {"y", 12, false}, {"z", 33, false}}, 35, 150,
			retentionPlan{DeleteBelow: 34, Drop: []string{"x", "y"}, Retained: 100}},
		{"bound never drops a slot at the local position", []slot{{"a", 2, false}}, 2, 150,
			retentionPlan{DeleteBelow: 3, Retained: 400}},
		{"within the bound nothing is dropped", []slot{{"a", 2, false}}, 35, 400,
			retentionPlan{DeleteBelow: 3, Retained: 400}},
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
	}
}

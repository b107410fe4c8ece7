package leader_test

import (
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"

	"github.com/stretchr/testify/require"
)

func requireNamesAll(t *testing.T, err error, sentinel error, fields []string) {
	t.Helper()
	require.ErrorIs(t, err, sentinel)
	for _, f := range fields {
		require.True(t, strings.Contains(err.Error(), f), "%v does not name %s", err, f)
	}
}

func TestShipperOptionsValidate(t *testing.T) {
	lis := inprocess.New(inprocess.FaultsNone, 1)
	for _, tc := range []struct {
		name string
		o    leader.FanoutOptions
		bad  []string
	}{
		{"zero is the defaults", leader.FanoutOptions{ShipperOptions: leader.ShipperOptions{Listener: lis, WALDir: "w"}}, nil},
		{"required", leader.FanoutOptions{}, []string{"Listener", "WALDir"}},
		{"negatives refused, not defaulted", leader.FanoutOptions{ShipperOptions: leader.ShipperOptions{
			Listener: lis, WALDir: "w", MaxInFlight: -1, RetransmitTimeout: -time.Second, MaxBackoff: -1, PollInterval: -1}},
			[]string{"MaxInFlight", "RetransmitTimeout", "MaxBackoff", "PollInterval"}},
		{"followers", leader.FanoutOptions{ShipperOptions: leader.ShipperOptions{Listener: lis, WALDir: "w"},
			Followers: []string{"a", "a", ""}}, []string{`"a" listed twice`, "empty"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.bad == nil {
				require.NoError(t, err)
				require.NoError(t, tc.o.ShipperOptions.Validate())
				return
			}
			requireNamesAll(t, err, leader.ErrBadOptions, tc.bad)
			_, err = leader.NewFanout(&tc.o)
			require.ErrorIs(t, err, leader.ErrBadOptions)
		})
	}
}

// TestPromoteOptionsValidate: Promote refuses unusable options with
// ErrBadOptions, every problem named, before it looks at the store.
func TestPromoteOptionsValidate(t *testing.T) {
	o := leader.PromoteOptions{SegmentSize: -1, Epoch: replication.MaxEpoch + 1,
		Ledger: idempotency.LedgerOptions{TTL: -time.Second}}
	_, err := leader.Promote(nil, o)
	requireNamesAll(t, err, leader.ErrBadOptions, []string{"WALDir", "SegmentSize", "Epoch", "Ledger", "TTL"})
	require.ErrorIs(t, err, replication.ErrEpochExhausted)
	require.ErrorIs(t, err, idempotency.ErrBadOptions)
	require.NoError(t, (&leader.PromoteOptions{WALDir: "w"}).EnsureDefaults().Validate())
}

func TestLedgerLogOptionsValidate(t *testing.T) {
	err := (&leader.LedgerLogOptions{SegmentSize: -1}).Validate()
	requireNamesAll(t, err, leader.ErrBadOptions,
		[]string{"WALDir", "DB", "Tracker", "Window", "Table", "State or Applier", "SegmentSize"})
	_, err = leader.OpenLedgerLog(nil)
	require.ErrorIs(t, err, leader.ErrBadOptions)
	_, err = leader.OpenLedgerLog(&leader.LedgerLogOptions{WALDir: t.TempDir()})
	require.ErrorIs(t, err, leader.ErrBadOptions)
}

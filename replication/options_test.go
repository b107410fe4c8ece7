package replication_test

import (
	"strings"
	"testing"
	"time"

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
	lis := replication.NewInProcess(replication.FaultsNone, 1)
	for _, tc := range []struct {
		name string
		o    replication.FanoutOptions
		bad  []string
	}{
		{"zero is the defaults", replication.FanoutOptions{ShipperOptions: replication.ShipperOptions{Listener: lis, WALDir: "w"}}, nil},
		{"required", replication.FanoutOptions{}, []string{"Listener", "WALDir"}},
		{"negatives refused, not defaulted", replication.FanoutOptions{ShipperOptions: replication.ShipperOptions{
			Listener: lis, WALDir: "w", MaxInFlight: -1, RetransmitTimeout: -time.Second, MaxBackoff: -1, PollInterval: -1}},
			[]string{"MaxInFlight", "RetransmitTimeout", "MaxBackoff", "PollInterval"}},
		{"followers", replication.FanoutOptions{ShipperOptions: replication.ShipperOptions{Listener: lis, WALDir: "w"},
			Followers: []string{"a", "a", ""}}, []string{`"a" listed twice`, "empty"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.bad == nil {
				require.NoError(t, err)
				require.NoError(t, tc.o.ShipperOptions.Validate())
				return
			}
			requireNamesAll(t, err, replication.ErrBadShipperOptions, tc.bad)
			_, err = replication.NewFanout(&tc.o)
			require.ErrorIs(t, err, replication.ErrBadShipperOptions)
		})
	}
}

func TestLedgerLogOptionsValidate(t *testing.T) {
	err := (&replication.LedgerLogOptions{SegmentSize: -1}).Validate()
	requireNamesAll(t, err, replication.ErrBadLedgerLogOptions,
		[]string{"WALDir", "DB", "Tracker", "Window", "Table", "State or Applier", "SegmentSize"})
	_, err = replication.OpenLedgerLog(nil)
	require.ErrorIs(t, err, replication.ErrBadLedgerLogOptions)
	_, err = replication.OpenLedgerLog(&replication.LedgerLogOptions{WALDir: t.TempDir()})
	require.ErrorIs(t, err, replication.ErrBadLedgerLogOptions)
}

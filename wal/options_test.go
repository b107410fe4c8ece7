package wal_test

import (
	"strings"
	"testing"

	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

func TestWriterOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    wal.WriterOptions
		bad  []string
	}{
		{"zero is the defaults", wal.WriterOptions{}, nil},
		{"manual sync", wal.WriterOptions{Sync: wal.SyncManual, SegmentSize: 1 << 10}, nil},
		{"negative segment", wal.WriterOptions{SegmentSize: -1}, []string{"SegmentSize"}},
		{"all at once", wal.WriterOptions{SegmentSize: -1, Sync: 9}, []string{"SegmentSize", "Sync"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			err := o.EnsureDefaults().Validate()
			if tc.bad == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, wal.ErrBadOptions)
			for _, f := range tc.bad {
				require.True(t, strings.Contains(err.Error(), f), "%v does not name %s", err, f)
			}
			dir := t.TempDir()
			_, err = wal.OpenWriter(dir, &tc.o)
			require.ErrorIs(t, err, wal.ErrBadOptions)
		})
	}
}

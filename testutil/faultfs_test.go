package testutil_test

import (
	"errors"
	"io"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// writeFiles creates /a, writes and syncs it and its directory, then
// creates /b and writes it unsynced: 7 operations (create, write, sync,
// open and sync the directory, create, write; errorfs does not see
// closes), and returns the first error.
func writeFiles(fs vfs.FS) error {
	for _, name := range []string{"/a", "/b"} {
		f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
		if err != nil {
			return err
		}
		if _, err := f.Write([]byte(name)); err != nil {
			return err
		}
		if name == "/a" {
			if err := f.Sync(); err != nil {
				return err
			}
			d, err := fs.OpenDir("/")
			if err != nil {
				return err
			}
			if err := d.Sync(); err != nil {
				return err
			}
			_ = d.Close()
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

func readFile(t *testing.T, fs vfs.FS, name string) string {
	t.Helper()
	f, err := fs.Open(name)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	require.NoError(t, err)
	return string(b)
}

func TestFailNth(t *testing.T) {
	for _, tc := range []struct {
		name       string
		n          int64
		match      func(errorfs.Op) bool
		wantSeen   int64
		wantFailed bool
	}{
		{"every op, the 2nd", 1, nil, 2, true},
		{"creates only, the 2nd", 1, testutil.OpKinds(errorfs.OpCreate), 2, true},
		{"mutations, past the last", 9, testutil.Mutations, 6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inj := &testutil.FailNth{N: tc.n, Match: tc.match}
			err := writeFiles(errorfs.Wrap(vfs.NewMem(), inj))
			require.Equal(t, tc.wantFailed, err != nil, "%v", err)
			require.Equal(t, tc.wantFailed, inj.Fired())
			if tc.wantFailed {
				require.ErrorIs(t, err, errorfs.ErrInjected)
			}
			require.Equal(t, tc.wantSeen, inj.Seen(), "it stops counting where the workload stops")
		})
	}
	// Once only, and only while on.
	inj := &errorfs.Toggle{Injector: &testutil.FailNth{N: 0, Match: testutil.OpKinds(errorfs.OpCreate)}}
	fs := errorfs.Wrap(vfs.NewMem(), inj)
	require.NoError(t, writeFiles(fs), "off: nothing fails")
	inj.On()
	require.ErrorIs(t, writeFiles(fs), errorfs.ErrInjected)
	require.NoError(t, writeFiles(fs), "it fails once")
}

func TestCrashFS(t *testing.T) {
	// A probe counts the crash points.
	probe := testutil.NewCrashFS(vfs.NewCrashableMem(), testutil.CrashOptions{At: -1})
	require.NoError(t, writeFiles(probe))
	require.Nil(t, probe.Image())
	require.Equal(t, 7, probe.Counted())

	// Crash before the second create: /a synced, /b not there.
	c := testutil.NewCrashFS(vfs.NewCrashableMem(), testutil.CrashOptions{At: 1, Count: testutil.OpKinds(errorfs.OpCreate)})
	require.ErrorIs(t, writeFiles(c), testutil.ErrCrash)
	img := c.Image()
	require.NotNil(t, img)
	require.Equal(t, "/a", readFile(t, img, "/a"))
	require.Contains(t, readFile(t, img, "/b"), "file does not exist")
	_, err := c.Stat("/a")
	require.ErrorIs(t, err, testutil.ErrCrash, "a dead process does nothing more, counted or not")

	// Crash before the last write, keeping none of the unsynced data: /b is
	// gone; Continue lets the workload finish; OnCrash sees the crash once.
	crashes := 0
	c = testutil.NewCrashFS(vfs.NewCrashableMem(), testutil.CrashOptions{At: 6, Continue: true, OnCrash: func() { crashes++ }})
	require.NoError(t, writeFiles(c))
	require.Equal(t, 1, crashes)
	require.Equal(t, "/b", readFile(t, c, "/b"), "the live filesystem has it")
	require.Contains(t, readFile(t, c.Image(), "/b"), "file does not exist", "the crash lost the unsynced file")

	// Disarmed: the setup before Arm does not count.
	c = testutil.NewCrashFS(vfs.NewCrashableMem(), testutil.CrashOptions{At: 0, Disarmed: true})
	require.NoError(t, writeFiles(c))
	require.Nil(t, c.Image())
	c.Arm()
	_, err = c.Stat("/a")
	require.True(t, errors.Is(err, testutil.ErrCrash))
	require.Equal(t, "/a", readFile(t, c.Image(), "/a"))
}

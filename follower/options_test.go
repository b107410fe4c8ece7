package follower_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/stretchr/testify/require"
)

// TestNodeOptionsValidate: a negative ReopenBackoff is refused (it used to
// become the default silently, so OpenNode's check never fired), together
// with the template's problems, in one error.
func TestNodeOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    follower.NodeOptions
		bad  []string
	}{
		{"zero is the defaults", follower.NodeOptions{}, nil},
		{"negative backoff", follower.NodeOptions{ReopenBackoff: -time.Millisecond}, []string{"ReopenBackoff"}},
		{"all at once", follower.NodeOptions{ReopenBackoff: -1,
			Follower: follower.Options{Store: store.Options{WindowCapacity: -1, RetentionHorizon: -time.Hour}}},
			[]string{"ReopenBackoff", "WindowCapacity", "RetentionHorizon"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			err := o.EnsureDefaults().Validate()
			if tc.bad == nil {
				require.NoError(t, err)
				require.Equal(t, follower.DefaultReopenBackoff, o.ReopenBackoff)
				return
			}
			require.Error(t, err)
			for _, f := range tc.bad {
				require.True(t, strings.Contains(err.Error(), f), "%v does not name %s", err, f)
			}
			dir := t.TempDir()
			_, err = follower.OpenNode(dir, []uint32{0}, &tc.o)
			require.ErrorIs(t, err, follower.ErrBadOptions)
		})
	}
}

// TestMemTableSize: the store's memtable is Options.Store.MemTableSize (default
// DefaultMemTableSize), as Pebble records it in the store's OPTIONS file;
// PebbleOptions still has the last word (the simulations and crash tests
// shrink it to exercise flushes); sizes Pebble cannot take are refused.
func TestMemTableSize(t *testing.T) {
	recordedAs := func(t *testing.T, o follower.Options, key string) string {
		fs := vfs.NewMem()
		o.Store.FS, o.Store.Logger = fs, slog.New(slog.DiscardHandler)
		f, err := follower.Open("store", &o)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		names, err := fs.List("store")
		require.NoError(t, err)
		for _, n := range names {
			if !strings.HasPrefix(n, "OPTIONS-") {
				continue
			}
			file, err := fs.Open(fs.PathJoin("store", n))
			require.NoError(t, err)
			b, err := io.ReadAll(file)
			require.NoError(t, err)
			require.NoError(t, file.Close())
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+"="); ok {
					return v
				}
			}
		}
		t.Fatalf("no %s in the store's OPTIONS file", key)
		return ""
	}
	recorded := func(t *testing.T, o follower.Options) string { return recordedAs(t, o, "mem_table_size") }
	require.Equal(t, fmt.Sprint(store.DefaultMemTableSize), recorded(t, follower.Options{}))
	require.Equal(t, fmt.Sprint(8<<20), recorded(t, follower.Options{Store: store.Options{MemTableSize: 8 << 20}}))
	require.Equal(t, fmt.Sprint(256<<10), recorded(t, follower.Options{Store: store.Options{MemTableSize: 8 << 20, PebbleOptions: func(o *pebble.Options) { o.MemTableSize = 256 << 10 }}}))
	// Pebble charges memtables to the block cache: the cache holds two of
	// them on top of 8 MiB of blocks, unless PebbleOptions sizes it.
	require.Equal(t, fmt.Sprint(8<<20+2*store.DefaultMemTableSize), recordedAs(t, follower.Options{}, "cache_size"))
	require.Equal(t, fmt.Sprint(8<<20+2*(256<<10)), recordedAs(t, follower.Options{Store: store.Options{PebbleOptions: func(o *pebble.Options) { o.MemTableSize = 256 << 10 }}}, "cache_size"))
	require.Equal(t, fmt.Sprint(1<<20), recordedAs(t, follower.Options{Store: store.Options{PebbleOptions: func(o *pebble.Options) { o.CacheSize = 1 << 20 }}}, "cache_size"))

	for _, bad := range []int64{-1, store.MinMemTableSize - 1, store.MaxMemTableSize + 1} {
		err := (&follower.Options{Store: store.Options{MemTableSize: bad}}).EnsureDefaults().Validate()
		require.ErrorContains(t, err, "MemTableSize", "MemTableSize %d", bad)
	}
	require.NoError(t, (&follower.Options{Store: store.Options{MemTableSize: store.MinMemTableSize}}).EnsureDefaults().Validate())
}

// TestBadOptionsSentinels: every constructor refuses unusable options at
// start with its package's ErrBadOptions, and a follower's refusal of its
// store's fields is store.ErrBadOptions too; nothing is created on disk.
func TestBadOptionsSentinels(t *testing.T) {
	badStore := store.Options{WindowCapacity: -1}
	for _, tc := range []struct {
		name  string
		open  func(dir string) error
		wants []error
	}{
		{"store.Open", func(dir string) error { _, err := store.Open(dir, &badStore); return err }, []error{store.ErrBadOptions}},
		{"follower.Open", func(dir string) error {
			_, err := follower.Open(dir, &follower.Options{Store: badStore, ReconnectJitter: 2})
			return err
		}, []error{follower.ErrBadOptions, store.ErrBadOptions}},
		{"follower.OpenNode", func(dir string) error {
			_, err := follower.OpenNode(dir, []uint32{0}, &follower.NodeOptions{Follower: follower.Options{Store: badStore}})
			return err
		}, []error{follower.ErrBadOptions, store.ErrBadOptions}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			err := tc.open(dir)
			for _, want := range tc.wants {
				require.ErrorIs(t, err, want)
			}
			require.ErrorContains(t, err, "WindowCapacity")
			_, statErr := os.Stat(dir)
			require.ErrorIs(t, statErr, os.ErrNotExist, "a refused open created the directory")
		})
	}
}

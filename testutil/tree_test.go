package testutil_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/testutil"
	"github.com/stretchr/testify/require"
)

// TestCopyDirAndDirImage: a copied tree has the same files, bytes and
// permissions; DirImage sees a changed byte, a new file and a file in a
// subdirectory, on the disk and on a MemFS.
func TestCopyDirAndDirImage(t *testing.T) {
	src := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(src, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(src, "a"), []byte("a"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(src, "sub", "b"), []byte("b"), 0o644))
	want := map[string]string{"a": "a", "sub/b": "b"}
	require.Equal(t, want, testutil.DirImage(t, vfs.Default, src))

	dst := testutil.TempCopy(t, src)
	require.Equal(t, want, testutil.DirImage(t, vfs.Default, dst))
	st, err := os.Stat(filepath.Join(dst, "a"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	require.NoError(t, os.WriteFile(filepath.Join(dst, "sub", "b"), []byte("B"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dst, "c"), nil, 0o644))
	require.Equal(t, map[string]string{"a": "a", "sub/b": "B", "c": ""}, testutil.DirImage(t, vfs.Default, dst))

	mem := vfs.NewMem()
	require.NoError(t, mem.MkdirAll("/d/sub", 0o755))
	f, err := mem.Create("/d/sub/x", vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	_, err = f.Write([]byte("x"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.Equal(t, map[string]string{"sub/x": "x"}, testutil.DirImage(t, mem, "/d"))
}

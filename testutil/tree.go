package testutil

import (
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TreeDigest maps every file and directory under dir to a digest of its
// content, mode and modification time, so that a test can assert a refused
// operation left a directory exactly as it was.
func TreeDigest(t testing.TB, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if e.IsDir() {
			m[rel] = "dir " + info.Mode().String()
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		m[rel] = fmt.Sprintf("%x %s %d", sha256.Sum256(b), info.Mode(), info.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TreeState is TreeDigest, except that a Pebble LOCK file counts only by
// its presence: a read-only check of a store (store.PeekStore, Open's
// identity check) locks an existing LOCK, and vfs.Default's Lock truncates
// the empty file, which moves its mtime — the one trace such a check
// leaves.
func TreeState(t testing.TB, dir string) map[string]string {
	t.Helper()
	d := TreeDigest(t, dir)
	for name := range d {
		if filepath.Base(name) == "LOCK" {
			d[name] = "present"
		}
	}
	return d
}

// CopyDir copies the tree under src to dst (made if missing), files with
// their permission bits, as an operator copies a stopped store or node
// directory (cp -r).
func CopyDir(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, info.Mode().Perm())
	})
	if err != nil {
		t.Fatalf("copying %s to %s: %v", src, dst, err)
	}
}

// TempCopy is CopyDir of src into a new t.TempDir, which it returns: a
// fresh copy of a fixture for each case to damage.
func TempCopy(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	CopyDir(t, src, dst)
	return dst
}

// DirImage maps every file under dir on fs (recursively; paths relative to
// dir, joined by "/") to its bytes: what a test compares to prove a refused
// operation left the files as they were, on a MemFS or vfs.Default alike.
func DirImage(t testing.TB, fs vfs.FS, dir string) map[string]string {
	t.Helper()
	img := map[string]string{}
	var walk func(dir, prefix string)
	walk = func(dir, prefix string) {
		names, err := fs.List(dir)
		if err != nil {
			t.Fatalf("listing %s: %v", dir, err)
		}
		for _, n := range names {
			p := fs.PathJoin(dir, n)
			st, err := fs.Stat(p)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if st.IsDir() {
				walk(p, prefix+n+"/")
				continue
			}
			f, err := fs.Open(p)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			b, err := io.ReadAll(f)
			_ = f.Close()
			if err != nil {
				t.Fatalf("reading %s: %v", p, err)
			}
			img[prefix+n] = string(b)
		}
	}
	walk(dir, "")
	return img
}

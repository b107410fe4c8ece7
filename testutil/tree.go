package testutil

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
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
// its presence: a read-only check of a store (follower.PeekStore, Open's
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

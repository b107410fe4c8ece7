package testutil

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// parseProductFiles parses every non-test .go file under root (hidden and
// testdata directories skipped) with mode and hands each to fn: what the
// module's structure tests read.
func parseProductFiles(t *testing.T, root string, mode parser.Mode, fn func(path string, f *ast.File) error) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, mode)
		if err != nil {
			return err
		}
		return fn(p, f)
	})
	if err != nil {
		t.Fatal(err)
	}
}

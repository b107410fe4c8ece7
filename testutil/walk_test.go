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

// walkGoFiles calls fn with the path of every .go file under root, skipping
// hidden and testdata directories: the files the module's go/ast checks read.
func walkGoFiles(root string, fn func(path string) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		return fn(p)
	})
}

// parseProductFiles parses every non-test .go file under root with mode and
// hands each to fn: what the module's structure tests read.
func parseProductFiles(t *testing.T, root string, mode parser.Mode, fn func(path string, f *ast.File) error) {
	t.Helper()
	err := walkGoFiles(root, func(p string) error {
		if strings.HasSuffix(p, "_test.go") {
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

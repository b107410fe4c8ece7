package testutil

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOnlyTestsImport: no file of the module but a _test.go file imports
// testutil, so that no product code (the CLI above all) links test helpers.
func TestOnlyTestsImport(t *testing.T) {
	for p, imps := range packageImports(t, "..") {
		for _, imp := range imps {
			if imp == "testutil" {
				t.Errorf("%s imports testutil; only _test.go files may", p)
			}
		}
	}
}

// TestTestutilImportsOnlyLeaves: testutil imports, of this module, only the
// leaf packages listed here (they import nothing of the module). A package's
// internal tests cannot import a testutil that imports that package, so a
// helper that needs, say, wal belongs in wal's tests, not here.
func TestTestutilImportsOnlyLeaves(t *testing.T) {
	const module = "github.com/oncewal/oncewal/"
	leaves := map[string]bool{module + "eventid": true, module + "internal/pki": true}
	for leaf := range leaves {
		for _, v := range moduleImports(t, module, filepath.Join("..", strings.TrimPrefix(leaf, module))) {
			t.Errorf("%s imports %s: it is no leaf", leaf, v)
		}
	}
	for _, v := range moduleImports(t, module, ".") {
		if !leaves[v] {
			t.Errorf("testutil imports %s: the internal tests of %s could no longer use testutil", v, strings.TrimPrefix(v, module))
		}
	}
}

// moduleImports is what the non-test files of dir import from the module.
func moduleImports(t *testing.T, module, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	var out []string
	for _, p := range files {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if v, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(v, module) {
				out = append(out, v)
			}
		}
	}
	return out
}

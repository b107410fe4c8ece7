package testutil

import (
	"go/ast"
	"go/parser"
	"strconv"
	"testing"
)

// TestOnlyTestsImport: no file of the module but a _test.go file imports
// testutil, so that no product code (the CLI above all) links test helpers.
func TestOnlyTestsImport(t *testing.T) {
	const path = "github.com/oncewal/oncewal/testutil"
	root := ".."
	checked := 0
	parseProductFiles(t, root, parser.ImportsOnly, func(p string, f *ast.File) error {
		checked++
		for _, imp := range f.Imports {
			if v, _ := strconv.Unquote(imp.Path.Value); v == path {
				t.Errorf("%s imports testutil; only _test.go files may", p)
			}
		}
		return nil
	})
	if checked < 50 {
		t.Fatalf("checked only %d files: wrong root?", checked)
	}
}

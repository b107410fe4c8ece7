package testutil

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// testOnly are the module's packages of test code: only _test.go files
// import them, so that no product code (the CLI above all) links test
// helpers. internal/etcdtest is TestEtcdServerOnlyInTests'.
var testOnly = []string{"testutil", "internal/clienthistory"}

// TestOnlyTestsImport: no file of the module but a _test.go file imports
// a package of testOnly.
func TestOnlyTestsImport(t *testing.T) {
	for p, imps := range moduleImports(t, "..") {
		for _, imp := range imps {
			if slices.Contains(testOnly, imp) {
				t.Errorf("%s imports %s; only _test.go files may", p, imp)
			}
		}
	}
}

// TestEtcdServerOnlyInTests: the library and the CLI link etcd's client
// only. No non-test file imports go.etcd.io/etcd/server but
// internal/etcdtest (a real etcd for tests), and no non-test file imports
// internal/etcdtest.
func TestEtcdServerOnlyInTests(t *testing.T) {
	const helper = "internal/etcdtest"
	seen := false
	parseProductFiles(t, "..", parser.ImportsOnly, func(p string, f *ast.File) error {
		dir := filepath.ToSlash(filepath.Dir(p))
		for _, imp := range f.Imports {
			v, _ := strconv.Unquote(imp.Path.Value)
			switch {
			case strings.HasPrefix(v, "go.etcd.io/etcd/server/") && strings.HasSuffix(dir, "/"+helper):
				seen = true
			case strings.HasPrefix(v, "go.etcd.io/etcd/server/"):
				t.Errorf("%s imports %s: only tests may run an etcd server (use %s)", p, v, helper)
			case v == module+helper:
				t.Errorf("%s imports %s; only _test.go files may", p, v)
			}
		}
		return nil
	})
	if !seen {
		t.Fatalf("%s imports no etcd server: wrong root, or the helper moved?", helper)
	}
}

// TestTestutilImportsOnlyLeaves: testutil imports, of this module, only leaf
// packages (they import nothing of the module). A package's internal tests
// cannot import a testutil that imports that package, so a helper that
// needs, say, wal belongs in wal's tests, not here.
func TestTestutilImportsOnlyLeaves(t *testing.T) {
	imports := moduleImports(t, "..")
	for _, imp := range imports["testutil"] {
		if deps := imports[imp]; len(deps) > 0 {
			t.Errorf("testutil imports %s, which imports %v: the internal tests of those could no longer use testutil", imp, deps)
		}
	}
}

// TestExamplesUsePublicAPI: a file holding an Example imports neither an
// internal/ package nor testutil, so that a user can copy any Example into
// their own module and build it (issue 25: grpctransport's imported
// internal/pki for its certificates).
func TestExamplesUsePublicAPI(t *testing.T) {
	const module = "github.com/oncewal/oncewal/"
	root := ".."
	examples := 0
	err := walkGoFiles(root, func(p string) error {
		if !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		has := false
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example") {
				has = true
			}
		}
		if !has {
			return nil
		}
		examples++
		for _, imp := range f.Imports {
			v, _ := strconv.Unquote(imp.Path.Value)
			if rel, ok := strings.CutPrefix(v, module); ok && (rel == "testutil" || strings.HasPrefix(rel, "internal/")) {
				t.Errorf("%s holds an Example and imports %s: an Example uses the public API only", p, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if examples < 3 {
		t.Fatalf("found only %d files with Examples: wrong root?", examples)
	}
}

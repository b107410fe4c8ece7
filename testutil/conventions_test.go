package testutil

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestConventions: the module keeps the conventions README.md states
// ("Conventions"), read from the non-test files' syntax:
//   - every exported type named …Options has EnsureDefaults() *T and
//     Validate() error methods;
//   - a package that declares such a type declares ErrBadOptions, and its
//     code uses it (Validate wraps it);
//   - a package with an exported type that has a Close() error method
//     declares ErrClosed (what the type answers after Close).
func TestConventions(t *testing.T) {
	problems, pkgs := conventionProblems(t, "..")
	for _, p := range problems {
		t.Error(p)
	}
	if pkgs < 15 {
		t.Fatalf("checked only %d packages: wrong root?", pkgs)
	}
}

// TestConventionsCatchViolations: the check fails on each violation it
// exists for, and passes a package that keeps them all.
func TestConventionsCatchViolations(t *testing.T) {
	const good = `package p
import "errors"
var ErrBadOptions = errors.New("p: bad options")
var ErrClosed = errors.New("p: closed")
type Options struct{ N int }
func (o *Options) EnsureDefaults() *Options { return o }
func (o *Options) Validate() error { if o.N < 0 { return ErrBadOptions }; return nil }
type Thing struct{}
func (*Thing) Close() error { return ErrClosed }
`
	for _, tc := range []struct {
		name, src string
		want      string // "" for none
	}{
		{"all kept", good, ""},
		{"no Validate", strings.Replace(good, "func (o *Options) Validate() error { if o.N < 0 { return ErrBadOptions }; return nil }", "func use() error { return ErrBadOptions }", 1),
			"Options has no Validate() error"},
		{"no EnsureDefaults", strings.Replace(good, "func (o *Options) EnsureDefaults() *Options { return o }", "", 1),
			"Options has no EnsureDefaults() *Options"},
		{"EnsureDefaults returns another type", strings.Replace(good, "EnsureDefaults() *Options { return o }", "EnsureDefaults() *Thing { return nil }", 1),
			"Options has no EnsureDefaults() *Options"},
		{"another sentinel name", strings.ReplaceAll(good, "ErrBadOptions", "ErrBadThingOptions"),
			"declares Options types but no ErrBadOptions"},
		{"sentinel unused", strings.Replace(good, "return ErrBadOptions }", "return nil }", 1),
			"never uses ErrBadOptions"},
		{"another closed name", strings.ReplaceAll(good, "ErrClosed", "ErrThingClosed"),
			"Thing has Close() but the package declares no ErrClosed"},
		{"unexported types are free", "package p\ntype fooOptions struct{}\ntype thing struct{}\nfunc (thing) Close() error { return nil }\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(tc.src), 0o644); err != nil {
				t.Fatal(err)
			}
			problems, _ := conventionProblems(t, dir)
			got := strings.Join(problems, "\n")
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("problems %q, want one containing %q", got, tc.want)
			}
		})
	}
}

// pkgConventions is what the conventions look at in one package.
type pkgConventions struct {
	options []string                            // exported struct types named …Options
	closers []string                            // exported types with a Close() error method
	methods map[string]map[string]*ast.FuncType // receiver type → method → signature
	vars    map[string]bool                     // package-level vars
	bareUse map[string]int                      // unqualified identifier → occurrences
}

// conventionProblems checks every package under root (non-test files,
// testdata and hidden directories skipped) and returns the violations and
// the number of packages checked.
func conventionProblems(t *testing.T, root string) ([]string, int) {
	pkgs := map[string]*pkgConventions{}
	parseProductFiles(t, root, parser.SkipObjectResolution, func(p string, f *ast.File) error {
		dir := filepath.Dir(p)
		pc := pkgs[dir]
		if pc == nil {
			pc = &pkgConventions{methods: map[string]map[string]*ast.FuncType{}, vars: map[string]bool{}, bareUse: map[string]int{}}
			pkgs[dir] = pc
		}
		pc.add(f)
		return nil
	})
	var problems []string
	for dir, pc := range pkgs {
		rel, _ := filepath.Rel(root, dir)
		if filepath.ToSlash(rel) == "testutil" {
			continue // test helpers, not API: a test fills their options itself
		}
		problems = append(problems, pc.problems(filepath.ToSlash(rel))...)
	}
	sort.Strings(problems)
	return problems, len(pkgs)
}

func (pc *pkgConventions) add(f *ast.File) {
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if _, isStruct := s.Type.(*ast.StructType); isStruct && s.Name.IsExported() && strings.HasSuffix(s.Name.Name, "Options") {
						pc.options = append(pc.options, s.Name.Name)
					}
				case *ast.ValueSpec:
					if d.Tok == token.VAR {
						for _, n := range s.Names {
							pc.vars[n.Name] = true
						}
					}
				}
			}
		case *ast.FuncDecl:
			if recv := receiverType(d); recv != "" {
				if pc.methods[recv] == nil {
					pc.methods[recv] = map[string]*ast.FuncType{}
				}
				pc.methods[recv][d.Name.Name] = d.Type
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			ast.Inspect(n.X, pc.countBare) // pkg.ErrClosed is another package's
			return false
		case *ast.Ident:
			pc.bareUse[n.Name]++
		}
		return true
	})
}

func (pc *pkgConventions) countBare(n ast.Node) bool {
	if id, ok := n.(*ast.Ident); ok {
		pc.bareUse[id.Name]++
	}
	return true
}

func (pc *pkgConventions) problems(pkg string) []string {
	var out []string
	for _, typ := range pc.options {
		m := pc.methods[typ]
		if ft := m["EnsureDefaults"]; ft == nil || ft.Params.NumFields() != 0 || resultType(ft) != "*"+typ {
			out = append(out, fmt.Sprintf("%s: %s has no EnsureDefaults() *%s (documented defaults)", pkg, typ, typ))
		}
		if ft := m["Validate"]; ft == nil || ft.Params.NumFields() != 0 || resultType(ft) != "error" {
			out = append(out, fmt.Sprintf("%s: %s has no Validate() error (every problem joined, wrapping ErrBadOptions)", pkg, typ))
		}
	}
	if len(pc.options) > 0 {
		switch {
		case !pc.vars["ErrBadOptions"]:
			out = append(out, fmt.Sprintf("%s: declares Options types but no ErrBadOptions", pkg))
		case pc.bareUse["ErrBadOptions"] < 2: // the declaration is one
			out = append(out, fmt.Sprintf("%s: never uses ErrBadOptions (Validate must wrap it)", pkg))
		}
	}
	for typ, m := range pc.methods {
		if ft := m["Close"]; ast.IsExported(typ) && ft != nil && resultType(ft) == "error" && !pc.vars["ErrClosed"] {
			out = append(out, fmt.Sprintf("%s: %s has Close() but the package declares no ErrClosed", pkg, typ))
		}
	}
	return out
}

// receiverType is the name of a method's receiver type ("" for a func).
func receiverType(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	x := d.Recv.List[0].Type
	if s, ok := x.(*ast.StarExpr); ok {
		x = s.X
	}
	switch x := x.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.IndexExpr: // a generic type
		if id, ok := x.X.(*ast.Ident); ok {
			return id.Name
		}
	}
	return ""
}

// resultType spells a single result's type ("" otherwise): error, *T or T.
func resultType(ft *ast.FuncType) string {
	if ft.Results == nil || len(ft.Results.List) != 1 || len(ft.Results.List[0].Names) > 1 {
		return ""
	}
	switch x := ft.Results.List[0].Type.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.StarExpr:
		if id, ok := x.X.(*ast.Ident); ok {
			return "*" + id.Name
		}
	}
	return ""
}

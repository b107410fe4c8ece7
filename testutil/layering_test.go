package testutil

import (
	"go/ast"
	"go/parser"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/oncewal/oncewal/"

// layers is the module's package structure, lowest first (DESIGN.md,
// "Layering"): a package's non-test files import only packages of lower
// layers, never one of its own layer or above. Every package of the module
// must be listed, so that a new one is placed on purpose.
var layers = [][]string{
	// leaf types, codecs and helpers: the standard library only
	{"corruption", "internal/eventid", "internal/keyspace", "internal/ctxtime", "internal/diskguard", "internal/lifegate",
		"internal/lrutable", "internal/pki", "internal/badopts", "internal/rawdb", "internal/drill",
		"internal/crashmem", "kvroute"},
	// the published .proto files and the code generated from them: they
	// import nothing of the module, so any client can link them alone
	{"proto", "proto/oncewal/client/v1"},
	{"internal/ledgerrecord"},
	// the coordination seam (its interface, etcd client and in-memory
	// implementations) needs leaves only, so the simulation and the node
	// above can both stand on it; etcdtest (test-only) imports nothing of
	// the module
	{"coord", "internal/etcdtest"},
	// test helpers: imported by _test.go files only (TestOnlyTestsImport),
	// and themselves import leaves only (TestTestutilImportsOnlyLeaves), so
	// that every package's internal tests can use them
	{"testutil"},
	{"wal"},
	// the key space's model and transaction resolution (pure: no Pebble)
	// beside the session model
	{"session", "kv"},
	{"idempotency"},
	// the wire contract, and snapshots (checkpoints of a store directory)
	{"replication", "snapshot", "internal/leaderhook"},
	// one shard's store: both roles stand on it
	{"store"},
	// the roles, and the transports beside the contract
	{"leader", "follower", "replication/inprocess", "replication/grpctransport"},
	{"clientapi", "client"},
	// the node; and the client-history oracle (test-only) beside it
	{"node", "internal/clienthistory"},
	{"metrics", "sim", "bench"},
	{"cmd/oncewal"},
}

// TestLayering: imports point down the layers only. In particular leader
// and follower never import each other (a promotion opens a leader on a
// store, package store, not on a follower), the roles reach the network
// only through the replication contract (no transport below the CLI and
// the simulation), and the contract knows nothing of stores.
func TestLayering(t *testing.T) {
	rank := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			rank[p] = i
		}
	}
	imports := moduleImports(t, "..")
	var pkgs []string
	for p := range imports {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		r, ok := rank[p]
		if !ok {
			t.Errorf("package %s is in no layer: add it to layers", p)
			continue
		}
		for _, imp := range imports[p] {
			ir, ok := rank[imp]
			switch {
			case !ok:
				t.Errorf("%s imports %s, which is in no layer", p, imp)
			case ir >= r:
				t.Errorf("%s (layer %d) imports %s (layer %d): imports point down only", p, r, imp, ir)
			}
		}
	}
	if len(pkgs) < 15 {
		t.Fatalf("found only %d packages: wrong root?", len(pkgs))
	}
}

// moduleImports maps each package of the module under root (module-relative
// path) to the module packages its non-test files import.
func moduleImports(t *testing.T, root string) map[string][]string {
	t.Helper()
	seen := map[string]map[string]bool{}
	parseProductFiles(t, root, parser.ImportsOnly, func(p string, f *ast.File) error {
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		pkg := path.Clean(filepath.ToSlash(rel))
		if seen[pkg] == nil {
			seen[pkg] = map[string]bool{}
		}
		for _, imp := range f.Imports {
			if v, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(v, module) {
				seen[pkg][strings.TrimPrefix(v, module)] = true
			}
		}
		return nil
	})
	out := map[string][]string{}
	for p, imps := range seen {
		out[p] = []string{}
		for imp := range imps {
			out[p] = append(out[p], imp)
		}
		sort.Strings(out[p])
	}
	return out
}

package coord

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestEtcdOptionsDefaults(t *testing.T) {
	o := (&EtcdOptions{Endpoints: []string{"http://127.0.0.1:2379"}}).EnsureDefaults()
	if o.Prefix != DefaultPrefix || o.LeaseTTL != DefaultLeaseTTL || o.DialTimeout != DefaultDialTimeout || o.Logger != slog.Default() {
		t.Fatalf("defaults %+v", o)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdOptionsValidateJoinsEveryProblem: one error names every bad
// field, and NewEtcd refuses the options without connecting.
func TestEtcdOptionsValidateJoinsEveryProblem(t *testing.T) {
	o := &EtcdOptions{Endpoints: []string{""}, Prefix: "oncewal", LeaseTTL: 1500 * time.Millisecond, DialTimeout: -1}
	err := o.Validate()
	if !errors.Is(err, ErrBadOptions) {
		t.Fatalf("Validate: %v, want ErrBadOptions", err)
	}
	for _, want := range []string{"Endpoints[0]", "Prefix", "LeaseTTL", "DialTimeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not name %s", err, want)
		}
	}
	if _, err := NewEtcd(&EtcdOptions{}); !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), "no Endpoints") {
		t.Fatalf("NewEtcd without endpoints: %v", err)
	}
}

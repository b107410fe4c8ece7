package ledgerrecord_test

import (
	"errors"
	"testing"

	"github.com/oncewal/oncewal/corruption"
	"github.com/oncewal/oncewal/internal/ledgerrecord"
)

// TestDecodeErrorsAreCorruption: a record body that does not decode is
// ErrBadRecord and in the corruption class; a record refused before it is
// encoded is ErrBadRecord only — the caller's mistake, not bad data.
func TestDecodeErrorsAreCorruption(t *testing.T) {
	_, err := ledgerrecord.Decode(ledgerrecord.Claim, 1, []byte{0xff, 1, 2})
	if !errors.Is(err, ledgerrecord.ErrBadRecord) || !errors.Is(err, corruption.Err) {
		t.Fatalf("Decode of garbage: %v", err)
	}
	if err := ledgerrecord.Check(ledgerrecord.Claim, nil); !errors.Is(err, ledgerrecord.ErrBadRecord) || !errors.Is(err, corruption.Err) {
		t.Fatalf("Check of an empty body: %v", err)
	}
	r := ledgerrecord.Record{Kind: ledgerrecord.Release, Scope: "s", Key: "k", Expires: 5}
	if err := r.Validate(); !errors.Is(err, ledgerrecord.ErrBadRecord) || errors.Is(err, corruption.Err) {
		t.Fatalf("Validate of a release with an expiry: %v (want ErrBadRecord, not corruption)", err)
	}
}

package snapshot

import (
	"encoding/hex"
	"encoding/json"
	"testing"

	"lukechampine.com/blake3"
)

// TestManifestWithoutSerialSumsAsBefore: a donor older than Manifest.Serial
// sealed its manifests over JSON without the field; a newer fetcher must
// accept them.
func TestManifestWithoutSerialSumsAsBefore(t *testing.T) {
	m := Manifest{Cut: Cut{Shard: 3, AppliedLSN: 42, Identity: "follower"},
		Files: []File{{Name: "000001.sst", Size: 10}}}
	m.seal()
	old := struct { // Manifest before Serial
		ID    string
		Cut   Cut
		Files []File
	}{Cut: m.Cut, Files: m.Files}
	b, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	s := blake3.Sum256(b)
	if want := hex.EncodeToString(s[:]); m.ID != want {
		t.Fatalf("a manifest without Serial sums to %s, an older donor sealed it as %s", m.ID, want)
	}
	m.Serial = "donor-1"
	m.seal()
	if m.ID == hex.EncodeToString(s[:]) {
		t.Fatal("Serial is not part of the sum")
	}
}

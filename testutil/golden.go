package testutil

import (
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// ReadGolden reads the hex golden file at path (32 bytes a line) and
// returns its bytes. With ONCEWAL_UPDATE_GOLDEN=1 and got not nil it first
// writes got there: how a deliberate format change updates the file.
func ReadGolden(t testing.TB, path string, got []byte) []byte {
	t.Helper()
	if got != nil && os.Getenv("ONCEWAL_UPDATE_GOLDEN") == "1" {
		var sb strings.Builder
		for off := 0; off < len(got); off += 32 {
			sb.WriteString(hex.EncodeToString(got[off:min(off+32, len(got))]))
			sb.WriteByte('\n')
		}
		if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(raw)), "\n", ""))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return want
}

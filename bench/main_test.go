package bench

import (
	"os"
	"testing"
)

// TestMain deletes the store the last end-to-end benchmark kept (see rig).
func TestMain(m *testing.M) {
	code := m.Run()
	Release()
	os.Exit(code)
}

package store_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/store"
)

// TestFatalLoggerLevels: Pebble's lines reach the slog logger labelled
// component=pebble, Infof at Debug and Errorf at Error; Fatalf logs at Error
// and panics with *FatalError (a nil Logger only drops the lines).
func TestFatalLoggerLevels(t *testing.T) {
	var buf bytes.Buffer
	l := store.FatalLogger{Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	l.Infof("Found %d WALs", 0)
	l.Errorf("background error: %s\n", "no space left on device")
	fatal := func(l store.FatalLogger) (p any) {
		defer func() { p = recover() }()
		l.Fatalf("pebble: fatal commit error: %v", "injected")
		return nil
	}
	var fe *store.FatalError
	if p := fatal(l); !errors.As(asError(p), &fe) || fe.Msg != "pebble: fatal commit error: injected" {
		t.Fatalf("Fatalf panicked with %v", p)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec struct{ Level, Msg, Component string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if rec.Component != "pebble" {
			t.Errorf("line without component=pebble: %s", line)
		}
		got = append(got, rec.Level+" "+rec.Msg)
	}
	want := []string{"DEBUG Found 0 WALs", "ERROR background error: no space left on device", "ERROR pebble: fatal commit error: injected"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("lines %q, want %q", got, want)
	}

	quiet := store.FatalLogger{}
	quiet.Infof("x")
	quiet.Errorf("y")
	if p := fatal(quiet); !errors.As(asError(p), &fe) {
		t.Fatalf("Fatalf without a Logger panicked with %v", p)
	}
}

func asError(p any) error {
	err, _ := p.(error)
	return err
}

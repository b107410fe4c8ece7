package store

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/cockroachdb/pebble/v2"
)

// FatalLogger adapts a *slog.Logger to pebble.Logger. Every line carries
// component=pebble; Infof (WAL recovery counts, cancelled compactions) logs
// at Debug, Errorf (background errors such as a full disk) at Error.
//
// Pebble v2 reports a failed WAL write or sync through Logger.Fatalf, and its
// default logger exits the process; FatalLogger logs the line at Error and
// panics with *FatalError instead, which the receiver recovers into
// ErrFailed on the committing goroutine. Install it as
// pebble.Options.Logger for every store a Receiver writes to. A nil Logger
// discards the lines (Fatalf still panics).
type FatalLogger struct {
	Logger *slog.Logger
}

// Infof implements pebble.Logger.
func (l FatalLogger) Infof(format string, args ...any) { l.log(slog.LevelDebug, format, args...) }

// Errorf implements pebble.Logger.
func (l FatalLogger) Errorf(format string, args ...any) { l.log(slog.LevelError, format, args...) }

// Fatalf implements pebble.Logger by panicking with *FatalError.
func (l FatalLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.log(slog.LevelError, "%s", msg)
	panic(&FatalError{Msg: msg})
}

func (l FatalLogger) log(level slog.Level, format string, args ...any) {
	ctx := context.Background()
	if l.Logger == nil || !l.Logger.Enabled(ctx, level) {
		return
	}
	l.Logger.Log(ctx, level, strings.TrimRight(fmt.Sprintf(format, args...), "\n"), "component", "pebble")
}

// NonFatalCorruption makes po report on-disk corruption as an error instead
// of a crash. Pebble's default DataCorruption hook calls Logger.Fatalf, which
// FatalLogger (and every logger oncewal gives Pebble) turns into a panic,
// raised on whatever goroutine read the bad block — an iterator, a Get, a
// compaction — so one flipped byte in an sstable would panic every command
// that opens the store (invariant 10). With the hook set, the read returns
// Pebble's corruption error (pebble.IsCorruptionError), which the store
// boundary types (store.ErrCorrupt); log, if not nil, gets one
// Error line per report. A hook po already has is kept and called too.
func NonFatalCorruption(po *pebble.Options, log *slog.Logger) {
	var el pebble.EventListener
	if po.EventListener != nil {
		el = *po.EventListener // the caller's listener stays as it was
	}
	prev := el.DataCorruption
	l := FatalLogger{Logger: log}
	el.DataCorruption = func(info pebble.DataCorruptionInfo) {
		l.Errorf("on-disk corruption: %s", info)
		if prev != nil {
			prev(info)
		}
	}
	po.EventListener = &el
}

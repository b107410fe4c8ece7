// Package corruption is the one corruption class of oncewal: every error
// that reports bytes which do not decode — a WAL batch (package wal), a
// stored HWM record (session), a ledger row or record (idempotency), a
// window journal entry or store metadata (replication) — carries Err, so
//
//	errors.Is(err, corruption.Err)
//
// tells "the data is bad; retrying will not help, the store or log needs
// repair or a rebuild" apart from I/O, refusal and misuse errors, whatever
// package the error came from. The package-specific sentinels (wal.ErrChecksum,
// session.ErrCorrupt, ...) stay, and still match with errors.Is; this is the
// class above them, as Pebble's base.ErrCorruption is above its own.
//
// The package imports nothing but the standard library, so every package can
// use it without cycles.
package corruption

import (
	"errors"
	"fmt"
)

// Err is the corruption class. Test with errors.Is(err, corruption.Err).
var Err = errors.New("corruption")

// Mark returns an error with err's message that matches both err and Err
// with errors.Is (and err's chain with errors.As). Mark(nil) is nil. A
// package marks its decode sentinels once, at declaration
// (ErrCorrupt = corruption.Mark(errors.New(...))), so every error wrapping
// them is in the class without each call site remembering to mark it.
func Mark(err error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err}
}

// Errorf is fmt.Errorf marked as corruption, for a decode failure that has
// no sentinel of its own.
func Errorf(format string, args ...any) error {
	return Mark(fmt.Errorf(format, args...))
}

type marked struct{ err error }

func (m *marked) Error() string   { return m.err.Error() }
func (m *marked) Unwrap() []error { return []error{m.err, Err} }

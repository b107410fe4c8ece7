package corruption_test

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/oncewal/oncewal/corruption"
)

func TestMark(t *testing.T) {
	inner := &fs.PathError{Op: "read", Path: "x", Err: fs.ErrInvalid}
	sentinel := corruption.Mark(errors.New("pkg: corrupt"))
	err := fmt.Errorf("segment 7: %w: %w", sentinel, inner)

	if !errors.Is(err, corruption.Err) {
		t.Fatalf("%v: not corruption", err)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("%v: lost its sentinel", err)
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) || !errors.Is(err, fs.ErrInvalid) {
		t.Fatalf("%v: lost its inner error", err)
	}
	if got, want := sentinel.Error(), "pkg: corrupt"; got != want {
		t.Fatalf("Mark changed the message: %q, want %q", got, want)
	}
	if corruption.Mark(nil) != nil {
		t.Fatal("Mark(nil) != nil")
	}
	if errors.Is(errors.New("pkg: corrupt"), corruption.Err) || errors.Is(inner, corruption.Err) {
		t.Fatal("an unmarked error is corruption")
	}
	e := corruption.Errorf("row %q: %w", "k", fs.ErrNotExist)
	if !errors.Is(e, corruption.Err) || !errors.Is(e, fs.ErrNotExist) || e.Error() != `row "k": file does not exist` {
		t.Fatalf("Errorf: %v", e)
	}
}

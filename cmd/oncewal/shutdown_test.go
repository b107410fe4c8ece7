package main

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStopWithin: a command still stopping after the grace period exits the
// process with exitFailure and says why; one that stops in time, or is not
// asked to stop, does not.
func TestStopWithin(t *testing.T) {
	var mu sync.Mutex
	var codes []int
	exitProcess = func(code int) {
		mu.Lock()
		codes = append(codes, code)
		mu.Unlock()
	}
	t.Cleanup(func() { exitProcess = osExit })
	exited := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), codes...)
	}
	var out strings.Builder
	var outMu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		outMu.Lock()
		defer outMu.Unlock()
		return out.Write(p)
	}), nil))

	// Stops in time.
	ctx, cancel := context.WithCancel(context.Background())
	done := stopWithin(ctx, log, "test", 50*time.Millisecond)
	cancel()
	done()
	// Never asked to stop.
	done = stopWithin(context.Background(), log, "test", time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	require.Empty(t, exited())
	done()

	// Stuck.
	ctx, cancel = context.WithCancel(context.Background())
	done = stopWithin(ctx, log, "test", 10*time.Millisecond)
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for len(exited()) == 0 {
		require.True(t, time.Now().Before(deadline), "a stuck stop never exited the process")
		time.Sleep(time.Millisecond)
	}
	done()
	require.Equal(t, []int{exitFailure}, exited())
	outMu.Lock()
	require.Contains(t, out.String(), "exiting without a clean close")
	outMu.Unlock()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

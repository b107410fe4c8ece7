package lifegate_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/lifegate"
	"github.com/stretchr/testify/require"
)

// TestCloseWaitsAndRefuses: Close ends a run's context and waits for it to
// return, waits for a hold in flight, and refuses both afterwards.
func TestCloseWaitsAndRefuses(t *testing.T) {
	g := lifegate.New()
	ctx, done, ok := g.Enter(context.Background())
	require.True(t, ok)
	release, ok := g.Hold()
	require.True(t, ok)

	var ranUntilClosed bool
	go func() {
		<-ctx.Done() // Close ends it
		ranUntilClosed = true
		done()
	}()
	closed := make(chan bool)
	go func() { closed <- g.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while a hold was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	require.True(t, <-closed, "the first Close reports it closed the gate")
	require.True(t, ranUntilClosed, "Close returned before the run")
	require.ErrorIs(t, g.Context().Err(), context.Canceled)

	_, ok = g.Hold()
	require.False(t, ok)
	_, _, ok = g.Enter(context.Background())
	require.False(t, ok)
	require.False(t, g.Close(), "a second Close reports the gate was closed already")
}

// TestRunEndsWithItsParent: a run's context also ends with its parent, and
// done unlinks it from the gate (Close does not wait for a returned run).
func TestRunEndsWithItsParent(t *testing.T) {
	g := lifegate.New()
	parent, cancel := context.WithCancel(context.Background())
	ctx, done, ok := g.Enter(parent)
	require.True(t, ok)
	cancel()
	<-ctx.Done()
	require.NoError(t, g.Context().Err())
	done()
	require.True(t, g.Close())
}

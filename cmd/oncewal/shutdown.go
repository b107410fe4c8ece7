package main

import (
	"context"
	"log/slog"
	"os"
	"time"
)

// shutdownGrace is how long leader and follower may take to stop once
// asked (SIGINT, SIGTERM) before the process gives up on a clean close.
const shutdownGrace = 30 * time.Second

// exitProcess is os.Exit (tests replace it).
var exitProcess = osExit

var osExit = os.Exit

// stopWithin exits the process with exitFailure when ctx has ended and done
// has not been called within grace. A store Pebble cannot flush (a full
// disk) holds its writes, its flush and its close without a deadline; the
// follower gives up on those by itself (store.ErrStalled), but a
// leader's append can be caught in one. Exiting then is safe: whatever was
// acknowledged is durable (the WAL, the stores' own WALs), and the next
// start recovers like after a crash — the operator's SIGKILL, without the
// wait.
func stopWithin(ctx context.Context, log *slog.Logger, what string, grace time.Duration) (done func()) {
	finished := make(chan struct{})
	go func() {
		select {
		case <-finished:
			return
		case <-ctx.Done():
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-finished:
		case <-t.C:
			log.Error(what+": still stopping after "+grace.String()+"; exiting without a clean close (a store that cannot flush: disk full?); acknowledged writes are durable and the next start recovers them",
				"grace", grace)
			exitProcess(exitFailure)
		}
	}()
	return func() { close(finished) }
}

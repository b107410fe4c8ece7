package leader_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Example opens a two-shard leader and logs a session's events: the leader
// stamps each with the session's next SeqNo, the WAL clock and an
// idempotency key, syncs the batch and applies it to the shard's own store
// before Append returns.
func Example() {
	dir, err := os.MkdirTemp("", "oncewal-leader-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	quiet := slog.New(slog.DiscardHandler)
	l, err := leader.Open(dir, &leader.Options{Shards: 2, Logger: quiet, Store: store.Options{Logger: quiet}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	s := session.ID{0x01}
	add := wal.Event{Op: wal.OpAdd, Session: s, Key: []byte("balance"), Delta: 5}
	for range 2 {
		h, err := l.Append(add)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("logged at LSN %d\n", h.FirstLSN)
	}
	sh := l.For(s)
	hwm, _, _, _ := sh.Store().Tracker().Get(s)
	n, _ := sh.Store().State().Counter(s, []byte("balance"))
	fmt.Printf("session's SeqNo HWM %d, balance %d\n", hwm, n)
	// Output:
	// logged at LSN 1
	// logged at LSN 2
	// session's SeqNo HWM 2, balance 10
}

// Example_requestLedger runs one request through the shard's request
// ledger: the first attempt claims the request key and commits its effect
// and its outcome in one batch; a retry gets the recorded outcome back
// without executing again; the same key with another payload is refused.
func Example_requestLedger() {
	dir, err := os.MkdirTemp("", "oncewal-ledger-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	quiet := slog.New(slog.DiscardHandler)
	l, err := leader.Open(dir, &leader.Options{Shards: 1, Logger: quiet, Store: store.Options{Logger: quiet}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	s := session.ID{0x02}
	sh := l.For(s)
	pay := func(payload string) {
		// The door: a session that can no longer log is refused here
		// (leader.ErrSessionExpired), before anything is claimed.
		c, err := sh.Claim(context.Background(), s, "payments", "req-42", []byte(payload), idempotency.ClaimOptions{Wait: true})
		switch {
		case errors.Is(err, idempotency.ErrConflict):
			fmt.Println("refused: key reused with another payload")
			return
		case err != nil:
			log.Fatal(err)
		}
		switch c.Status {
		case idempotency.Fresh: // execute: effect and outcome commit together
			debit := wal.Event{Op: wal.OpAdd, Session: s, Key: []byte("balance"), Delta: -30}
			if _, err := sh.Commit(c, []byte("paid 30"), debit); err != nil {
				log.Fatal(err)
			}
			fmt.Println("executed: paid 30")
		case idempotency.Replay:
			fmt.Printf("replayed: %s\n", c.Outcome)
		}
	}
	pay("30 to alice")
	pay("30 to alice") // the client retries
	pay("99 to bob")
	n, _ := sh.Store().State().Counter(s, []byte("balance"))
	fmt.Println("balance:", n)
	// Output:
	// executed: paid 30
	// replayed: paid 30
	// refused: key reused with another payload
	// balance: -30
}

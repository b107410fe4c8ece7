package follower_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// The two ways an Applier rejects an event (the Applier contract in
// package replication): refused before it is logged (a Validator), or
// logged and recorded as rejected by every replica.

var errOverdraft = errors.New("overdraft")

// guardedBalances is balances (example_applier_test.go) with a Validator:
// an add that would take an account below zero is refused before it is
// logged.
type guardedBalances struct{ balances }

// Validate runs the events through Apply into the scratch batch b, so a
// later event of the append is judged by an earlier one's effect.
func (g guardedBalances) Validate(b *pebble.Batch, events []wal.Event) error {
	for i := range events {
		ev := &events[i]
		n, err := balance(b, append([]byte("acct/"), ev.Key...))
		if err != nil {
			return err
		}
		if n+ev.Delta < 0 {
			return fmt.Errorf("%w: %s has %d, cannot take %d", errOverdraft, ev.Key, n, -ev.Delta)
		}
		if err := g.Apply(b, events[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

// Example_rejectedBeforeLogging: a Validator refuses an overdraft; the
// caller gets replication.ErrRejected wrapping the reason, nothing is
// logged, and the session's next append takes the SeqNo the refused one
// would have had.
func Example_rejectedBeforeLogging() {
	dir, err := os.MkdirTemp("", "oncewal-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	l, err := leader.Open(dir, &leader.Options{Shards: 1, Logger: quietLogger,
		Store: store.Options{Applier: guardedBalances{}, Logger: quietLogger}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	s := session.NewID()
	add := func(acct string, delta int64) {
		h, err := l.Append(wal.Event{Op: wal.OpAdd, Session: s, Key: []byte(acct), Delta: delta})
		switch {
		case errors.Is(err, store.ErrRejected):
			fmt.Println("rejected:", errors.Is(err, errOverdraft))
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Println("logged at LSN", h.FirstLSN)
		}
	}
	add("alice", 10)
	add("alice", -15)
	add("alice", -4)
	n, err := balance(l.For(s).Store().View(), []byte("acct/alice"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("alice:", n)
	// Output:
	// logged at LSN 1
	// rejected: true
	// logged at LSN 2
	// alice: 6
}

// recordedBalances is balances where an overdraft is a result, not an
// error: the add is logged, and Apply records it as rejected under
// "rej/<LSN>" (the Applier's own key space) instead of moving the balance.
// Deterministic, it records the same rejection on every replica.
type recordedBalances struct{}

func (recordedBalances) Apply(b *pebble.Batch, events []wal.Event) error {
	for i := range events {
		ev := &events[i]
		key := append([]byte("acct/"), ev.Key...)
		n, err := balance(b, key)
		if err != nil {
			return err
		}
		if n+ev.Delta < 0 {
			err = b.Set(binary.BigEndian.AppendUint64([]byte("rej/"), ev.LSN), ev.Key, nil)
		} else {
			err = b.Set(key, binary.LittleEndian.AppendUint64(nil, uint64(n+ev.Delta)), nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Example_rejectionRecorded: an overdraft is logged and recorded as
// rejected by the leader and by its follower alike.
func Example_rejectionRecorded() {
	dir, err := os.MkdirTemp("", "oncewal-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	l, err := leader.Open(filepath.Join(dir, "leader"), &leader.Options{Shards: 1, Logger: quietLogger,
		Followers: []string{"f1"}, Listener: func(uint32) replication.Listener { return tr },
		Store: store.Options{Applier: recordedBalances{}, Logger: quietLogger}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	f, err := follower.Open(filepath.Join(dir, "f1"), &follower.Options{Store: store.Options{ID: "f1", Applier: recordedBalances{}, Logger: quietLogger}})
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go l.Run(ctx)
	go f.Serve(ctx, tr)

	s := session.NewID()
	for _, delta := range []int64{10, -15, -4} {
		if _, err := l.Append(wal.Event{Op: wal.OpAdd, Session: s, Key: []byte("alice"), Delta: delta}); err != nil {
			log.Fatal(err)
		}
	}
	if err := l.WaitAcked(ctx, leader.AckAll); err != nil {
		log.Fatal(err)
	}
	for _, r := range []struct {
		name string
		db   *store.View
	}{{"leader", l.For(s).Store().View()}, {"follower", f.View()}} {
		db := r.db
		n, err := balance(db, []byte("acct/alice"))
		if err != nil {
			log.Fatal(err)
		}
		who, closer, err := db.Get(binary.BigEndian.AppendUint64([]byte("rej/"), 2))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: alice %d, LSN 2 rejected for %s\n", r.name, n, who)
		closer.Close()
	}
	// Output:
	// leader: alice 6, LSN 2 rejected for alice
	// follower: alice 6, LSN 2 rejected for alice
}

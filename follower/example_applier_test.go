package follower_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// balances is a custom state machine: account balances under "acct/<name>",
// moved by non-idempotent adds. It holds nothing: the batch it is handed
// reads the store as it will be after the commit, so it needs no handle on
// the store, and the follower routes request-ledger records to its own
// table, so it never sees them.
type balances struct{}

func (balances) Apply(b *pebble.Batch, events []wal.Event) error {
	for i := range events {
		ev := &events[i]
		if ev.Op != wal.OpAdd {
			continue // open, close: nothing to do for this state machine
		}
		key := append([]byte("acct/"), ev.Key...)
		n, err := balance(b, key)
		if err != nil {
			return err
		}
		// Read-modify-write: an earlier add to the same account in this
		// batch is already visible through b.
		if err := b.Set(key, binary.LittleEndian.AppendUint64(nil, uint64(n+ev.Delta)), nil); err != nil {
			return err
		}
	}
	return nil
}

// balance reads an account's balance from r (0 when it has none).
func balance(r pebble.Reader, key []byte) (int64, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer closer.Close()
	return int64(binary.LittleEndian.Uint64(v)), nil
}

// Example_customApplier runs a custom Applier (account balances, with adds
// that would show any double apply) through duplicates, a request-ledger
// record and a restart.
func Example_customApplier() {
	dir, err := os.MkdirTemp("", "oncewal-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	opts := &follower.Options{Store: store.Options{Applier: balances{}, Logger: quietLogger}}

	s := session.ID{0x02}
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC).UnixNano()
	add := func(seq session.SeqNo, acct string, delta int64) wal.Event {
		return wal.Event{Op: wal.OpAdd, Session: s, Seq: seq, Time: now, Key: []byte(acct), Delta: delta}
	}
	claim := idempotency.Record{Kind: idempotency.RecordClaim, Token: idempotency.Token{7}, Time: now,
		Expires: now + int64(time.Minute), Scope: "payments", Key: "order-42"}
	// The leader's log: two adds to alice in one batch, a claim of a
	// request, then (after the restart) a redelivered add and a new one.
	batch1, _ := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{add(1, "alice", 5), add(2, "alice", 7), wal.LedgerEvent(&claim)})
	batch2, _ := wal.AppendBatch(nil, 0, 1, 4, []wal.Event{add(2, "alice", 7), add(3, "bob", 3)})

	show := func(f *follower.Follower) {
		for _, acct := range []string{"alice", "bob"} {
			n, err := balance(f.View(), []byte("acct/"+acct))
			if err != nil {
				log.Fatal(err)
			}
			fmt.Printf("%s: %d\n", acct, n)
		}
	}

	f, err := follower.Open(dir, opts)
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range [][]byte{batch1, batch1} {
		if _, err := f.Apply(b); err != nil {
			log.Fatal(err)
		}
	}
	show(f)
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}

	// A restart: a new process opens the store with the same Applier.
	f, err = follower.Open(dir, opts)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	res, err := f.Apply(batch2)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("after restart: applied %d, discarded %d\n", res.Applied, res.Discarded)
	show(f)
	e, ok, err := f.LedgerTable().Get("payments", "order-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger entry order-42:", ok, e.State)
	// Output:
	// alice: 12
	// bob: 0
	// after restart: applied 1, discarded 1
	// alice: 12
	// bob: 3
	// ledger entry order-42: true in-flight
}

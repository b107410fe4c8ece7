package follower_test

import (
	"fmt"
	"log"
	"os"
	"time"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Example embeds a follower and feeds it shipped batches directly — the
// path a database with its own transport takes. The same batch delivered
// twice, and the same event re-logged at a later position, apply once.
func Example() {
	dir, err := os.MkdirTemp("", "oncewal-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	f, err := follower.Open(dir, &follower.Options{Store: store.Options{Shard: 0, Logger: quietLogger}})
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()

	// What the leader logged: session s adds 5 to "balance", twice.
	s := session.ID{0x01}
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC).UnixNano()
	add := func(seq session.SeqNo) wal.Event {
		return wal.Event{Op: wal.OpAdd, Session: s, Seq: seq, Time: now, Key: []byte("balance"), Delta: 5}
	}
	batch1, _ := wal.AppendBatch(nil, 0, 1, 1, []wal.Event{add(1), add(2)})
	batch2, _ := wal.AppendBatch(nil, 0, 1, 3, []wal.Event{add(2)}) // a re-logged duplicate

	for _, b := range [][]byte{batch1, batch1, batch2} { // the network repeats itself
		res, err := f.Apply(b)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("ack LSN %d: applied %d, discarded %d\n", res.Ack.AppliedLSN, res.Applied, res.Discarded)
	}
	n, _ := f.State().Counter(s, []byte("balance"))
	fmt.Println("balance:", n)
	// Output:
	// ack LSN 2: applied 2, discarded 0
	// ack LSN 2: applied 0, discarded 2
	// ack LSN 3: applied 0, discarded 1
	// balance: 10
}

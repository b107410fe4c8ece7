package leader_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

// BenchmarkLedgerLogRequest measures what the request ledger adds per
// request on a leader: "plain" logs a request's effect (one add) as one
// synced WAL batch applied to the leader's store; "ledger" runs the same
// request through Claim + Commit (claim batch, then effect + complete in one
// batch: two synced WAL batches). The difference is the ledger's cost per
// request. "extend" is one heartbeat of a held claim (Ledger.Extend: one
// synced WAL batch holding the extend record). disk: WAL and store on the local disk (fsync bound); shm: WAL on
// /dev/shm and store in memory (CPU cost alone).
func BenchmarkLedgerLogRequest(b *testing.B) {
	type medium struct {
		name string
		wal  func(b *testing.B) string
		fs   func(b *testing.B) (vfs.FS, string)
	}
	media := []medium{{"disk", func(b *testing.B) string { return b.TempDir() },
		func(b *testing.B) (vfs.FS, string) { return vfs.Default, b.TempDir() }}}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		media = append(media, medium{"shm", func(b *testing.B) string {
			d, err := os.MkdirTemp("/dev/shm", "oncewal-bench-")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { os.RemoveAll(d) })
			return d
		}, func(b *testing.B) (vfs.FS, string) { return vfs.NewMem(), "store" }})
	}
	for _, m := range media {
		for _, mode := range []string{"plain", "ledger", "extend"} {
			b.Run(m.name+"/"+mode, func(b *testing.B) {
				fs, dir := m.fs(b)
				o := testutil.DBOptions(fs)
				o.Logger = store.FatalLogger{}
				db := testutil.OpenDBWith(b, dir, o)
				defer db.Close()
				tracker, err := session.OpenTracker(db, nil)
				if err != nil {
					b.Fatal(err)
				}
				table, err := idempotency.OpenLedgerTable(db, nil)
				if err != nil {
					b.Fatal(err)
				}
				l, err := leader.OpenLedgerLog(&leader.LedgerLogOptions{WALDir: m.wal(b), DB: db, Tracker: tracker,
					Window: idempotency.NewStore(0), Table: table, State: session.NewState(db)})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				sid := session.NewID()
				payload := []byte(`{"op":"add","key":"balance","delta":5}`)
				ev := wal.Event{Op: wal.OpAdd, Session: sid, Key: []byte("balance"), Delta: 5}
				held, err := l.Ledger().Claim("ops", "held", payload)
				if err != nil {
					b.Fatal(err)
				}
				i := 0
				for b.Loop() {
					i++
					if mode == "extend" {
						if _, err := l.Ledger().Extend(held, 0); err != nil {
							b.Fatal(err)
						}
						continue
					}
					if mode == "plain" {
						if _, err := l.Append(ev); err != nil {
							b.Fatal(err)
						}
						continue
					}
					c, err := l.Ledger().Claim("ops", fmt.Sprintf("req-%d", i), payload)
					if err != nil || c.Status != idempotency.Fresh {
						b.Fatal(err)
					}
					if _, err := l.Commit(c, []byte(`{"balance":105}`), ev); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			})
		}
	}
}

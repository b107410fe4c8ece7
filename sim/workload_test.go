package sim

import (
	"testing"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// stateOf is an oracle's whole state, for comparing two oracles.
func stateOf(o *Oracle) map[session.ID]map[string]string {
	out := map[session.ID]map[string]string{}
	for _, id := range o.Sessions() {
		m := map[string]string{}
		for k, v := range o.Expect(id) {
			m[k] = string(v)
		}
		out[id] = m
	}
	return out
}

func equalStates(t *testing.T, what string, a, b *Oracle) {
	t.Helper()
	sa, sb := stateOf(a), stateOf(b)
	if len(sa) != len(sb) {
		t.Fatalf("%s: %d sessions vs %d", what, len(sa), len(sb))
	}
	for id, m := range sa {
		if len(m) != len(sb[id]) {
			t.Fatalf("%s: session %s: %v vs %v", what, id, m, sb[id])
		}
		for k, v := range m {
			if sb[id][k] != v {
				t.Fatalf("%s: session %s key %q: %x vs %x", what, id, k, v, sb[id][k])
			}
		}
	}
}

// TestRecordedLog: the leader stamps the client's requests — contiguous
// SeqNos per session, a retry under its original's client key and a fresh
// SeqNo, a non-decreasing WAL clock — refuses the late writes, and the
// oracle replayed from the log equals the client's.
func TestRecordedLog(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		w := GenerateWorkload(WorkloadOptions{Seed: seed, Sessions: 5, Requests: 400, BatchSize: 10,
			RetryRate: 0.15, CloseRate: 0.05, LateRate: 0.05})
		if w.Retries == 0 || w.Late == 0 {
			t.Fatalf("seed %d: %d retries, %d late requests", seed, w.Retries, w.Late)
		}
		log, err := Record(w, 2)
		if err != nil {
			t.Fatal(err)
		}
		if log.Refused != w.Late {
			t.Fatalf("seed %d: leader refused %d requests, %d were late", seed, log.Refused, w.Late)
		}
		clientKeys := map[idempotency.Key]int{}
		for _, batches := range w.Batches {
			for _, r := range batches {
				if r.Event.HasIdemKey && !r.Late {
					clientKeys[r.Event.IdemKey]++
				}
			}
		}
		logged := 0
		for s, batches := range log.Shards {
			next := map[session.ID]session.SeqNo{}
			var last int64
			for _, evs := range batches {
				for _, ev := range evs {
					logged++
					next[ev.Session]++
					if ev.Seq != next[ev.Session] || !ev.HasIdemKey || ev.Time < last {
						t.Fatalf("seed %d shard %d: event %+v (want SeqNo %d, time >= %d)", seed, s, ev, next[ev.Session], last)
					}
					last = ev.Time
					clientKeys[ev.IdemKey]--
				}
			}
		}
		for k, n := range clientKeys {
			if n > 0 {
				t.Fatalf("seed %d: client key %x sent %d more times than logged", seed, k, n)
			}
		}
		if logged != w.Requests-w.Late {
			t.Fatalf("seed %d: %d events logged, %d requests accepted", seed, logged, w.Requests-w.Late)
		}
		// The client's view of the same requests: its oracle from what the
		// leader accepted equals the one replayed from the log.
		l, err := leader.Open("/l", &leader.Options{Shards: 2, FS: vfs.NewMem(), Logger: discard,
			Wall: NewClock(w.Options.Start).Now, Store: store.Options{Logger: discard, PebbleOptions: smallMemtable}})
		if err != nil {
			t.Fatal(err)
		}
		c := NewClient(w, 2, NewClock(w.Options.Start))
		for !c.Done() {
			if _, err := c.Send(l); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		equalStates(t, "log replay vs the client's accepted requests", log.Oracle, c.Oracle())
		if c.Logged() != logged {
			t.Fatalf("client saw %d events accepted, the log holds %d", c.Logged(), logged)
		}
	}
}

func mustRecord(t *testing.T, w *Workload) *Log {
	t.Helper()
	log, err := Record(w, 2)
	if err != nil {
		t.Fatal(err)
	}
	return log
}

// TestHostileChangesNothing: the shapes Hostile injects — verbatim
// re-appends and late writes — must have no effect, so the hostile log's
// oracle equals the original's, and the injected events are really there.
func TestHostileChangesNothing(t *testing.T) {
	w := GenerateWorkload(WorkloadOptions{Seed: 3, Sessions: 4, Requests: 300, BatchSize: 8, RetryRate: 0.1, CloseRate: 0.05})
	log := mustRecord(t, w)
	h := log.Hostile(HostileOptions{Seed: 3, Reappends: 0.1, LateWrites: 0.05})
	if h.Reappends == 0 || h.LateWrites == 0 {
		t.Fatalf("%d re-appends, %d late writes injected", h.Reappends, h.LateWrites)
	}
	if got, want := h.Events(0)+h.Events(1), log.Events(0)+log.Events(1)+h.Reappends+h.LateWrites; got != want {
		t.Fatalf("hostile log holds %d events, want %d", got, want)
	}
	equalStates(t, "hostile vs original", h.Oracle, log.Oracle)
	// And the original log is left as it was.
	for s := range log.Shards {
		for _, evs := range log.Shards[s] {
			for _, ev := range evs {
				if ev.Op == wal.OpPut && string(ev.Key) == "late" {
					t.Fatal("Hostile changed the log it was given")
				}
			}
		}
	}
}

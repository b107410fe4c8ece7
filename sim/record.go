package sim

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// Log is a leader's log, shard by shard, batch by batch, as events (LSNs
// from 1): what tests feed followers directly, without a leader running.
type Log struct {
	Workload *Workload
	// Shards[s] is shard s's log, one event slice per batch.
	Shards [][][]wal.Event
	// Oracle applies each logged operation once (Oracle.Logged, in LSN
	// order): the state a follower must reach.
	Oracle *Oracle
	// Refused counts requests the leader refused (late writes).
	Refused int
	// Reappends and LateWrites count the events a Hostile injection added.
	Reappends, LateWrites int
}

// Record runs w through a leader of shards shards (the one stamping path:
// SeqNos, keys, WAL clock; on an in-memory filesystem, shipping to nobody)
// and returns the log it wrote.
func Record(w *Workload, shards int) (*Log, error) {
	clock := NewClock(w.Options.Start)
	fs := vfs.NewMem()
	l, err := leader.Open("/leader", &leader.Options{
		Shards: shards, FS: fs, Wall: clock.Now, Logger: discard,
		Store: store.Options{Logger: discard, PebbleOptions: smallMemtable},
	})
	if err != nil {
		return nil, err
	}
	c := NewClient(w, shards, clock)
	for !c.Done() {
		if _, err := c.Send(l); err != nil {
			_ = l.Close()
			return nil, err
		}
	}
	if err := l.Close(); err != nil {
		return nil, err
	}
	log := &Log{Workload: w, Refused: c.RefusedClosed + c.RefusedExpired, Oracle: NewOracle()}
	for s := range uint32(shards) {
		batches, err := ReadLog(fs, l.WALDir(), s)
		if err != nil {
			return nil, err
		}
		log.Shards = append(log.Shards, batches)
	}
	log.replay()
	return log, nil
}

// ReadLog reads shard's log in walDir on fs, batch by batch.
func ReadLog(fs vfs.FS, walDir string, shard uint32) ([][]wal.Event, error) {
	r, err := wal.OpenReaderFS(fs, walDir, shard)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var out [][]wal.Event
	for {
		_, raw, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		_, evs, err := wal.DecodeBatch(raw, nil)
		if err != nil {
			return nil, err
		}
		for i := range evs {
			evs[i].Key, evs[i].Value = bytes.Clone(evs[i].Key), bytes.Clone(evs[i].Value)
		}
		out = append(out, evs)
	}
}

func (l *Log) replay() {
	l.Oracle = NewOracle()
	for _, batches := range l.Shards {
		for _, evs := range batches {
			for i := range evs {
				l.Oracle.Logged(&evs[i])
			}
		}
	}
}

// Events is the number of events in shard's log.
func (l *Log) Events(shard uint32) int {
	n := 0
	for _, evs := range l.Shards[shard] {
		n += len(evs)
	}
	return n
}

// Encode encodes shard's log as the batches a leader of epoch ships, with
// LSNs from 1, stamped as shard as (to feed a follower of another shard).
func (l *Log) Encode(shard, as uint32, epoch uint64) ([][]byte, error) {
	var out [][]byte
	lsn := uint64(1)
	for _, evs := range l.Shards[shard] {
		raw, err := wal.AppendBatch(nil, as, epoch, lsn, evs)
		if err != nil {
			return nil, err
		}
		out = append(out, raw)
		lsn += uint64(len(evs))
	}
	return out, nil
}

// HostileOptions sets the log shapes Hostile injects.
type HostileOptions struct {
	Seed uint64
	// Reappends is the chance, per logged event, that a verbatim copy of
	// an earlier event of the shard (same session, SeqNo and key; one of
	// the last 256) follows it.
	Reappends float64
	// LateWrites is the chance, per logged event, that a write to a
	// session closed earlier in the log follows it, with the SeqNo after
	// the session's last.
	LateWrites float64
}

// EnsureDefaults returns c: zero chances inject nothing.
func (c *HostileOptions) EnsureDefaults() *HostileOptions { return c }

// Validate reports every chance outside 0..1 in one error wrapping
// ErrBadOptions.
func (c *HostileOptions) Validate() error {
	return badOptions("HostileOptions", rateProblems(rate{"Reappends", c.Reappends}, rate{"LateWrites", c.LateWrites}))
}

// Hostile is fault injection for testing followers: it returns a copy of
// the log with events added that no correct leader logs — verbatim
// re-appends of already logged events (same SeqNo, same key) and writes to
// sessions the log has closed — the shapes of a buggy or malicious leader,
// which a follower must still apply exactly once (discarding the copies by
// their SeqNo, skipping the late writes). Nothing outside tests of
// followers should use it: a leader (package leader) stamps every event and
// never writes them. The copy's Oracle is replayed over the new log. Added
// events carry the time of the event they follow, so the WAL clock never
// goes back.
func (l *Log) Hostile(cfg HostileOptions) *Log {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x686f7374696c65))
	out := &Log{Workload: l.Workload, Refused: l.Refused}
	for _, batches := range l.Shards {
		var logged []wal.Event
		var closed []session.ID
		next := map[session.ID]session.SeqNo{} // a closed session's next SeqNo
		var shard [][]wal.Event
		for _, evs := range batches {
			var b []wal.Event
			for _, ev := range evs {
				b = append(b, ev)
				logged = append(logged, ev)
				if ev.Op == wal.OpClose {
					closed = append(closed, ev.Session)
					next[ev.Session] = ev.Seq + 1
				}
				if rng.Float64() < cfg.Reappends {
					dup := logged[len(logged)-1-rng.IntN(min(len(logged), 256))]
					dup.Time = ev.Time
					b = append(b, dup)
					out.Reappends++
				}
				if len(closed) > 0 && rng.Float64() < cfg.LateWrites {
					id := closed[rng.IntN(len(closed))]
					late := wal.Event{Op: wal.OpPut, Session: id, Seq: next[id], Time: ev.Time,
						Key: []byte("late"), Value: []byte("x"), HasIdemKey: true, IdemKey: randomKey(rng)}
					next[id]++
					b = append(b, late)
					out.LateWrites++
				}
			}
			shard = append(shard, b)
		}
		out.Shards = append(out.Shards, shard)
	}
	out.replay()
	return out
}

func randomKey(rng *rand.Rand) idempotency.Key {
	var k idempotency.Key
	for i := range k {
		k[i] = byte(rng.Uint32())
	}
	return k
}

var discard = slog.New(slog.DiscardHandler)

// smallMemtable keeps the simulation's many Pebble opens cheap: the default
// 4 MiB memtable is allocated at every open.
func smallMemtable(o *pebble.Options) { o.MemTableSize = 256 << 10 }

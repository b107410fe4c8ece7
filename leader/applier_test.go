package leader_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/replication/inprocess"

	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// The Applier contract (store's doc.go, invariant 9) on a leader
// and its followers: a rejection is a result, an Applier failure stops the
// shard, and a fixed Applier gets it going again.

var (
	errOverdraft = errors.New("overdraft")
	errPoison    = errors.New("poisoned event")
)

// bank is a state machine of account balances ("acct/<name>", moved by
// adds). An add that would take an account below zero is a rejection
// recorded in the store (path (b)): "rej/<LSN>" holds the account and no
// balance changes. While *fail is set, a batch holding an event keyed
// "poison" fails (or, with panics, panics): the broken Applier that is
// then fixed.
type bank struct {
	fail   *atomic.Bool
	panics bool
}

func (k bank) Apply(b *pebble.Batch, events []wal.Event) error {
	for i := range events {
		ev := &events[i]
		if string(ev.Key) == "poison" && k.fail != nil && k.fail.Load() {
			if k.panics {
				panic("bank: poisoned event")
			}
			return errPoison
		}
		if ok, err := add(b, ev); err != nil {
			return err
		} else if !ok {
			if err := b.Set(rejKey(ev.LSN), ev.Key, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// add applies ev to its account unless it would overdraw it (false).
func add(b *pebble.Batch, ev *wal.Event) (bool, error) {
	key := append([]byte("acct/"), ev.Key...)
	n, err := readBalance(b, key)
	if err != nil || n+ev.Delta < 0 {
		return false, err
	}
	return true, b.Set(key, binary.BigEndian.AppendUint64(nil, uint64(n+ev.Delta)), nil)
}

func readBalance(r pebble.Reader, key []byte) (int64, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer closer.Close()
	return int64(binary.BigEndian.Uint64(v)), nil
}

func rejKey(lsn uint64) []byte { return binary.BigEndian.AppendUint64([]byte("rej/"), lsn) }

// guarded is bank refusing an overdraft before it is logged (path (a)).
// Every Validate also checks the guarantee it is given: the store it
// reads holds every batch logged before the one it judges (lagged counts
// the calls that saw less); panics makes Validate panic on "poison".
type guarded struct {
	bank
	lagged *atomic.Int64
}

func (g guarded) Validate(b *pebble.Batch, events []wal.Event) error {
	if applied, _, _, err := store.ReadMeta(b); err != nil {
		return err
	} else if applied != events[0].LSN-1 {
		g.lagged.Add(1)
	}
	for i := range events {
		ev := &events[i]
		if ev.Op.IsLedger() {
			return fmt.Errorf("ledger record %s reached Validate", ev.Op)
		}
		if string(ev.Key) == "poison" && g.panics {
			panic("guarded: poisoned event")
		}
		if ok, err := add(b, ev); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("%w: %s at LSN %d", errOverdraft, ev.Key, ev.LSN)
		}
	}
	return nil
}

func deposit(id session.ID, acct string, delta int64) wal.Event {
	return wal.Event{Op: wal.OpAdd, Session: id, Key: []byte(acct), Delta: delta}
}

// replicaState is what a replica's Applier wrote: every acct/ and rej/ row.
func replicaState(t *testing.T, db pebble.Reader) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, prefix := range []string{"acct/", "rej/"} {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte(prefix), UpperBound: []byte(prefix[:len(prefix)-1] + "0")})
		require.NoError(t, err)
		for it.First(); it.Valid(); it.Next() {
			out[string(it.Key())] = string(it.Value())
		}
		require.NoError(t, it.Close())
	}
	return out
}

// bankOracle applies every distinct event (by idempotency key) of the
// shard-0 log in walDir once, in LSN order, by bank's rules (never
// failing), and returns the rows a replica must hold.
func bankOracle(t *testing.T, walDir string) map[string]string {
	t.Helper()
	bal := map[string]int64{}
	out := map[string]string{}
	seen := map[idempotency.Key]bool{}
	for _, ev := range readLog(t, walDir, 0) {
		if seen[ev.IdemKey] {
			continue
		}
		seen[ev.IdemKey] = true
		acct := string(ev.Key)
		if n := bal[acct] + ev.Delta; n >= 0 {
			bal[acct] = n
			out["acct/"+acct] = string(binary.BigEndian.AppendUint64(nil, uint64(n)))
		} else {
			out[string(rejKey(ev.LSN))] = acct
		}
	}
	return out
}

// TestValidatorRejects: a Validator's refusal reaches the caller as
// replication.ErrRejected wrapping the reason, and nothing is logged: no
// WAL bytes, no SeqNo, no HWM advance — the session's next append takes
// the SeqNo the refused one would have had. A later event of one append
// is judged by an earlier one's effect, and concurrent appends are judged
// by every batch logged before them (exactly as many withdrawals pass as
// the balance covers, and no Validate saw a store behind the log).
func TestValidatorRejects(t *testing.T) {
	dir := t.TempDir()
	var lagged atomic.Int64
	o := &leader.Options{Shards: 1, Store: store.Options{Applier: guarded{lagged: &lagged}}}
	l := open(t, dir, o)
	defer l.Close()
	sh, _ := l.Shard(0)
	walDir := l.WALDir()
	id := session.NewID()

	_, err := l.Append(deposit(id, "alice", 10))
	require.NoError(t, err)
	segBytes := func() int64 {
		var n int64
		ents, err := os.ReadDir(walDir)
		require.NoError(t, err)
		for _, e := range ents {
			fi, err := os.Stat(filepath.Join(walDir, e.Name()))
			require.NoError(t, err)
			n += fi.Size()
		}
		return n
	}
	before, nextLSN := segBytes(), sh.NextLSN()
	for name, evs := range map[string][]wal.Event{
		"one event":                {deposit(id, "alice", -11)},
		"second sees the first":    {deposit(id, "alice", -6), deposit(id, "alice", -6)},
		"after an accepted event ": {deposit(id, "bob", 3), deposit(id, "alice", -20)},
	} {
		_, err := l.Append(evs...)
		require.ErrorIs(t, err, store.ErrRejected, name)
		require.ErrorIs(t, err, errOverdraft, name)
		require.Equal(t, nextLSN, sh.NextLSN(), "%s: an LSN was taken", name)
		require.Equal(t, before, segBytes(), "%s: the WAL grew", name)
		hwm, _, _, err := sh.Store().Tracker().Get(id)
		require.NoError(t, err)
		require.Equal(t, session.SeqNo(1), hwm, "%s: the HWM moved", name)
	}
	h, err := l.Append(deposit(id, "alice", -4))
	require.NoError(t, err)
	evs := readLog(t, walDir, 0)
	require.Len(t, evs, 2)
	require.Equal(t, session.SeqNo(2), evs[1].Seq, "the next append must reuse the refused SeqNo")
	require.Equal(t, h.FirstLSN, evs[1].LSN)

	// 6 left: of 12 concurrent withdrawals of 1, exactly 6 pass.
	var wg sync.WaitGroup
	var passed, refused atomic.Int64
	for range 12 {
		wg.Go(func() {
			_, err := l.Append(deposit(session.NewID(), "alice", -1))
			switch {
			case err == nil:
				passed.Add(1)
			case errors.Is(err, store.ErrRejected):
				refused.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(6), passed.Load())
	require.Equal(t, int64(6), refused.Load())
	require.Zero(t, lagged.Load(), "Validate judged a store behind the log")

	// Validate judges what Apply will get: a client's retry of a
	// withdrawal that was applied dies in the window, so it is not judged
	// against the balance that withdrawal left.
	withdraw := deposit(id, "carol", -5)
	withdraw.HasIdemKey, withdraw.IdemKey = true, idempotency.ClientKey([]byte("withdraw-1"))
	_, err = l.Append(deposit(id, "carol", 5))
	require.NoError(t, err)
	_, err = l.Append(withdraw)
	require.NoError(t, err)
	_, err = l.Append(withdraw)
	require.NoError(t, err, "a retry was judged as a new withdrawal")
	require.Equal(t, bankOracle(t, walDir), replicaState(t, sh.Store().View()))
	require.NotContains(t, replicaState(t, sh.Store().View()), string(rejKey(h.FirstLSN)))
}

// replica is a follower served from tr until its Serve returns.
type replica struct {
	f    *follower.Follower
	stop context.CancelFunc
	done chan error
}

// warnings is a slog.Handler counting the records at Warn and above.
type warnings struct{ n atomic.Int64 }

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(context.Context, slog.Record) error    { w.n.Add(1); return nil }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnings) WithGroup(string) slog.Handler                { return w }

func serveReplica(t *testing.T, dir, id string, a store.Applier, tr *inprocess.Transport, log *slog.Logger) *replica {
	t.Helper()
	if log == nil {
		log = discard()
	}
	f, err := follower.Open(dir, &follower.Options{Store: store.Options{ID: id, Applier: a, Logger: log}, ReconnectBackoff: time.Millisecond, MaxReconnectBackoff: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	r := &replica{f: f, stop: stop, done: make(chan error, 1)}
	go func() { r.done <- f.Serve(ctx, tr) }()
	return r
}

// wait returns what Serve returned. The bound only turns a Serve that
// never ends (the bug) into a failure instead of a hung test binary.
func (r *replica) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return")
		return nil
	}
}

func (r *replica) close(t *testing.T) {
	t.Helper()
	r.stop()
	r.wait(t)
	require.NoError(t, r.f.Close())
}

func TestApplierFailsThenFixed(t *testing.T) {
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panics=%v", panics), func(t *testing.T) { applierFailsThenFixed(t, panics) })
	}
}

// applierFailsThenFixed: an Applier that fails (or panics) on one batch
// stops the shard with ErrApply — the leader's log fails, every later
// append too; a follower whose Applier fails the same way stops serving
// after one refusal, while a healthy one applies the batch — and nothing
// wedges: the leader with the broken Applier refuses to open with the same
// typed error, with the fixed one it re-applies its WAL and serves, and
// the follower restarted with the fixed Applier catches up. Every replica
// then equals an oracle that applies each logged event once.
func applierFailsThenFixed(t *testing.T, panics bool) {
	dir := t.TempDir()
	var leaderBroken, f1Broken atomic.Bool
	o := &leader.Options{Shards: 1, Followers: []string{"f1", "f2"}, Logger: discard(), RetentionInterval: time.Hour,
		Store: store.Options{Applier: bank{fail: &leaderBroken, panics: panics}}}
	tr := inprocess.New(inprocess.FaultsNone, 1)
	defer tr.Close()
	o.Listener = func(uint32) replication.Listener { return tr }
	l := open(t, dir, o)
	ctx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- l.Run(ctx) }()
	f1Dir, f2Dir := filepath.Join(t.TempDir(), "f1"), filepath.Join(t.TempDir(), "f2")
	f1 := serveReplica(t, f1Dir, "f1", bank{fail: &f1Broken, panics: panics}, tr, nil)
	f2 := serveReplica(t, f2Dir, "f2", bank{}, tr, nil)

	ids := []session.ID{session.NewID(), session.NewID(), session.NewID()}
	for i := range 30 {
		// Every third a withdrawal that may overdraw: rejections recorded.
		_, err := l.Append(deposit(ids[i%3], fmt.Sprint("acct", i%4), int64(i%7)-int64(3*(i%3))))
		require.NoError(t, err)
	}
	require.NoError(t, l.WaitAcked(ctx, leader.AckAll))

	leaderBroken.Store(true)
	f1Broken.Store(true)
	sh, _ := l.Shard(0)
	poisonLSN := sh.NextLSN()
	_, err := l.Append(deposit(ids[0], "poison", 1))
	require.ErrorIs(t, err, leader.ErrLogFailed)
	require.ErrorIs(t, err, store.ErrApply)
	if panics {
		require.ErrorIs(t, err, store.ErrApplierPanic)
	} else {
		require.ErrorIs(t, err, errPoison)
	}
	_, err = l.Append(deposit(ids[1], "acct0", 1))
	require.ErrorIs(t, err, leader.ErrLogFailed, "an append after the failure")
	require.ErrorIs(t, err, store.ErrApply)
	stopRun()
	require.NoError(t, <-runDone)
	require.NoError(t, l.Close())
	f1.close(t)
	f2.close(t)

	// The broken Applier: the leader refuses to open, typed, and changes
	// nothing (the store is where it was); the fixed one re-applies the
	// WAL and serves.
	_, err = leader.Open(dir, o)
	require.ErrorIs(t, err, store.ErrApply)
	require.ErrorContains(t, err, "fix the Applier")
	leaderBroken.Store(false)
	tr2 := inprocess.New(inprocess.FaultsNone, 2)
	defer tr2.Close()
	o.Listener = func(uint32) replication.Listener { return tr2 }
	l = open(t, dir, o)
	defer l.Close()
	sh, _ = l.Shard(0)
	require.Equal(t, poisonLSN+1, sh.NextLSN())
	ctx, stopRun = context.WithCancel(context.Background())
	defer stopRun()
	go func() { runDone <- l.Run(ctx) }()
	for i := range 10 {
		_, err := l.Append(deposit(ids[i%3], fmt.Sprint("acct", i%4), int64(i%5)-2))
		require.NoError(t, err)
	}

	// f1, still broken, meets the batch the leader logged: Serve stops
	// with the typed error after one refusal instead of having the batch
	// resent for ever; f2 applies it.
	var logged warnings
	f1 = serveReplica(t, f1Dir, "f1", bank{fail: &f1Broken, panics: panics}, tr2, slog.New(&logged))
	f2 = serveReplica(t, f2Dir, "f2", bank{}, tr2, nil)
	err = f1.wait(t)
	require.ErrorIs(t, err, store.ErrApply)
	require.ErrorContains(t, err, "fix the Applier")
	require.Equal(t, uint64(1), f1.f.Stats().Receiver.ApplyErrors)
	// Reported once: the stop (and, for a panic, its stack).
	wantLogged := int64(1)
	if panics {
		wantLogged = 2
	}
	require.Equal(t, wantLogged, logged.n.Load())
	lsn, _ := f1.f.Position()
	require.Equal(t, poisonLSN-1, lsn)
	require.NoError(t, f1.f.Close())
	require.NoError(t, sh.WaitAcked(ctx, sh.NextLSN()-1, leader.AckOne))
	// Restarted with the fixed Applier, f1 goes on from its position.
	f1Broken.Store(false)
	f1 = serveReplica(t, f1Dir, "f1", bank{fail: &f1Broken, panics: panics}, tr2, nil)
	require.NoError(t, l.WaitAcked(ctx, leader.AckAll))

	want := bankOracle(t, l.WALDir())
	require.Contains(t, want, "acct/poison")
	require.NotEmpty(t, func() []string {
		var rej []string
		for k := range want {
			if k[:4] == "rej/" {
				rej = append(rej, k)
			}
		}
		return rej
	}(), "the workload must record rejections")
	require.Equal(t, want, replicaState(t, sh.Store().View()), "leader")
	require.Equal(t, want, replicaState(t, f1.f.View()), "f1")
	require.Equal(t, want, replicaState(t, f2.f.View()), "f2")
	f1.close(t)
	f2.close(t)
}

// TestValidatePanics: a Validate that panics refuses the append with
// ErrApply wrapping ErrApplierPanic, logs nothing, and leaves the log
// serving: nothing was written, so nothing disagrees.
func TestValidatePanics(t *testing.T) {
	dir := t.TempDir()
	var lagged atomic.Int64
	l := open(t, dir, &leader.Options{Shards: 1, Store: store.Options{Applier: guarded{bank: bank{panics: true}, lagged: &lagged}}})
	defer l.Close()
	id := session.NewID()
	_, err := l.Append(deposit(id, "poison", 1))
	require.ErrorIs(t, err, store.ErrApply)
	require.ErrorIs(t, err, store.ErrApplierPanic)
	require.NotErrorIs(t, err, leader.ErrLogFailed)
	require.Empty(t, readLog(t, l.WALDir(), 0))
	h, err := l.Append(deposit(id, "alice", 1))
	require.NoError(t, err)
	require.Equal(t, uint64(1), h.FirstLSN)
}

// TestValidatorRejectsCommit: a Commit (the operation's events and its
// complete record in one batch) refused by Validate logs nothing, neither
// effect nor outcome; the claim stays the caller's, and Fail records the
// rejection for the request's retries to replay. Validate sees only the
// operation's events, never the ledger records.
func TestValidatorRejectsCommit(t *testing.T) {
	var lagged atomic.Int64
	l := open(t, t.TempDir(), &leader.Options{Shards: 1, Store: store.Options{Applier: guarded{lagged: &lagged}}})
	defer l.Close()
	sh, _ := l.Shard(0)
	id := session.NewID()
	c, err := sh.Ledger().Claim("payments", "pay-1", []byte("take 5"))
	require.NoError(t, err)
	next := sh.NextLSN()
	_, err = sh.Commit(c, []byte("paid"), deposit(id, "alice", -5))
	require.ErrorIs(t, err, store.ErrRejected)
	require.ErrorIs(t, err, errOverdraft)
	require.Equal(t, next, sh.NextLSN(), "a refused commit was logged")
	require.NoError(t, sh.Ledger().Fail(c, []byte("overdraft"), 0))

	retry, err := sh.Ledger().Claim("payments", "pay-1", []byte("take 5"))
	require.NoError(t, err)
	require.True(t, retry.Replayed)
	require.True(t, retry.CachedFailure)
	require.Equal(t, "overdraft", string(retry.Outcome))
	for _, ev := range readLog(t, l.WALDir(), 0) {
		require.True(t, ev.Op.IsLedger(), "an effect of the refused commit was logged: %+v", ev)
	}
}

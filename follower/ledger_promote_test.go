package follower_test

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/internal/leaderhook"
	"github.com/oncewal/oncewal/store"

	"github.com/oncewal/oncewal/leader"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// promotePair is a leader A with follower B, both on in-memory stores, and a
// wall clock the test moves by hand (waiting claims recheck it every ms).
type promotePair struct {
	t    *testing.T
	dir  string
	wall atomic.Int64
	a, b *follower.Follower
	la   *leader.LedgerLog
}

var handClock = idempotency.LedgerOptions{WaitRecheck: time.Millisecond}

func newPromotePair(t *testing.T) *promotePair {
	p := &promotePair{t: t, dir: t.TempDir()}
	p.wall.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	var err error
	p.a, err = follower.Open("a", testOptions(vfs.NewMem()))
	require.NoError(t, err)
	p.la, err = leader.Promote(retire(p.t, p.a), leader.PromoteOptions{WALDir: filepath.Join(p.dir, "a-wal"), Wall: p.now, Ledger: handClock})
	require.NoError(t, err)
	p.b, err = follower.Open("b", testOptions(vfs.NewMem()))
	require.NoError(t, err)
	t.Cleanup(func() {
		if p.la != nil {
			_ = p.la.Close()
		}
		_ = drill.Kill(p.a)
		_ = drill.Kill(p.b)
	})
	return p
}

func (p *promotePair) now() int64 { return p.wall.Load() }

// ship feeds B everything A logged so far.
func (p *promotePair) ship() {
	rd, err := wal.OpenReader(filepath.Join(p.dir, "a-wal"), 0)
	require.NoError(p.t, err)
	defer rd.Close()
	from, _ := p.b.Position()
	require.NoError(p.t, rd.Seek(from+1))
	for {
		_, raw, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(p.t, err)
		_, err = p.b.Apply(raw)
		require.NoError(p.t, err)
	}
}

// promote kills A and promotes B.
func (p *promotePair) promote() *leader.LedgerLog {
	require.NoError(p.t, p.la.Close())
	p.la = nil
	require.NoError(p.t, drill.Kill(p.a))
	lb, err := leader.Promote(retire(p.t, p.b), leader.PromoteOptions{WALDir: filepath.Join(p.dir, "b-wal"), Wall: p.now, Epoch: 2, Ledger: handClock})
	require.NoError(p.t, err)
	p.t.Cleanup(func() { _ = lb.Close() })
	return lb
}

// TestPromotionKeepsExtendedLease: A's owner works past the default lease,
// extending it; A dies mid-request after its extensions reached B. The
// promoted B holds the claim until the extended lease end — past the
// original one — then frees it on the WAL clock: a waiting duplicate on B
// gets the key only then, and executes the request once.
func TestPromotionKeepsExtendedLease(t *testing.T) {
	p := newPromotePair(t)
	c, err := p.la.Ledger().Claim("client", "req-1", []byte("add 5"))
	require.NoError(t, err)
	original := c.LeaseEnd
	var end int64
	for range 3 { // 2 minutes of work, a heartbeat every 40 s
		p.wall.Add(int64(40 * time.Second))
		end, err = p.la.Ledger().Extend(c, 0)
		require.NoError(t, err)
	}
	require.Greater(t, end, original+int64(time.Minute))
	p.ship()
	lb := p.promote()

	// Past the original lease end, B still holds A's extended claim.
	p.wall.Store(original + int64(time.Second))
	in, err := lb.Ledger().Claim("client", "req-1", []byte("add 5"))
	require.NoError(t, err)
	require.Equal(t, idempotency.InFlight, in.Status, "the promoted leader keeps the owner's extended lease")
	require.Equal(t, end, in.LeaseEnd)
	require.Equal(t, c.Token, in.Token)
	// A's owner cannot settle or extend on B: its claim is A's.
	_, err = lb.Ledger().Extend(c, 0)
	require.ErrorIs(t, err, idempotency.ErrNotOwner)
	_, err = leaderhook.Commit(lb, c, []byte("late"), wal.Event{Op: wal.OpAdd, Session: session.ID{1}, Key: []byte("n"), Delta: 5})
	require.ErrorIs(t, err, idempotency.ErrNotOwner)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan *idempotency.Claim, 1)
	go func() {
		c, err := lb.Ledger().ClaimWith(ctx, "client", "req-1", []byte("add 5"), idempotency.ClaimOptions{Wait: true})
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	for lb.Ledger().Waiting() < 1 {
		time.Sleep(50 * time.Microsecond)
	}
	p.wall.Store(end - int64(time.Millisecond))
	time.Sleep(5 * time.Millisecond) // several rechecks, still before the extended end
	select {
	case c := <-got:
		t.Fatalf("waiting claim returned %v before the extended lease ended", c.Status)
	default:
	}
	p.wall.Store(end)
	fresh := <-got
	require.NotNil(t, fresh)
	require.Equal(t, idempotency.Fresh, fresh.Status)
	_, err = leaderhook.Commit(lb, fresh, []byte("n=5"), wal.Event{Op: wal.OpAdd, Session: session.ID{1}, Key: []byte("n"), Delta: 5})
	require.NoError(t, err)
	n, err := p.b.State().Counter(session.ID{1}, []byte("n"))
	require.NoError(t, err)
	require.Equal(t, int64(5), n, "executed once")
}

// TestWaitingClaimReleasedByOwnersCrash: a duplicate waits on the leader
// while the owner works; the owner's process crashes (it never settles).
// The waiting claim gets the key when the lease ends on the WAL clock — on
// the leader, and on a follower promoted after the leader died too, whose
// waiting claims know the claim only from the replicated table.
func TestWaitingClaimReleasedByOwnersCrash(t *testing.T) {
	p := newPromotePair(t)
	waitFor := func(l *leader.LedgerLog, key string) <-chan *idempotency.Claim {
		ch := make(chan *idempotency.Claim, 1)
		go func() {
			c, err := l.Ledger().ClaimWith(context.Background(), "client", key, []byte("p"), idempotency.ClaimOptions{Wait: true})
			if err != nil && !errors.Is(err, idempotency.ErrClosed) {
				t.Error(err)
			}
			ch <- c
		}()
		for l.Ledger().Waiting() < 1 {
			time.Sleep(50 * time.Microsecond)
		}
		return ch
	}
	// On the leader.
	owner, err := p.la.Ledger().Claim("client", "k1", []byte("p"))
	require.NoError(t, err)
	w := waitFor(p.la, "k1")
	p.wall.Store(owner.LeaseEnd)
	c := <-w
	require.Equal(t, idempotency.Fresh, c.Status)
	require.NoError(t, p.la.Ledger().Release(c))

	// Across a promotion: the duplicate waiting on A sees A close; retried
	// on B it waits again, for the lease B inherited.
	owner, err = p.la.Ledger().Claim("client", "k2", []byte("p"))
	require.NoError(t, err)
	w = waitFor(p.la, "k2")
	p.ship()
	lb := p.promote()
	require.Nil(t, <-w, "A's ledger closed under the waiting claim")
	w = waitFor(lb, "k2")
	p.wall.Store(owner.LeaseEnd - int64(time.Second)) // (each recheck ticks the WAL clock by 1ns)
	time.Sleep(5 * time.Millisecond)
	select {
	case c := <-w:
		t.Fatalf("waiting claim on B returned %v before the lease ended", c.Status)
	default:
	}
	p.wall.Store(owner.LeaseEnd)
	c = <-w
	require.Equal(t, idempotency.Fresh, c.Status)
	require.GreaterOrEqual(t, c.Time, owner.LeaseEnd)
}

// retire hands f's store over for a promotion (follower.Follower.Retire).
func retire(t testing.TB, f *follower.Follower) *store.Store {
	t.Helper()
	st, err := f.Retire()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

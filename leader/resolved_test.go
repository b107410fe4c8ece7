package leader_test

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
	"github.com/oncewal/oncewal/testutil"
	"github.com/oncewal/oncewal/wal"
)

// txnResolver resolves t for principal in session sid and records the
// result's Succeeded and first op's value as the outcome.
func txnResolver(principal string, sid session.ID, t *kv.Txn) leader.Resolver {
	return func(r kv.Reader, first uint64) ([]wal.Event, []byte, error) {
		events, res, err := kv.Resolve(r, principal, t, sid, first)
		if err != nil {
			return nil, nil, err
		}
		out := fmt.Sprintf("succeeded=%v", res.Succeeded)
		if len(res.Ops) > 0 {
			out += fmt.Sprintf(" value=%x version=%d", res.Ops[0].Value, res.Ops[0].Version)
		}
		return events, []byte(out), nil
	}
}

// TestCommitResolvedSeesEveryEarlierBatch: concurrent transactions on one
// key, group-committed, each judged against the state after every batch
// logged before its own (the overlay of logged-but-unapplied rows): 64
// adds make 64 and versions 1..64, and of 16 "create if absent" exactly
// one succeeds. A follower fed the log holds the same rows.
func TestCommitResolvedSeesEveryEarlierBatch(t *testing.T) {
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	walDir := t.TempDir()
	st := kvOf(t, a)
	l, err := leader.OpenLedgerLog(&leader.LedgerLogOptions{
		WALDir: walDir, Epoch: 1, DB: a.db, Tracker: a.tracker, Window: a.window, Table: a.table, State: a.state,
		KV: st, Wall: testutil.NewClock().Now,
	})
	require.NoError(t, err)
	defer l.Close()
	var wg sync.WaitGroup
	versions := make([]string, 64)
	for i := range 64 {
		wg.Go(func() {
			c := mustClaim(t, l, fmt.Sprintf("add-%d", i))
			_, out, err := l.CommitResolved(c, txnResolver("bank", session.ID{byte(i % 4), 1}, &kv.Txn{Then: []kv.Op{{Kind: kv.Add, Key: []byte("n"), Delta: 1}}}))
			require.NoError(t, err)
			versions[i] = string(out)
		})
	}
	created := make([]bool, 16)
	for i := range 16 {
		wg.Go(func() {
			c := mustClaim(t, l, fmt.Sprintf("create-%d", i))
			_, out, err := l.CommitResolved(c, txnResolver("bank", session.ID{9, byte(i)}, &kv.Txn{
				If:   []kv.Compare{{Key: []byte("owner"), Target: kv.TargetExists, Result: kv.Equal, Number: 0}},
				Then: []kv.Op{{Kind: kv.Put, Key: []byte("owner"), Value: []byte{byte(i)}}},
			}))
			require.NoError(t, err)
			created[i] = string(out) != "succeeded=false"
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, v := range versions {
		require.False(t, seen[v], "two adds answered %s", v)
		seen[v] = true
	}
	row, found, err := st.Get(kv.Scoped("bank", []byte("n")))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, int64(64), int64(binary.LittleEndian.Uint64(row.Value)))
	require.Equal(t, uint64(64), row.Version)
	n := 0
	for _, c := range created {
		if c {
			n++
		}
	}
	require.Equal(t, 1, n, "exactly one create-if-absent succeeds")

	b := openNode(t, vfs.NewMem())
	defer b.db.Close()
	shipAll(t, walDir, 1, b.receiver())
	for _, k := range []string{"n", "owner"} {
		want, _, err := st.Get(kv.Scoped("bank", []byte(k)))
		require.NoError(t, err)
		got, found, err := kvOf(t, b).Get(kv.Scoped("bank", []byte(k)))
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, want, got, "the follower's row of %s", k)
	}
}

// TestCommitResolvedRefusal: a resolver's error logs nothing and leaves
// the claim with the caller.
func TestCommitResolvedRefusal(t *testing.T) {
	a := openNode(t, vfs.NewMem())
	defer a.db.Close()
	l, err := leader.OpenLedgerLog(&leader.LedgerLogOptions{
		WALDir: t.TempDir(), Epoch: 1, DB: a.db, Tracker: a.tracker, Window: a.window, Table: a.table, State: a.state,
		KV: kvOf(t, a), Wall: testutil.NewClock().Now,
	})
	require.NoError(t, err)
	defer l.Close()
	c := mustClaim(t, l, "bad")
	next := l.Writer().NextLSN()
	_, _, err = l.CommitResolved(c, txnResolver("bank", session.ID{1}, &kv.Txn{Then: []kv.Op{{Kind: kv.Add, Key: []byte("n"), Delta: 1}, {Kind: kv.Add, Key: []byte("n"), Delta: 1 << 62}, {Kind: kv.Add, Key: []byte("n"), Delta: 1 << 62}}}))
	require.ErrorIs(t, err, kv.ErrOverflow)
	require.Equal(t, next, l.Writer().NextLSN(), "nothing logged")
	require.NoError(t, l.Ledger().Release(c), "the claim is still the caller's")
}

// kvOf reads n's committed key space as the leader's store does.
func kvOf(t *testing.T, n *node) kv.Reader {
	return store.KVReaderOf(n.db)
}

package leader_test

import (
	"testing"

	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
	"github.com/stretchr/testify/require"
)

// TestAppendAfterClose: a closed leader refuses with wal.ErrLogClosed, the
// error its doc promises.
func TestAppendAfterClose(t *testing.T) {
	l := open(t, t.TempDir(), &leader.Options{Shards: 2})
	ev := wal.Event{Op: wal.OpPut, Session: session.NewID(), Key: []byte("k")}
	_, err := l.Append(ev)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	_, err = l.Append(ev)
	require.ErrorIs(t, err, wal.ErrLogClosed)
}

package replication_test

import (
	"context"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/replication"
	"github.com/stretchr/testify/require"
)

// TestValidFollowerID: 1..MaxFollowerIDLen bytes of [A-Za-z0-9._-], or
// empty (anonymous); anything else is ErrBadFollowerID.
func TestValidFollowerID(t *testing.T) {
	for _, id := range []string{"", "a", "replica-1", "eu.west_2", strings.Repeat("x", replication.MaxFollowerIDLen)} {
		require.NoError(t, replication.ValidFollowerID(id), "%q", id)
	}
	for _, id := range []string{" ", "a b", "a/b", "ü", "a\x00", "a:b", strings.Repeat("x", replication.MaxFollowerIDLen+1)} {
		require.ErrorIs(t, replication.ValidFollowerID(id), replication.ErrBadFollowerID, "%q", id)
	}
}

// endRecorder is a LeaderConn that records how it was ended.
type endRecorder struct {
	closed bool
	reason error
}

func (c *endRecorder) Send(context.Context, []byte) error            { return nil }
func (c *endRecorder) Recv(context.Context) (replication.Ack, error) { return replication.Ack{}, nil }
func (c *endRecorder) Close() error                                  { c.closed = true; return nil }

type refusingRecorder struct{ endRecorder }

func (c *refusingRecorder) Refuse(reason error) error { c.reason = reason; return nil }

// TestEndConn: a connection whose transport carries reasons is refused with
// the reason (the follower learns why); any other is closed.
func TestEndConn(t *testing.T) {
	r := &refusingRecorder{}
	replication.EndConn(r, replication.ErrDuplicateFollower)
	require.ErrorIs(t, r.reason, replication.ErrDuplicateFollower)
	require.False(t, r.closed, "refused, not closed")

	c := &endRecorder{}
	replication.EndConn(c, replication.ErrDuplicateFollower)
	require.True(t, c.closed)
}

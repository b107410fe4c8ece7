package clientapi_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/internal/clientwire"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
)

// TestRetryAcrossLeaderRestart: a request answered OK is replayed, not run
// again, by the service of the same leader directory reopened; a closed
// leader's service answers Unavailable, never a panic.
func TestRetryAcrossLeaderRestart(t *testing.T) {
	dir := t.TempDir()
	lo := &leader.Options{Shards: 2, Logger: quiet(), Store: store.Options{Logger: quiet()}}
	open := func() (*leader.Leader, *clientapi.Service) {
		l, err := leader.Open(dir, lo)
		require.NoError(t, err)
		svc, err := clientapi.New(l, &clientapi.Options{Logger: quiet()})
		require.NoError(t, err)
		return l, svc
	}
	ctx := context.Background()
	l, svc := open()
	opened := svc.OpenSession(&clientwire.OpenSessionRequest{})
	require.Equal(t, clientwire.OK, opened.Code)
	req := &clientwire.SubmitRequest{Session: opened.Session, RequestID: "pay-1", Payload: ops(add("n", 5))}
	first := svc.Submit(ctx, "liz", req)
	require.Equal(t, clientwire.OK, first.Code, first.Message)
	require.NoError(t, l.Close())

	closed := svc.Submit(ctx, "liz", req)
	require.Equal(t, clientwire.Unavailable, closed.Code, closed.Message)
	require.Contains(t, closed.Message, "retry with the same request ID")
	require.Equal(t, clientwire.Unavailable, svc.Status("liz", &clientwire.StatusRequest{Session: opened.Session, RequestID: "pay-1"}).Code)
	require.Equal(t, clientwire.Unavailable, svc.OpenSession(&clientwire.OpenSessionRequest{}).Code)

	l, svc = open()
	defer l.Close()
	again := svc.Submit(ctx, "liz", req)
	require.Equal(t, clientwire.Replay, again.Code, again.Message)
	require.GreaterOrEqual(t, again.LSN, first.LSN)
	sid := session.ID(opened.Session)
	n, err := l.For(sid).Store().State().Counter(sid, []byte("n"))
	require.NoError(t, err)
	require.Equal(t, int64(5), n, "ran once across the restart")
}

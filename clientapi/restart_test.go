package clientapi_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncewal/oncewal/clientapi"
	"github.com/oncewal/oncewal/leader"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
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
	opened := svc.OpenSession(&clientv1.OpenSessionRequest{})
	require.Equal(t, clientv1.Code_OK, opened.Code)
	req := &clientv1.SubmitRequest{Session: opened.Session[:], RequestId: "pay-1", Payload: ops(add("n", 5))}
	first := svc.Submit(ctx, "liz", req)
	require.Equal(t, clientv1.Code_OK, first.Code, first.Message)
	require.NoError(t, l.Close())

	closed := svc.Submit(ctx, "liz", req)
	require.Equal(t, clientv1.Code_UNAVAILABLE, closed.Code, closed.Message)
	require.Contains(t, closed.Message, "retry with the same request ID")
	require.Equal(t, clientv1.Code_UNAVAILABLE, svc.Status("liz", &clientv1.StatusRequest{Session: opened.Session[:], RequestId: "pay-1"}).Code)
	require.Equal(t, clientv1.Code_UNAVAILABLE, svc.OpenSession(&clientv1.OpenSessionRequest{}).Code)

	l, svc = open()
	defer l.Close()
	again := svc.Submit(ctx, "liz", req)
	require.Equal(t, clientv1.Code_REPLAY, again.Code, again.Message)
	require.GreaterOrEqual(t, again.Lsn, first.Lsn)
	sid := session.ID(opened.Session)
	n, err := l.For(sid).Store().State().Counter(sid, []byte("n"))
	require.NoError(t, err)
	require.Equal(t, int64(5), n, "ran once across the restart")
}

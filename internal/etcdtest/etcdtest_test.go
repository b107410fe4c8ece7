package etcdtest

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestStartServesAClient: the member started answers a client's put and get.
func TestStartServesAClient(t *testing.T) {
	ep := Start(t)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	r, err := c.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("get k = %v, want v", r.Kvs)
	}
}

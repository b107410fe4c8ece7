package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/oncewal/oncewal/coord"
	"github.com/oncewal/oncewal/node"
)

// errEtcdUnreachable: etcd did not answer within --etcd-dial-timeout when a
// command that needs it started; the command stopped before it wrote or
// served anything.
var errEtcdUnreachable = errors.New("etcd unreachable: start it, or check --etcd and the network (nothing was changed)")

// etcdFlags are the flags that name a cluster in etcd, shared by node and
// members.
type etcdFlags struct {
	endpoints, cluster, prefix *string
	dialTimeout                *time.Duration
}

func addEtcdFlags(fs *flag.FlagSet) *etcdFlags {
	return &etcdFlags{
		endpoints:   fs.String("etcd", "", "comma-separated etcd client URLs (http://host:port), required"),
		cluster:     fs.String("cluster", "", "the cluster's name in etcd (its keys live under PREFIX/NAME/), required; no '/'"),
		prefix:      fs.String("etcd-prefix", coord.DefaultPrefix, "root of oncewal's keys in etcd"),
		dialTimeout: fs.Duration("etcd-dial-timeout", coord.DefaultDialTimeout, "give up when etcd does not answer within this long at start"),
	}
}

// list returns --etcd's endpoints.
func (f *etcdFlags) list() []string {
	var eps []string
	for _, e := range strings.Split(*f.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	return eps
}

func (f *etcdFlags) check(c *flagCheck) {
	if len(f.list()) == 0 {
		c.failf("--etcd is required: etcd's client URLs (e.g. http://127.0.0.1:2379)")
	}
	switch {
	case *f.cluster == "":
		c.failf("--cluster is required: the cluster's name in etcd, the same on every member")
	case strings.Contains(*f.cluster, "/"):
		c.failf("--cluster %q holds a '/': give a plain name", *f.cluster)
	}
	if !strings.HasPrefix(*f.prefix, "/") {
		c.failf("--etcd-prefix %q: give an absolute key prefix such as %s", *f.prefix, coord.DefaultPrefix)
	}
	inRange(c, "etcd-dial-timeout", *f.dialTimeout, time.Millisecond, time.Hour)
}

// open connects to etcd with terms of leaseTTL (0: the default) and reads
// the cluster's members within --etcd-dial-timeout: the etcd client
// connects lazily, so without this read an unreachable etcd would only show
// as a node that never campaigns.
func (f *etcdFlags) open(log *slog.Logger, leaseTTL time.Duration) (*coord.Etcd, node.Members, error) {
	c, err := coord.NewEtcd(&coord.EtcdOptions{Endpoints: f.list(), Prefix: *f.prefix, LeaseTTL: leaseTTL,
		DialTimeout: *f.dialTimeout, Logger: log})
	if err != nil {
		return nil, node.Members{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *f.dialTimeout)
	defer cancel()
	m, err := node.ReadMembers(ctx, c, *f.cluster)
	if err != nil {
		_ = c.Close()
		if ctx.Err() != nil || errors.Is(err, coord.ErrUnavailable) {
			return nil, node.Members{}, fmt.Errorf("%w: %s did not answer within %v: %w", errEtcdUnreachable, *f.endpoints, *f.dialTimeout, err)
		}
		return nil, node.Members{}, err
	}
	return c, m, nil
}

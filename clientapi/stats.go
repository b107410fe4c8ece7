package clientapi

import (
	"sync/atomic"

	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
)

// Stats counts what the service answered: per method, the replies by code
// (codes without a reply are absent), and the calls refused before a
// reply — for their caller's identity (Unauthenticated, PermissionDenied)
// or an undecodable request (InvalidArgument).
type Stats struct {
	Submit, Status, OpenSession, Txn, Get, Range map[clientv1.Code]uint64
	Denied, Malformed                            uint64
}

// numCodes bounds the codes counted; a code beyond it (none today) is
// counted as the last.
const numCodes = 16

type codeCounts [numCodes]atomic.Uint64

func (c *codeCounts) add(code clientv1.Code) { c[min(int(code), numCodes-1)].Add(1) }

func (c *codeCounts) snapshot() map[clientv1.Code]uint64 {
	m := map[clientv1.Code]uint64{}
	for i := range c {
		if n := c[i].Load(); n > 0 {
			m[clientv1.Code(i)] = n
		}
	}
	return m
}

type counters struct {
	submit, status, open, txn, get, rng codeCounts
	denied, malformed                   atomic.Uint64
}

// Stats returns a snapshot of the counters.
func (s *Service) Stats() Stats {
	c := &s.stats
	return Stats{Submit: c.submit.snapshot(), Status: c.status.snapshot(), OpenSession: c.open.snapshot(),
		Txn: c.txn.snapshot(), Get: c.get.snapshot(), Range: c.rng.snapshot(),
		Denied: c.denied.Load(), Malformed: c.malformed.Load()}
}

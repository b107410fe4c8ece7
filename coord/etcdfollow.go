package coord

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// retryPause paces a follower's reads and a lease keeper's renewals while
// etcd does not answer: both are cheap, and a change should be seen (a
// lease renewed) soon after etcd returns.
const retryPause = 200 * time.Millisecond

// followed is what a follower keeps of a key.
type followed struct {
	value  []byte
	create int64
}

// follow keeps the keys under pfx as etcd has them and reports view(keys)
// to ch whenever it differs from the last report (invariants 5 and 8): a
// Get, then a watch from the revision after it, whose events are applied
// to the keys. A watch that breaks (compacted past, cancelled by etcd,
// etcd without a leader) is not trusted to resume: the keys are read
// again and a new watch starts from that read. It returns when ctx ends.
//
// Reports are sent from the same loop that drains the watch, so a slow
// reader holds up no event: it gets the latest view when it reads.
func follow[T any](ctx context.Context, cli *clientv3.Client, pfx string, ch chan<- T,
	view func(map[string]followed) T, equal func(a, b T) bool) {
	var last, pending T
	sent, has := false, false
	update := func(kvs map[string]followed) {
		v := view(kvs)
		pending, has = v, !sent || !equal(v, last)
	}
	for ctx.Err() == nil {
		r, err := cli.Get(ctx, pfx, clientv3.WithPrefix())
		if err != nil {
			pause(ctx)
			continue
		}
		kvs := make(map[string]followed, len(r.Kvs))
		for _, kv := range r.Kvs {
			kvs[string(kv.Key)] = followed{kv.Value, kv.CreateRevision}
		}
		update(kvs)
		// WithRequireLeader: a member cut from etcd's quorum cancels the
		// watch instead of serving a stale one in silence.
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := cli.Watch(wctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision+1))
		broken := false
		for !broken && ctx.Err() == nil {
			var out chan<- T
			if has {
				out = ch
			}
			select {
			case out <- pending:
				last, sent, has = pending, true, false
			case wr, ok := <-wch:
				if !ok || wr.Err() != nil || wr.Canceled {
					broken = true
					break
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						delete(kvs, string(ev.Kv.Key))
					} else {
						kvs[string(ev.Kv.Key)] = followed{ev.Kv.Value, ev.Kv.CreateRevision}
					}
				}
				if len(wr.Events) > 0 {
					update(kvs)
				}
			case <-ctx.Done():
			}
		}
		wcancel()
		if broken {
			pause(ctx)
		}
	}
}

// pause waits retryPause or until ctx ends.
func pause(ctx context.Context) {
	t := time.NewTimer(retryPause)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// leaderView is Observe's view of the election keys: the one created
// first leads (invariant 5).
func leaderView(pfx string) func(map[string]followed) Leader {
	return func(kvs map[string]followed) Leader {
		var key string
		var first followed
		for k, kv := range kvs {
			if key == "" || kv.create < first.create {
				key, first = k, kv
			}
		}
		if key == "" {
			return Leader{}
		}
		var who Candidate
		if json.Unmarshal(first.value, &who) != nil {
			// Not a candidate's value: still the key that leads.
			who = Candidate{ID: strings.TrimPrefix(key, pfx)}
		}
		return Leader{Candidate: who, Epoch: uint64(first.create)}
	}
}

// dataView is Watch's view: the keys relative to the data space.
func dataView(space string) func(map[string]followed) map[string][]byte {
	return func(kvs map[string]followed) map[string][]byte {
		out := make(map[string][]byte, len(kvs))
		for k, kv := range kvs {
			// Cloned: each report is its reader's own.
			out[strings.TrimPrefix(k, space)] = bytes.Clone(kv.value)
		}
		return out
	}
}

func equalData(a, b map[string][]byte) bool { return maps.EqualFunc(a, b, bytes.Equal) }

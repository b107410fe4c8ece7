package sim

import (
	"fmt"

	onode "github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/store"
)

// verify checks the four invariants of an election run on every member's
// stores, once every member stopped (package documentation, "Elections").
func (r *erun) verify() {
	r.checkTerms()
	res := r.res
	stores := make([][]*store.Store, len(r.members))
	defer func() {
		for _, ss := range stores {
			for _, st := range ss {
				if st != nil {
					_ = st.Close()
				}
			}
		}
	}()
	for i, m := range r.members {
		for s := range uint32(r.cfg.Shards) {
			dir := store.ShardDir(m.mem.PathJoin(m.dir, onode.ReplicaDirName), s)
			st, err := store.Open(dir, &store.Options{FS: m.mem, Shard: s, ID: m.id, WindowCapacity: electionWindow,
				Logger: discard, PebbleOptions: smallMemtable})
			if err != nil {
				r.fail("member %s: opening its store of shard %d: %v", m.id, s, err)
				return
			}
			stores[i] = append(stores[i], st)
		}
	}
	final := stores[r.final.idx]
	present := func(st []*store.Store, q *Request) bool {
		return st[r.router.Shard(q.Event.Session)].Window().Contains(q.Key())
	}
	// The oracle: every request in the order the client sent it, each
	// distinct one once — an acknowledged one always, an unacknowledged
	// one (abandoned, or refused on a retry because its earlier attempt's
	// close took effect) if it took effect: it may be there once or not at
	// all, never twice.
	o := NewOracle()
	seen := map[uint64]bool{}
	for i := range r.sent {
		q := &r.sent[i]
		if seen[q.ID] {
			continue
		}
		seen[q.ID] = true
		_, acked := r.acked[q.ID]
		in := present(final, q)
		switch {
		case acked:
			res.Acked++
		case r.abandoned[q.ID]:
			res.Abandoned++
			if in {
				res.AbandonedPresent++
			}
		}
		if acked || in {
			o.Once(q.Key(), &q.Event)
		}
	}
	for i, m := range r.members {
		for s := range uint32(r.cfg.Shards) {
			// The LSN only: a promoted store commits its term's epoch
			// before a batch of it reaches its followers.
			if at, _ := stores[i][s].Position(); i != r.final.idx {
				if fat, _ := final[s].Position(); at != fat {
					r.fail("member %s shard %d ends at LSN %d, the final leader %s at LSN %d", m.id, s, at, r.final.id, fat)
				}
			}
			keep := func(id session.ID) bool { return r.router.Shard(id) == s }
			if err := o.VerifyOnly(stores[i][s].State(), keep); err != nil {
				r.fail("invariants 1-2: member %s shard %d differs from the oracle (each request acknowledged, or unacknowledged and present, once): %v", m.id, s, err)
			}
		}
		for id := range seen {
			q := r.request(id)
			got, want := present(stores[i], q), present(final, q)
			if a, acked := r.acked[id]; acked && !got {
				r.fail("invariant 1: request %d, acknowledged at epoch %d by %s, is missing on %s", id, a.epoch, a.member, m.id)
			}
			if got != want {
				r.fail("request %d: present %v on %s, %v on the final leader %s", id, got, m.id, want, r.final.id)
			}
		}
	}
}

// request is the request the client sent under id.
func (r *erun) request(id uint64) *Request {
	for i := range r.sent {
		if r.sent[i].ID == id {
			return &r.sent[i]
		}
	}
	return nil
}

// checkTerms checks invariant 4 on the term records the coordinator
// published: a new term's epoch is above every earlier term's.
func (r *erun) checkTerms() {
	r.termsMu.Lock()
	defer r.termsMu.Unlock()
	if r.termErr != nil {
		r.fail("%v", r.termErr)
	}
	var last termSeen
	var counted uint64
	for _, t := range r.terms {
		if t.State == "leading" && t.Term != counted {
			r.res.Terms++
			counted = t.Term
		}
		switch {
		case t.Term == last.Term && t.Epoch != last.Epoch:
			r.fail("invariant 4: term %d published epoch %d, then %d", t.Term, last.Epoch, t.Epoch)
		case t.Term != last.Term && (t.Term < last.Term || t.Epoch <= last.Epoch):
			r.fail("invariant 4: term %d (epoch %d, %s) published after term %d (epoch %d, %s)", t.Term, t.Epoch, t.ID, last.Term, last.Epoch, last.ID)
		}
		last = t
	}
	if r.res.Terms == 0 {
		r.fail("no term was published leading")
	}
}

// String summarises the counts of a result.
func (e *ElectionResult) String() string {
	return fmt.Sprintf("%d leaders, %d terms, %d attempts (%d failed), %d acked, %d abandoned (%d present), %d zombie writes, nemesis %v",
		e.Leaders, e.Terms, e.Attempts, e.Failed, e.Acked, e.Abandoned, e.AbandonedPresent, e.ZombieWrites, e.Nemesis)
}

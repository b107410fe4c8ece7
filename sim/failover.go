package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncewal/oncewal/internal/drill"
	"github.com/oncewal/oncewal/store"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/leader"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// FailoverOptions describes one deterministic failover run: a client sends
// non-idempotent requests (adds to counters, each under its own request key)
// to leader A, A ships its WAL to follower B, A is killed at a random point,
// B is promoted, and the client retries against B every request whose answer
// it did not see.
type FailoverOptions struct {
	Dir  string // leader A in Dir/a, follower B in Dir/b (its store then its leader's), on FS
	Seed uint64
	// Requests is the number of distinct client requests. Default 40;
	// negative is refused.
	Requests int
	// Counters is the number of counters the adds spread over. Default 3;
	// negative is refused.
	Counters int
	// Async answers the client as soon as A has committed a request, before
	// B acknowledged it (asynchronous replication). Then a request answered
	// by A but not yet shipped is lost with A: the run checks that exactly
	// those answers are lost (see FailoverResult.LostAnswers) and that the
	// retry re-executes them once on B. Default false: A answers only after
	// B's ack, and no answer is ever lost.
	Async bool
	// FS holds the two stores. Default: a fresh in-memory filesystem.
	FS vfs.FS
	// Logger for the nodes. Default slog.Default(), as everywhere
	// (slog.New(slog.DiscardHandler) silences them).
	Logger *slog.Logger
	// Trace, if set, receives a line per notable step (for the demo).
	Trace func(format string, args ...any)
}

// EnsureDefaults fills unset fields with their documented defaults.
func (c *FailoverOptions) EnsureDefaults() *FailoverOptions {
	if c.Requests == 0 {
		c.Requests = 40
	}
	if c.Counters == 0 {
		c.Counters = 3
	}
	if c.FS == nil {
		c.FS = vfs.NewMem()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every invalid field in one error wrapping ErrBadOptions.
func (c *FailoverOptions) Validate() error {
	var errs []error
	if c.Requests < 0 {
		errs = append(errs, fmt.Errorf("Requests %d is negative", c.Requests))
	}
	if c.Counters < 0 {
		errs = append(errs, fmt.Errorf("Counters %d is negative", c.Counters))
	}
	return badOptions("FailoverOptions", errs)
}

// Kill phases of leader A, relative to request FailoverResult.KilledAt.
const (
	KillAfterClaim  = iota // the claim is logged (maybe shipped), the operation never ran
	KillBeforeShip         // effect + outcome committed on A, not shipped to B
	KillBeforeAck          // shipped and applied on B, the ack (so the answer) lost
	KillAfterAnswer        // the client saw the answer; A dies before the next request
	killPhases
)

// KillPhaseName names a kill phase.
func KillPhaseName(p int) string {
	return [...]string{"after-claim", "before-ship", "before-ack", "after-answer"}[p]
}

// FailoverResult is what happened, and whether the invariant held.
type FailoverResult struct {
	Requests   int
	KilledAt   int    // index of the request during which A was killed
	KillPhase  int    // KillAfterClaim … KillAfterAnswer
	ALastLSN   uint64 // last LSN A logged
	PromotedAt uint64 // B's applied LSN when promoted: everything A logged up to here survived
	SeenOnA    int    // answers the client saw from A
	Retried    int    // client requests sent to B (retries and checks)
	// Of the requests sent to B: answered from B's replicated ledger
	// (replay), executed on B (their effect never reached B), and requests
	// that met a claim inherited in flight from A and waited until its lease
	// ended on the WAL clock.
	Replayed, Reexecuted, InFlightWaits int
	// Extensions: lease extensions slow owners logged on A (each slow
	// request works past the default lease). ExtendedInherited: claims B
	// inherited in flight whose lease A had extended; B kept the extended
	// lease end.
	Extensions, ExtendedInherited int
	// WaitingOnA: duplicate deliveries that waited on A (ClaimWith Wait)
	// while the owner worked; WaitingOnB: waiting claims on B.
	WaitingOnA, WaitingOnB int
	// LostAnswers: answers the client saw from A whose request never reached
	// B (asynchronous replication only). Each was re-executed on B, once.
	LostAnswers int
	Duplicates  int  // redelivered batches B discarded
	Fenced      bool // B's store refused a batch of A's epoch after promotion
	// History is every client request as its client saw it, for a
	// linearizability checker (see ClientOp).
	History   []ClientOp
	Verified  bool
	VerifyErr error
}

// ClientOp is one client request as its client saw it: from its first
// attempt to the answer it finally got, across kills and promotions (the
// retries are part of the operation). Call and Return are logical times:
// every call and answer of the run is numbered in the order it happened, so
// two operations overlap exactly when they were concurrent. The sequential
// specification a checker holds it to: the first operation of a key (in a
// linearization) executes — its answer is FailoverOutcome of the counter's
// value then — and every later one answers that outcome again.
type ClientOp struct {
	Client       int    // an id per client operation (for visualization)
	Key          string // the request key
	Counter      int    // the counter the request adds to
	Delta        int64
	Call, Return int64
	Outcome      []byte // the answer
	// Lost: answered by A, under asynchronous replication, for a request
	// whose completion B never received. The answer died with A and is not
	// part of the surviving history, so a checker leaves it out; the run
	// verifies that these are exactly the asynchronous window and that the
	// request then executed once on B.
	Lost bool
}

// FailoverOutcome is the answer a request (key, counter, delta) returns when
// it executes and the counter was value before: the run's servers compute
// exactly this.
func FailoverOutcome(key string, counter int, delta, value int64) []byte {
	return fmt.Appendf(nil, "%s: c%d %+d = %d", key, counter, delta, value+delta)
}

// lease is the lease end a claim or extend record of a request set, and the
// LSN that logged it.
type lease struct {
	lsn uint64
	end int64
}

type failReq struct {
	key     string
	counter int
	delta   int64
	payload []byte
	seen    bool   // the client saw an answer from A
	answer  []byte // what it saw
	lsn     uint64 // last LSN of the batch that completed it on A
	final   []byte // the answer after failover
	leases  []lease
	open    []int              // client operations (History indexes) still waiting for an answer
	onA     []int              // operations answered by A (lost if the completion never reached B)
	stale   *idempotency.Claim // A's claim, when A died holding it
}

type failSim struct {
	cfg  FailoverOptions
	rng  *rand.Rand
	res  *FailoverResult
	wall atomic.Int64 // the simulated wall clock of both leaders; waiting claims read it from their goroutines
	sid  session.ID
	reqs []failReq
	lead *leader.Leader // A, then B once promoted
	la   *leader.Shard  // the current leader's shard (the run has one)
	a, b *store.Store   // A's store while A leads; B's, as follower then as leader
	aWAL string

	histMu sync.Mutex
	ticks  atomic.Int64
}

const failScope = "client"

// failLedger: the run moves the wall clock by hand, so waiting claims
// recheck it every millisecond.
var failLedger = idempotency.LedgerOptions{WaitRecheck: time.Millisecond}

func (s *failSim) now() int64 { return s.wall.Load() }

func (s *failSim) trace(format string, args ...any) {
	if s.cfg.Trace != nil {
		s.cfg.Trace(format, args...)
	}
}

// call starts a client operation for request i and returns its History
// index.
func (s *failSim) call(i int) int {
	r := &s.reqs[i]
	s.histMu.Lock()
	defer s.histMu.Unlock()
	h := &s.res.History
	*h = append(*h, ClientOp{Client: len(*h), Key: r.key, Counter: r.counter, Delta: r.delta, Call: s.ticks.Add(1)})
	return len(*h) - 1
}

// answer ends client operation op with outcome.
func (s *failSim) answer(op int, outcome []byte) {
	s.histMu.Lock()
	defer s.histMu.Unlock()
	o := &s.res.History[op]
	o.Return, o.Outcome = s.ticks.Add(1), bytes.Clone(outcome)
}

// RunFailover runs cfg and verifies the request-level exactly-once invariant.
// An error means the run could not be carried out; a violated invariant is
// reported in FailoverResult.VerifyErr.
func RunFailover(cfg FailoverOptions) (*FailoverResult, error) {
	if err := cfg.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xfa11))
	s := &failSim{cfg: cfg, rng: rng, res: &FailoverResult{Requests: cfg.Requests}, aWAL: filepath.Join(cfg.Dir, "a", leader.WALDirName)}
	s.wall.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	s.sid[0], s.sid[15] = 0xc1, byte(cfg.Seed)
	for i := range cfg.Requests {
		r := failReq{key: fmt.Sprintf("req-%04d", i), counter: rng.IntN(cfg.Counters), delta: 1 + rng.Int64N(100)}
		r.payload = fmt.Appendf(nil, "add %d to c%d", r.delta, r.counter)
		s.reqs = append(s.reqs, r)
	}
	s.res.KilledAt, s.res.KillPhase = rng.IntN(cfg.Requests), rng.IntN(killPhases)
	err := s.run()
	if s.lead != nil {
		_ = s.lead.Close()
	} else if s.b != nil {
		_ = drill.Kill(s.b)
	}
	if err != nil {
		return nil, err
	}
	s.res.Verified = s.res.VerifyErr == nil
	return s.res, nil
}

func (s *failSim) opts() *follower.Options {
	return &follower.Options{Store: store.Options{FS: s.cfg.FS, Logger: s.cfg.Logger, PebbleOptions: func(o *pebble.Options) { o.MemTableSize = 256 << 10 }}}
}

// openLeader opens the leader of the run's one shard in dir (epoch 0:
// the store's); a raised epoch is the failover's promotion of a
// follower's store.
func (s *failSim) openLeader(dir string, epoch uint64) error {
	l, err := leader.Open(dir, &leader.Options{Shards: 1, Epoch: epoch, Promote: epoch > 0, FS: s.cfg.FS, Wall: s.now,
		Ledger: failLedger, Logger: s.cfg.Logger, Store: s.opts().Store})
	if err != nil {
		return err
	}
	s.lead = l
	s.la, err = l.Shard(0)
	return err
}

func (s *failSim) run() error {
	if err := s.openLeader(filepath.Join(s.cfg.Dir, "a"), 0); err != nil {
		return err
	}
	s.a = s.la.Store()
	var err error
	if s.b, err = store.Open(store.ShardDir(filepath.Join(s.cfg.Dir, "b"), 0), &s.opts().Store); err != nil {
		return err
	}
	s.trace("leader A (epoch %d) and follower B up; %d requests, A dies during request %d (%s), async=%v",
		s.la.Epoch(), len(s.reqs), s.res.KilledAt, KillPhaseName(s.res.KillPhase), s.cfg.Async)

	dup, err := s.beforeFailover()
	if err != nil {
		return err
	}
	s.res.ALastLSN = s.la.NextLSN() - 1
	epochA := s.la.Epoch()
	_ = s.lead.Close() // wakes a duplicate still waiting on A: idempotency.ErrClosed
	s.lead, s.la, s.a = nil, nil, nil
	if dup != nil {
		if r := <-dup; !errors.Is(r.err, idempotency.ErrClosed) {
			s.fail("duplicate waiting on A when A died: %v %v, want idempotency.ErrClosed", r.status, r.err)
		}
	}
	s.res.PromotedAt, _ = s.b.Position()
	if err := s.b.Close(); err != nil {
		return err
	}
	s.b = nil
	// The failover controller hands out the next epoch: B may never have
	// seen A's (if nothing reached it), so B's own epoch + 1 is not enough.
	if err := s.openLeader(filepath.Join(s.cfg.Dir, "b"), epochA+1); err != nil {
		return err
	}
	s.b = s.la.Store()
	s.trace("A killed at LSN %d; B promoted with epoch %d at LSN %d", s.res.ALastLSN, s.la.Epoch(), s.res.PromotedAt)
	s.markLost()
	if err := s.staleOwner(); err != nil {
		return err
	}
	if err := s.afterFailover(); err != nil {
		return err
	}
	s.verify()
	return s.checkFence()
}

// exec claims request i on leader l (without waiting), recording its
// payload as the claim's action.
func (s *failSim) exec(l *leader.Shard, i int) (*idempotency.Claim, error) {
	r := &s.reqs[i]
	return l.Ledger().ClaimWith(context.Background(), failScope, r.key, r.payload, idempotency.ClaimOptions{Action: string(r.payload)})
}

// commit is the server's execution of a fresh claim: read the counter, add,
// and log effect and outcome together.
func (s *failSim) commit(l *leader.Shard, f *store.Store, i int, c *idempotency.Claim) ([]byte, wal.Header, error) {
	r := &s.reqs[i]
	ckey := fmt.Appendf(nil, "c%d", r.counter)
	cur, err := f.State().Counter(s.sid, ckey)
	if err != nil {
		return nil, wal.Header{}, err
	}
	outcome := FailoverOutcome(r.key, r.counter, r.delta, cur)
	h, err := l.Commit(c, outcome, wal.Event{Op: wal.OpAdd, Session: s.sid, Key: ckey, Delta: r.delta})
	return outcome, h, err
}

type waitResult struct {
	status  idempotency.Status
	outcome []byte
	err     error
}

// waitingClaim sends request i to leader l as a waiting claim from its own
// goroutine; a fresh claim executes there (when f is set). The answer
// arrives on the channel.
func (s *failSim) waitingClaim(l *leader.Shard, f *store.Store, i int) <-chan waitResult {
	r := &s.reqs[i]
	ch := make(chan waitResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := l.Ledger().ClaimWith(ctx, failScope, r.key, r.payload, idempotency.ClaimOptions{Wait: true, Action: string(r.payload)})
		switch {
		case err != nil:
			ch <- waitResult{err: err}
		case c.Status == idempotency.Fresh && f != nil:
			out, _, err := s.commit(l, f, i, c)
			ch <- waitResult{status: c.Status, outcome: out, err: err}
		default:
			ch <- waitResult{status: c.Status, outcome: c.Outcome}
		}
	}()
	return ch
}

// parked waits until n waiting claims sleep on l.
func parked(l *leader.Shard, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for l.Ledger().Waiting() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d waiting claims parked after 30s, want %d", l.Ledger().Waiting(), n)
		}
		time.Sleep(50 * time.Microsecond)
	}
	return nil
}

// ship delivers A's batches to B, from B's position up to LSN upto, with
// random redeliveries of the batch just applied (which B must discard).
func (s *failSim) ship(upto uint64) error {
	from, _ := s.b.Position()
	if from >= upto {
		return nil
	}
	rd, err := wal.OpenReaderFS(s.cfg.FS, s.aWAL, 0)
	if err != nil {
		return err
	}
	defer rd.Close()
	if err := rd.Seek(from + 1); err != nil {
		return err
	}
	for {
		h, raw, err := rd.Next()
		if errors.Is(err, io.EOF) || (err == nil && h.LastLSN() > upto) {
			return nil
		}
		if err != nil {
			return err
		}
		for dup := true; dup; dup = s.rng.IntN(6) == 0 {
			res, err := s.b.Apply(raw)
			if err != nil {
				return fmt.Errorf("B refused LSN %d: %w", h.FirstLSN, err)
			}
			if !res.Committed {
				s.res.Duplicates++
			}
		}
	}
}

// lag ships a random prefix of what B lacks (asynchronous replication).
func (s *failSim) lag() error {
	end := s.la.NextLSN() - 1
	from, _ := s.b.Position()
	if end > from && s.rng.IntN(2) == 0 {
		return s.ship(from + 1 + s.rng.Uint64N(end-from))
	}
	return nil
}

// beforeFailover sends the requests to A until A dies. Now and then a
// request is slow (its owner works past the default lease, extending it)
// and a duplicate delivery of it waits on A for the outcome. It returns the
// answer channel of a duplicate still waiting when A dies.
func (s *failSim) beforeFailover() (<-chan waitResult, error) {
	for i := range s.reqs {
		s.wall.Add(int64(time.Millisecond))
		r := &s.reqs[i]
		kill := i == s.res.KilledAt
		op := s.call(i)
		r.open = append(r.open, op)
		c, err := s.exec(s.la, i)
		if err != nil {
			return nil, err
		}
		if c.Status != idempotency.Fresh {
			return nil, fmt.Errorf("request %s: first attempt got %s", r.key, c.Status)
		}
		r.leases = append(r.leases, lease{s.la.NextLSN() - 1, c.LeaseEnd})
		var dup <-chan waitResult
		if s.rng.IntN(4) == 0 { // a duplicate delivery while the owner works
			r.open = append(r.open, s.call(i))
			dup = s.waitingClaim(s.la, nil, i)
			if err := parked(s.la, 1); err != nil {
				return nil, err
			}
			s.res.WaitingOnA++
		}
		if s.rng.IntN(4) == 0 { // slow: 80–120 s of work, a heartbeat every 40 s
			for range 2 + s.rng.IntN(2) {
				s.wall.Add(int64(40 * time.Second))
				end, err := s.la.Ledger().Extend(c, 0)
				if err != nil {
					return nil, fmt.Errorf("request %s: extending its own live lease: %w", r.key, err)
				}
				r.leases = append(r.leases, lease{s.la.NextLSN() - 1, end})
				s.res.Extensions++
			}
			s.trace("%s: slow owner extended its lease %d times (until +%v)", r.key, len(r.leases)-1,
				time.Duration(r.leases[len(r.leases)-1].end-s.now()))
		}
		if kill && s.res.KillPhase == KillAfterClaim {
			// The claim and any extensions may have reached B, or a prefix.
			r.stale = c
			k := s.rng.IntN(len(r.leases) + 1)
			if k == 0 {
				return dup, s.ship(r.leases[0].lsn - 1)
			}
			return dup, s.ship(r.leases[k-1].lsn)
		}
		outcome, h, err := s.commit(s.la, s.a, i, c)
		if err != nil {
			return nil, err
		}
		var dupAnswer []byte
		if dup != nil { // woken by the commit: a replay of the owner's outcome
			d := <-dup
			if d.err != nil || d.status != idempotency.Replay || !bytes.Equal(d.outcome, outcome) {
				s.fail("%s: duplicate waiting on A got %s %q (%v), want a replay of %q", r.key, d.status, d.outcome, d.err, outcome)
			}
			dupAnswer = d.outcome
		}
		switch {
		case kill && s.res.KillPhase == KillBeforeShip:
			if s.rng.IntN(2) == 0 {
				return nil, s.ship(h.FirstLSN - 1) // maybe the claim (and extensions), not the commit
			}
			return nil, nil
		case kill && s.res.KillPhase == KillBeforeAck:
			return nil, s.ship(h.LastLSN())
		}
		if s.cfg.Async {
			if err := s.lag(); err != nil {
				return nil, err
			}
		} else if err := s.ship(h.LastLSN()); err != nil { // the ack is what releases the answer
			return nil, err
		}
		// Answers are released together: the owner's and the duplicate's
		// (a replay is released only when the outcome is, too).
		r.seen, r.answer, r.lsn = true, outcome, h.LastLSN()
		s.res.SeenOnA++
		s.answer(r.open[0], outcome)
		if len(r.open) == 2 {
			s.answer(r.open[1], dupAnswer)
		}
		r.onA, r.open = append(r.onA, r.open...), nil
		// Now and then the client retries an answered request on A (a
		// timeout that fired just as the answer came): a replay.
		if j := s.rng.IntN(i + 1); s.rng.IntN(4) == 0 && s.reqs[j].seen {
			op := s.call(j)
			c, err := s.exec(s.la, j)
			if err != nil {
				return nil, err
			}
			if c.Status != idempotency.Replay || !bytes.Equal(c.Outcome, s.reqs[j].answer) {
				s.fail("retry of %s on A: %s %q, want replay %q", s.reqs[j].key, c.Status, c.Outcome, s.reqs[j].answer)
			}
			s.answer(op, c.Outcome)
			s.reqs[j].onA = append(s.reqs[j].onA, op)
		}
		if kill {
			return nil, nil // KillAfterAnswer
		}
	}
	return nil, nil
}

func (s *failSim) fail(format string, args ...any) {
	if s.res.VerifyErr == nil {
		s.res.VerifyErr = fmt.Errorf(format, args...)
	}
}

// markLost flags the answers A gave for requests whose completion B never
// received (asynchronous replication): they died with A.
func (s *failSim) markLost() {
	for i := range s.reqs {
		r := &s.reqs[i]
		if r.seen && r.lsn > s.res.PromotedAt {
			for _, op := range r.onA {
				s.res.History[op].Lost = true
			}
		}
	}
}

// staleOwner: A died holding a claim. Its owner, if it came back, can
// neither extend nor complete it on B (the Claim is A's), and nothing is
// logged.
func (s *failSim) staleOwner() error {
	for i := range s.reqs {
		c := s.reqs[i].stale
		if c == nil {
			continue
		}
		next := s.la.NextLSN()
		if _, err := s.la.Ledger().Extend(c, 0); !errors.Is(err, idempotency.ErrNotOwner) {
			s.fail("%s: A's claim extended on B: %v", c.Key, err)
		}
		if _, _, err := s.commit(s.la, s.b, i, c); !errors.Is(err, idempotency.ErrNotOwner) {
			s.fail("%s: A's claim committed on B: %v", c.Key, err)
		}
		if s.la.NextLSN() != next {
			s.fail("%s: a stale owner's attempt was logged on B", c.Key)
		}
	}
	return nil
}

// inheritedLease is the lease end of request r that B holds: the latest
// claim or extension of A's that B received.
func (s *failSim) inheritedLease(r *failReq) (end int64, extended bool) {
	for j, l := range r.leases {
		if l.lsn <= s.res.PromotedAt {
			end, extended = l.end, j > 0
		}
	}
	return end, extended
}

// afterFailover sends to B every client operation A left unanswered, and
// new attempts: requests never sent, and checks of answered ones.
func (s *failSim) afterFailover() error {
	order := s.rng.Perm(len(s.reqs))
	for _, i := range order {
		r := &s.reqs[i]
		ops := r.open
		r.open = nil
		if len(ops) == 0 {
			if r.seen && !s.cfg.Async && s.rng.IntN(2) == 0 {
				continue // a client retries only what it did not see; half the time we check the rest too
			}
			ops = []int{s.call(i)}
		}
		s.res.Retried += len(ops)
		var answers []waitResult
		var err error
		if len(ops) == 1 && s.rng.IntN(2) == 0 {
			answers, err = s.pollOnB(i)
		} else {
			answers, err = s.waitOnB(i, len(ops))
		}
		if err != nil {
			return err
		}
		executed := false
		for k, a := range answers {
			s.answer(ops[k], a.outcome)
			switch a.status {
			case idempotency.Fresh:
				s.res.Reexecuted++
				executed = true
			case idempotency.Replay:
				s.res.Replayed++
			}
			if k > 0 && !bytes.Equal(a.outcome, answers[0].outcome) {
				s.fail("%s: concurrent requests on B answered %q and %q", r.key, answers[0].outcome, a.outcome)
			}
		}
		r.final = answers[0].outcome
		lost := r.seen && s.cfg.Async && r.lsn > s.res.PromotedAt
		switch {
		case lost && !executed:
			s.fail("%s: never reached B, yet B did not execute it", r.key)
		case lost:
			s.res.LostAnswers++ // answered by A, never shipped: lost with A, executed once on B
			s.trace("%s: A's answer %q never reached B; re-executed on B: %q", r.key, r.answer, r.final)
		case r.seen && !bytes.Equal(r.final, r.answer):
			s.fail("%s: A answered %q, B answers %q", r.key, r.answer, r.final)
		}
	}
	return nil
}

// pollOnB is a client without waiting claims: it claims, and when it meets
// a claim inherited in flight from A it comes back at the lease end.
func (s *failSim) pollOnB(i int) ([]waitResult, error) {
	r := &s.reqs[i]
	for attempt := 0; ; attempt++ {
		s.wall.Add(int64(time.Millisecond))
		c, err := s.exec(s.la, i)
		if err != nil {
			return nil, fmt.Errorf("retry of %s on B: %w", r.key, err)
		}
		switch c.Status {
		case idempotency.InFlight:
			if attempt > 0 {
				s.fail("%s still in flight after its lease", r.key)
				return []waitResult{{status: c.Status}}, nil
			}
			s.inherited(r, c.LeaseEnd)
			s.wall.Store(c.LeaseEnd)
			continue
		case idempotency.Replay:
			if !c.Replayed {
				s.fail("%s: replay not marked replayed", r.key)
			}
			return []waitResult{{status: c.Status, outcome: c.Outcome}}, nil
		}
		outcome, _, err := s.commit(s.la, s.b, i, c)
		return []waitResult{{status: c.Status, outcome: outcome}}, err
	}
}

// inherited checks and counts a claim B inherited in flight from A: its
// lease must end where A's last shipped claim or extension put it.
func (s *failSim) inherited(r *failReq, leaseEnd int64) {
	s.res.InFlightWaits++
	want, extended := s.inheritedLease(r)
	if leaseEnd != want {
		s.fail("%s: B holds A's claim until WAL time %d, A's last shipped lease ended at %d", r.key, leaseEnd, want)
	}
	if extended {
		s.res.ExtendedInherited++
	}
	s.trace("%s: in flight (claimed on A%s, lease until +%v); waiting for the lease", r.key,
		map[bool]string{true: ", lease extended", false: ""}[extended], time.Duration(leaseEnd-s.now()))
}

// waitOnB sends n concurrent waiting claims of request i to B. If B holds
// A's claim in flight they all wait; the run then moves the clock to the
// lease end, one of them executes and the others replay its outcome.
func (s *failSim) waitOnB(i, n int) ([]waitResult, error) {
	r := &s.reqs[i]
	s.wall.Add(int64(time.Millisecond))
	e, inFlight, err := s.la.Ledger().Lookup(failScope, r.key)
	if err != nil {
		return nil, err
	}
	inFlight = inFlight && e.State == idempotency.StateInFlight
	chs := make([]<-chan waitResult, n)
	for k := range chs {
		chs[k] = s.waitingClaim(s.la, s.b, i)
	}
	s.res.WaitingOnB += n
	if inFlight {
		if err := parked(s.la, n); err != nil {
			return nil, err
		}
		s.inherited(r, e.Expires)
		s.wall.Store(e.Expires)
	}
	out := make([]waitResult, n)
	fresh := 0
	for k, ch := range chs {
		out[k] = <-ch
		if out[k].err != nil {
			return nil, fmt.Errorf("waiting claim of %s on B: %w", r.key, out[k].err)
		}
		if out[k].status == idempotency.Fresh {
			fresh++
		}
	}
	if fresh > 1 {
		s.fail("%s: %d concurrent waiting claims on B executed it", r.key, fresh)
	}
	return out, nil
}

// verify checks the invariant on B, the surviving history.
func (s *failSim) verify() {
	want := make([]int64, s.cfg.Counters)
	for i := range s.reqs {
		r := &s.reqs[i]
		want[r.counter] += r.delta // every request exactly once
		if r.final == nil {
			r.final = r.answer // seen, not retried (sync mode)
		}
		// Every request now replays its final outcome, verbatim.
		op := s.call(i)
		c, err := s.exec(s.la, i)
		if err != nil {
			s.fail("%s: final claim: %v", r.key, err)
			continue
		}
		s.answer(op, c.Outcome)
		if c.Status != idempotency.Replay || !bytes.Equal(c.Outcome, r.final) {
			s.fail("%s: final claim %s %q, want replay of %q", r.key, c.Status, c.Outcome, r.final)
		}
	}
	for j := range want {
		got, err := s.b.State().Counter(s.sid, fmt.Appendf(nil, "c%d", j))
		if err != nil || got != want[j] {
			s.fail("counter c%d = %d (%v), want %d: some request took effect zero or two times", j, got, err, want[j])
		}
	}
	// Lost answers are exactly the asynchronous window.
	lost := 0
	for i := range s.reqs {
		if s.reqs[i].seen && s.reqs[i].lsn > s.res.PromotedAt {
			lost++
		}
	}
	if lost != s.res.LostAnswers || (!s.cfg.Async && lost != 0) {
		s.fail("%d answers beyond B's position at promotion, %d detected as lost (async=%v)", lost, s.res.LostAnswers, s.cfg.Async)
	}
	// The same key with another payload is a conflict, on B too, and it
	// names what the key was first used for (recorded on A or on B).
	r := &s.reqs[s.rng.IntN(len(s.reqs))]
	_, err := s.la.Ledger().Claim(failScope, r.key, append(bytes.Clone(r.payload), '!'))
	var ce *idempotency.ConflictError
	if !errors.As(err, &ce) {
		s.fail("%s with another payload: %v, want ErrConflict", r.key, err)
	} else if ce.Existing.Action != string(r.payload) {
		s.fail("%s: conflict names action %q, want %q", r.key, ce.Existing.Action, r.payload)
	}
}

// checkFence reopens B's store as a follower and offers it a batch of A's
// epoch: the old leader is fenced.
func (s *failSim) checkFence() error {
	rd, err := wal.OpenReaderFS(s.cfg.FS, s.aWAL, 0)
	if err != nil {
		return err
	}
	_, raw, err := rd.Next()
	raw = bytes.Clone(raw)
	_ = rd.Close()
	if err != nil {
		return err
	}
	err = s.lead.Close()
	s.lead, s.la, s.b = nil, nil, nil
	if err != nil {
		return err
	}
	f, err := follower.Open(store.ShardDir(filepath.Join(s.cfg.Dir, "b"), 0), s.opts())
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Apply(raw)
	s.res.Fenced = errors.Is(err, replication.ErrStaleEpoch)
	if !s.res.Fenced {
		s.fail("B's store accepted a batch of deposed leader A: %v", err)
	}
	return nil
}

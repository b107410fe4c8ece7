package testutil

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/oncewal/oncewal/follower"
	"github.com/oncewal/oncewal/idempotency"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/session"
	"github.com/oncewal/oncewal/wal"
)

// FailoverConfig describes one deterministic failover run: a client sends
// non-idempotent requests (adds to counters, each under its own request key)
// to leader A, A ships its WAL to follower B, A is killed at a random point,
// B is promoted, and the client retries against B every request whose answer
// it did not see.
type FailoverConfig struct {
	Dir  string // WALs in Dir/a-wal and Dir/b-wal; stores in Dir/a and Dir/b (on FS)
	Seed uint64
	// Requests is the number of distinct client requests. Default 40.
	Requests int
	// Counters is the number of counters the adds spread over. Default 3.
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
	// Logger for the nodes. Default: discard.
	Logger *slog.Logger
	// Trace, if set, receives a line per notable step (for the demo).
	Trace func(format string, args ...any)
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
	Retried    int    // requests retried against B
	// Of the retries: answered from B's replicated ledger (replay), executed
	// on B (their effect never reached B), and waits on an in-flight claim
	// inherited from A until its lease ended on the WAL clock.
	Replayed, Reexecuted, InFlightWaits int
	// LostAnswers: answers the client saw from A whose request never reached
	// B (asynchronous replication only). Each was re-executed on B, once.
	LostAnswers int
	Duplicates  int  // redelivered batches B discarded
	Fenced      bool // B's store refused a batch of A's epoch after promotion
	Verified    bool
	VerifyErr   error
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
}

type failSim struct {
	cfg  FailoverConfig
	rng  *rand.Rand
	res  *FailoverResult
	wall int64
	sid  session.ID
	reqs []failReq
	a, b *follower.Follower
	la   *replication.LedgerLog
	aWAL string
}

const failScope = "client"

func (s *failSim) now() int64 { return s.wall }

func (s *failSim) trace(format string, args ...any) {
	if s.cfg.Trace != nil {
		s.cfg.Trace(format, args...)
	}
}

// RunFailover runs cfg and verifies the request-level exactly-once invariant.
// An error means the run could not be carried out; a violated invariant is
// reported in FailoverResult.VerifyErr.
func RunFailover(cfg FailoverConfig) (*FailoverResult, error) {
	if cfg.Requests <= 0 {
		cfg.Requests = 40
	}
	if cfg.Counters <= 0 {
		cfg.Counters = 3
	}
	if cfg.FS == nil {
		cfg.FS = vfs.NewMem()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xfa11))
	s := &failSim{cfg: cfg, rng: rng, res: &FailoverResult{Requests: cfg.Requests},
		wall: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano(), aWAL: filepath.Join(cfg.Dir, "a-wal")}
	s.sid[0], s.sid[15] = 0xc1, byte(cfg.Seed)
	for i := range cfg.Requests {
		r := failReq{key: fmt.Sprintf("req-%04d", i), counter: rng.IntN(cfg.Counters), delta: 1 + rng.Int64N(100)}
		r.payload = fmt.Appendf(nil, "add %d to c%d", r.delta, r.counter)
		s.reqs = append(s.reqs, r)
	}
	s.res.KilledAt, s.res.KillPhase = rng.IntN(cfg.Requests), rng.IntN(killPhases)
	err := s.run()
	if s.la != nil {
		_ = s.la.Close()
	}
	for _, f := range []*follower.Follower{s.a, s.b} {
		if f != nil {
			_ = f.Kill()
		}
	}
	if err != nil {
		return nil, err
	}
	s.res.Verified = s.res.VerifyErr == nil
	return s.res, nil
}

func (s *failSim) opts() *follower.Options {
	return &follower.Options{FS: s.cfg.FS, Logger: s.cfg.Logger,
		PebbleOptions: func(o *pebble.Options) { o.MemTableSize = 256 << 10 }}
}

func (s *failSim) run() error {
	var err error
	if s.a, err = follower.Open(filepath.Join(s.cfg.Dir, "a"), s.opts()); err != nil {
		return err
	}
	// A fresh store promoted with epoch 1 is the first leader.
	if s.la, err = s.a.Promote(follower.PromoteOptions{WALDir: s.aWAL, Wall: s.now}); err != nil {
		return err
	}
	if s.b, err = follower.Open(filepath.Join(s.cfg.Dir, "b"), s.opts()); err != nil {
		return err
	}
	s.trace("leader A (epoch %d) and follower B up; %d requests, A dies during request %d (%s), async=%v",
		s.la.Epoch(), len(s.reqs), s.res.KilledAt, KillPhaseName(s.res.KillPhase), s.cfg.Async)

	if err := s.beforeFailover(); err != nil {
		return err
	}
	s.res.ALastLSN = s.la.Writer().NextLSN() - 1
	epochA := s.la.Epoch()
	_ = s.la.Close()
	s.la = nil
	_ = s.a.Kill()
	s.a = nil
	s.res.PromotedAt, _ = s.b.Position()
	// The failover controller hands out the next epoch: B may never have
	// seen A's (if nothing reached it), so B's own epoch + 1 is not enough.
	lb, err := s.b.Promote(follower.PromoteOptions{WALDir: filepath.Join(s.cfg.Dir, "b-wal"), Wall: s.now, Epoch: epochA + 1})
	if err != nil {
		return err
	}
	s.la = lb
	s.trace("A killed at LSN %d; B promoted with epoch %d at LSN %d", s.res.ALastLSN, lb.Epoch(), s.res.PromotedAt)
	if err := s.afterFailover(); err != nil {
		return err
	}
	s.verify()
	return s.checkFence()
}

// exec claims request i on leader l; on a fresh claim the server then runs
// commit: read the counter, add, and log effect and outcome together.
func (s *failSim) exec(l *replication.LedgerLog, i int) (*idempotency.Claim, error) {
	r := &s.reqs[i]
	return l.Ledger().Claim(failScope, r.key, r.payload)
}

func (s *failSim) commit(l *replication.LedgerLog, f *follower.Follower, i int, c *idempotency.Claim) ([]byte, wal.Header, error) {
	r := &s.reqs[i]
	ckey := fmt.Appendf(nil, "c%d", r.counter)
	cur, err := f.State().Counter(s.sid, ckey)
	if err != nil {
		return nil, wal.Header{}, err
	}
	outcome := fmt.Appendf(nil, "%s: c%d %+d = %d", r.key, r.counter, r.delta, cur+r.delta)
	h, err := l.Commit(c, outcome, wal.Event{Op: wal.OpAdd, Session: s.sid, Key: ckey, Delta: r.delta})
	return outcome, h, err
}

// ship delivers A's batches to B, from B's position up to LSN upto, with
// random redeliveries of the batch just applied (which B must discard).
func (s *failSim) ship(upto uint64) error {
	from, _ := s.b.Position()
	if from >= upto {
		return nil
	}
	rd, err := wal.OpenReader(s.aWAL, 0)
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
	end := s.la.Writer().NextLSN() - 1
	from, _ := s.b.Position()
	if end > from && s.rng.IntN(2) == 0 {
		return s.ship(from + 1 + s.rng.Uint64N(end-from))
	}
	return nil
}

func (s *failSim) beforeFailover() error {
	for i := range s.reqs {
		s.wall += int64(time.Millisecond)
		r := &s.reqs[i]
		kill := i == s.res.KilledAt
		c, err := s.exec(s.la, i)
		if err != nil {
			return err
		}
		if c.Status != idempotency.Fresh {
			return fmt.Errorf("request %s: first attempt got %s", r.key, c.Status)
		}
		if kill && s.res.KillPhase == KillAfterClaim {
			if s.rng.IntN(2) == 0 { // the claim may or may not have reached B
				return s.ship(s.la.Writer().NextLSN() - 1)
			}
			return nil
		}
		outcome, h, err := s.commit(s.la, s.a, i, c)
		if err != nil {
			return err
		}
		switch {
		case kill && s.res.KillPhase == KillBeforeShip:
			if s.rng.IntN(2) == 0 {
				return s.ship(h.FirstLSN - 1) // maybe the claim, not the commit
			}
			return nil
		case kill && s.res.KillPhase == KillBeforeAck:
			return s.ship(h.LastLSN())
		}
		if s.cfg.Async {
			if err := s.lag(); err != nil {
				return err
			}
		} else if err := s.ship(h.LastLSN()); err != nil { // the ack is what releases the answer
			return err
		}
		r.seen, r.answer, r.lsn = true, outcome, h.LastLSN()
		s.res.SeenOnA++
		// Now and then the client retries an answered request on A (a
		// timeout that fired just as the answer came): a replay.
		if j := s.rng.IntN(i + 1); s.rng.IntN(4) == 0 && s.reqs[j].seen {
			c, err := s.exec(s.la, j)
			if err != nil {
				return err
			}
			if c.Status != idempotency.Replay || !bytes.Equal(c.Outcome, s.reqs[j].answer) {
				s.fail("retry of %s on A: %s %q, want replay %q", s.reqs[j].key, c.Status, c.Outcome, s.reqs[j].answer)
			}
		}
		if kill {
			return nil // KillAfterAnswer
		}
	}
	return nil
}

func (s *failSim) fail(format string, args ...any) {
	if s.res.VerifyErr == nil {
		s.res.VerifyErr = fmt.Errorf(format, args...)
	}
}

func (s *failSim) afterFailover() error {
	order := s.rng.Perm(len(s.reqs))
	for _, i := range order {
		r := &s.reqs[i]
		if r.seen && !s.cfg.Async && s.rng.IntN(2) == 0 {
			continue // a client retries only what it did not see; half the time we check the rest too
		}
		s.res.Retried++
		var last idempotency.Status
		for attempt := 0; ; attempt++ {
			s.wall += int64(time.Millisecond)
			c, err := s.exec(s.la, i)
			if err != nil {
				return fmt.Errorf("retry of %s on B: %w", r.key, err)
			}
			last = c.Status
			switch c.Status {
			case idempotency.InFlight:
				// A claim inherited from dead A: it frees itself when its
				// lease ends on the WAL clock.
				if attempt > 0 {
					s.fail("%s still in flight after its lease", r.key)
					return nil
				}
				s.res.InFlightWaits++
				s.trace("%s: in flight (claimed on A, lease until +%v); waiting for the lease", r.key,
					time.Duration(c.LeaseEnd-s.wall))
				s.wall = c.LeaseEnd
				continue
			case idempotency.Replay:
				s.res.Replayed++
				if !c.Replayed {
					s.fail("%s: replay not marked replayed", r.key)
				}
				r.final = c.Outcome
			case idempotency.Fresh:
				s.res.Reexecuted++
				outcome, _, err := s.commit(s.la, s.b, i, c)
				if err != nil {
					return err
				}
				r.final = outcome
			}
			break
		}
		lost := r.seen && s.cfg.Async && r.lsn > s.res.PromotedAt
		switch {
		case lost && last != idempotency.Fresh:
			s.fail("%s: never reached B, yet B answered %s", r.key, last)
		case lost:
			s.res.LostAnswers++ // answered by A, never shipped: lost with A, executed once on B
			s.trace("%s: A's answer %q never reached B; re-executed on B: %q", r.key, r.answer, r.final)
		case r.seen && !bytes.Equal(r.final, r.answer):
			s.fail("%s: A answered %q, B answers %q", r.key, r.answer, r.final)
		}
	}
	return nil
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
		c, err := s.la.Ledger().Claim(failScope, r.key, r.payload)
		if err != nil {
			s.fail("%s: final claim: %v", r.key, err)
			continue
		}
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
	// The same key with another payload is a conflict, on B too.
	r := &s.reqs[s.rng.IntN(len(s.reqs))]
	if _, err := s.la.Ledger().Claim(failScope, r.key, append(bytes.Clone(r.payload), '!')); !errors.Is(err, idempotency.ErrConflict) {
		s.fail("%s with another payload: %v, want ErrConflict", r.key, err)
	}
}

// checkFence reopens B's store as a follower and offers it a batch of A's
// epoch: the old leader is fenced.
func (s *failSim) checkFence() error {
	rd, err := wal.OpenReader(s.aWAL, 0)
	if err != nil {
		return err
	}
	_, raw, err := rd.Next()
	raw = bytes.Clone(raw)
	_ = rd.Close()
	if err != nil {
		return err
	}
	_ = s.la.Close()
	s.la = nil
	if err := s.b.Close(); err != nil {
		return err
	}
	s.b = nil
	f, err := follower.Open(filepath.Join(s.cfg.Dir, "b"), s.opts())
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

package idempotency

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Ledger errors (besides ErrInvalidKey and ErrOutcomeTooLarge).
var (
	// ErrConflict: the request key was used before with a different payload.
	// The error is a *ConflictError carrying the earlier entry.
	ErrConflict = errors.New("idempotency: request key reused with a different payload")
	// ErrNotOwner: Complete, Fail or Release with a claim that does not own
	// the key: not a fresh claim, or another claim took the key after this
	// one's lease ended. Nothing was recorded; the operation must not take
	// effect (the caller's effects travel in the same log batch as the
	// Complete, so they are refused with it).
	ErrNotOwner = errors.New("idempotency: claim does not own the key")
	// ErrSettled: the claim was already completed, failed or released.
	ErrSettled = errors.New("idempotency: claim already settled")
	// ErrLedgerClosed: the Ledger was closed.
	ErrLedgerClosed = errors.New("idempotency: ledger closed")
)

// ConflictError is returned (wrapped as ErrConflict) when a key arrives with
// a payload fingerprint different from the one recorded for it.
type ConflictError struct {
	Scope, Key string
	Existing   Entry       // the earlier entry (its state, times, fingerprint, outcome)
	Got        Fingerprint // the fingerprint of the rejected payload
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("idempotency: request key %q (scope %q) reused with a different payload: %s entry from WAL time %d has fingerprint %s, request has %s",
		e.Key, e.Scope, e.Existing.State, e.Existing.Time, e.Existing.Fingerprint, e.Got)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Status is the outcome of Claim.
type Status uint8

// Claim statuses.
const (
	// Fresh: the caller owns the key (an in-flight entry with a lease) and
	// must settle it with Complete, Fail or Release.
	Fresh Status = 1
	// Replay: the request already completed (or failed, CachedFailure); the
	// Outcome is the original, verbatim.
	Replay Status = 2
	// InFlight: another caller owns the key and has not finished; retry
	// after a short delay (LeaseEnd says when an abandoned claim frees).
	InFlight Status = 3
)

// String returns fresh|replay|in-flight.
func (s Status) String() string {
	switch s {
	case Fresh:
		return "fresh"
	case Replay:
		return "replay"
	case InFlight:
		return "in-flight"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Claim is the answer to Ledger.Claim, and for a fresh claim the handle that
// settles it. A Claim must not be settled from two goroutines at once.
type Claim struct {
	Status      Status
	Scope, Key  string
	Fingerprint Fingerprint
	Token       Token // fresh: this claim; in-flight: the owner's; replay: the completing claim's
	Time        int64 // WAL time of the entry's last decision
	LeaseEnd    int64 // fresh, in-flight: WAL time at which the lease ends
	// Replay only:
	Outcome       []byte // the recorded outcome, verbatim (a copy)
	Replayed      bool   // always true for a replay: the answer is not a new execution
	CachedFailure bool   // the outcome is a recorded failure (Fail), not a success
	Expires       int64  // WAL time at which the outcome leaves the replay window

	ledger  *Ledger
	settled bool
}

// LogFunc makes a decision's records durable and applies them to the ledger
// table, atomically and in order, before it returns nil: after it returns,
// LedgerTable.Get must see them. On a replicated leader it appends them to
// the WAL (in one batch) and applies that batch locally; see package
// replication. An error means the records were not logged; the Ledger then
// reports the error and changes nothing in memory.
type LogFunc func(recs []Record) error

// LedgerOptions configures a Ledger. Zero fields take the documented
// defaults (EnsureDefaults).
type LedgerOptions struct {
	// TTL is how long a completed outcome replays: the replay window.
	// A retry later than this re-executes. Default 24h.
	TTL time.Duration
	// Lease is how long a claim stays in flight before it frees itself, so
	// a claim abandoned by a crashed caller does not block the key forever.
	// Default 1 minute.
	Lease time.Duration
	// FailureTTL is the default TTL of Fail (when called with ttl <= 0).
	// Default 10s.
	FailureTTL time.Duration
	// Now returns the WAL clock: the timestamp (unix nanos) the next record
	// will carry. Expiry is judged against it. It must never go backwards and
	// on a promoted leader must continue past every time in the replicated
	// log. Default: the wall clock, kept strictly increasing and never below
	// the table's clock.
	Now func() int64
	// Log logs records (see LogFunc). Default: apply them to the table
	// directly in one synced Pebble batch (a standalone, unreplicated ledger).
	Log LogFunc
	// NewToken returns claim tokens. Default: NewToken (crypto/rand).
	NewToken func() Token
}

// EnsureDefaults fills unset durations with their defaults and returns o
// (Now and Log are defaulted by OpenLedger, which needs the table).
func (o *LedgerOptions) EnsureDefaults() *LedgerOptions {
	if o.TTL <= 0 {
		o.TTL = 24 * time.Hour
	}
	if o.Lease <= 0 {
		o.Lease = time.Minute
	}
	if o.FailureTTL <= 0 {
		o.FailureTTL = 10 * time.Second
	}
	if o.NewToken == nil {
		o.NewToken = NewToken
	}
	return o
}

// Ledger is the leader-side request ledger: request-level idempotency over
// a LedgerTable. See the package documentation for its guarantees.
//
// Decisions about one key are serialized (a per-key turn held across the
// log call); decisions about different keys run concurrently.
type Ledger struct {
	table *LedgerTable
	opts  LedgerOptions

	mu     sync.Mutex
	busy   map[string]chan struct{} // row key → closed when its turn ends
	closed bool
	ops    sync.WaitGroup

	clockMu sync.Mutex // default Now
	last    int64
	logMu   sync.Mutex // default Log: table transactions are serialized
}

// OpenLedger returns a Ledger over t.
func OpenLedger(t *LedgerTable, opts *LedgerOptions) (*Ledger, error) {
	if t == nil {
		return nil, errors.New("idempotency: OpenLedger needs a table")
	}
	l := &Ledger{table: t, busy: make(map[string]chan struct{})}
	if opts != nil {
		l.opts = *opts
	}
	l.opts.EnsureDefaults()
	if l.opts.Now == nil {
		c, err := t.Clock()
		if err != nil {
			return nil, err
		}
		l.last = c
		l.opts.Now = l.wallNow
	}
	if l.opts.Log == nil {
		l.opts.Log = l.logDirect
	}
	return l, nil
}

func (l *Ledger) wallNow() int64 {
	l.clockMu.Lock()
	defer l.clockMu.Unlock()
	l.last = max(l.last+1, time.Now().UnixNano())
	return l.last
}

// logDirect is the default LogFunc: one synced table transaction.
func (l *Ledger) logDirect(recs []Record) error {
	l.logMu.Lock()
	defer l.logMu.Unlock()
	b := l.table.db.NewBatch()
	defer b.Close()
	tx := l.table.Begin(b)
	for i := range recs {
		if err := tx.Apply(&recs[i]); err != nil {
			return err
		}
	}
	if err := tx.Finish(); err != nil {
		return err
	}
	return b.Commit(pebble.Sync)
}

// Table returns the ledger's table.
func (l *Ledger) Table() *LedgerTable { return l.table }

// ReplayWindow is how long a completed outcome replays (the TTL). A client
// retrying later than this after its first attempt re-executes the request.
func (l *Ledger) ReplayWindow() time.Duration { return l.opts.TTL }

// Lease is the claim lease.
func (l *Ledger) Lease() time.Duration { return l.opts.Lease }

// turn takes key's turn, waiting for another decision on it to end.
func (l *Ledger) turn(rk string) (func(), error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, ErrLedgerClosed
		}
		wait, ok := l.busy[rk]
		if !ok {
			done := make(chan struct{})
			l.busy[rk] = done
			l.ops.Add(1)
			l.mu.Unlock()
			return func() {
				l.mu.Lock()
				delete(l.busy, rk)
				l.mu.Unlock()
				close(done)
				l.ops.Done()
			}, nil
		}
		l.mu.Unlock()
		<-wait
	}
}

// live reads the entry of rk and reports it only if it has not expired at now.
func (l *Ledger) live(rk []byte, now int64) (Entry, bool, error) {
	e, found, err := getEntry(l.table.db, rk)
	if err != nil || !found || !e.Live(now) {
		return Entry{}, false, err
	}
	return e, true, nil
}

// Claim asks for (scope, key) with the request's payload and returns exactly
// one of: a Fresh claim (the caller owns the key now; its claim record was
// logged), a Replay of the recorded outcome, an InFlight answer (someone else
// owns the key), or an error: ErrInvalidKey (nothing changed), a
// *ConflictError (ErrConflict) when the key's entry has a different payload
// fingerprint, or a log/store error. Of any number of concurrent Claims of
// one free key exactly one is Fresh.
func (l *Ledger) Claim(scope, key string, payload []byte) (*Claim, error) {
	if err := ValidateRequest(scope, key); err != nil {
		return nil, err
	}
	fp := FingerprintOf(payload)
	rk := rowKey(scope, key)
	done, err := l.turn(string(rk))
	if err != nil {
		return nil, err
	}
	defer done()
	now := l.opts.Now()
	e, found, err := l.live(rk, now)
	if err != nil {
		return nil, err
	}
	c := &Claim{Scope: scope, Key: key, Fingerprint: fp, ledger: l}
	if found {
		if e.Fingerprint != fp {
			return nil, &ConflictError{Scope: scope, Key: key, Existing: e, Got: fp}
		}
		c.Token, c.Time = e.Token, e.Time
		if e.State == StateInFlight {
			c.Status, c.LeaseEnd = InFlight, e.Expires
		} else {
			c.Status, c.Replayed, c.Expires = Replay, true, e.Expires
			c.Outcome = bytes.Clone(e.Outcome)
			c.CachedFailure = e.State == StateFailed
		}
		c.settled = true
		return c, nil
	}
	rec := Record{Kind: RecordClaim, Token: l.opts.NewToken(), Time: now, Expires: now + int64(l.opts.Lease),
		Fingerprint: fp, Scope: scope, Key: key}
	if err := l.opts.Log([]Record{rec}); err != nil {
		return nil, fmt.Errorf("idempotency: logging claim: %w", err)
	}
	c.Status, c.Token, c.Time, c.LeaseEnd = Fresh, rec.Token, rec.Time, rec.Expires
	return c, nil
}

// settle runs one settling decision for c: it checks that c still owns its
// key, builds the record and hands it to log.
func (l *Ledger) settle(c *Claim, kind RecordKind, outcome []byte, ttl time.Duration, log func(Record) error) error {
	if c == nil || c.ledger != l || c.Status != Fresh {
		return fmt.Errorf("%w: not a fresh claim of this ledger", ErrNotOwner)
	}
	if c.settled {
		return ErrSettled
	}
	if len(outcome) > MaxOutcomeSize {
		return fmt.Errorf("%w: %d bytes", ErrOutcomeTooLarge, len(outcome))
	}
	rk := rowKey(c.Scope, c.Key)
	done, err := l.turn(string(rk))
	if err != nil {
		return err
	}
	defer done()
	now := l.opts.Now()
	e, found, err := l.live(rk, now)
	if err != nil {
		return err
	}
	if found && e.Token != c.Token {
		// Our lease ended and another claim took the key (or settled it).
		return fmt.Errorf("%w: key %q is held by another claim (%s) since WAL time %d", ErrNotOwner, c.Key, e.State, e.Time)
	}
	if found && e.State != StateInFlight {
		c.settled = true
		return ErrSettled
	}
	// Either we still hold the entry, or our lease ended and nobody took the
	// key since (the entry expired or was swept): settling is still safe,
	// because any other execution would have had to claim the key first.
	rec := Record{Kind: kind, Token: c.Token, Time: now, Scope: c.Scope, Key: c.Key}
	if kind != RecordRelease {
		rec.Expires, rec.Fingerprint, rec.Outcome = now+int64(ttl), c.Fingerprint, outcome
	} else if !found {
		c.settled = true // nothing to free: the lease already ended
		return nil
	}
	if err := log(rec); err != nil {
		return fmt.Errorf("idempotency: logging %s: %w", kind, err)
	}
	c.settled = true
	return nil
}

func (l *Ledger) logOne(rec Record) error { return l.opts.Log([]Record{rec}) }

// Complete records that c's operation succeeded with outcome: retries within
// the replay window get outcome back verbatim. Errors: ErrNotOwner (the key
// was taken by another claim after c's lease ended: the operation must not
// take effect), ErrSettled, ErrOutcomeTooLarge, or a log error.
func (l *Ledger) Complete(c *Claim, outcome []byte) error {
	return l.settle(c, RecordComplete, outcome, l.opts.TTL, l.logOne)
}

// CompleteWith is Complete with the caller's own log call: log must make the
// complete record durable atomically with the operation's effects (one WAL
// batch holding the effects and the record) and apply it to the table.
// Called while c's key is held, so no other decision on the key interleaves.
func (l *Ledger) CompleteWith(c *Claim, outcome []byte, log func(Record) error) error {
	return l.settle(c, RecordComplete, outcome, l.opts.TTL, log)
}

// Fail records that c's operation failed in a way a re-execution would
// reproduce (a validation error, say): for ttl (FailureTTL when ttl <= 0)
// retries replay the failure, marked CachedFailure, instead of re-executing.
func (l *Ledger) Fail(c *Claim, outcome []byte, ttl time.Duration) error {
	if ttl <= 0 {
		ttl = l.opts.FailureTTL
	}
	return l.settle(c, RecordFail, outcome, ttl, l.logOne)
}

// Release frees c's key after the operation did not take effect (rejected,
// faulted before doing anything): the next Claim is fresh and re-executes.
func (l *Ledger) Release(c *Claim) error {
	return l.settle(c, RecordRelease, nil, 0, l.logOne)
}

// Lookup returns the live entry of (scope, key) at the current WAL clock,
// without claiming anything.
func (l *Ledger) Lookup(scope, key string) (Entry, bool, error) {
	if err := ValidateRequest(scope, key); err != nil {
		return Entry{}, false, err
	}
	return l.live(rowKey(scope, key), l.opts.Now())
}

// Probe checks that the ledger can serve: not closed, its store readable
// and writable, its clock decodable. Call it before accepting traffic.
func (l *Ledger) Probe() error {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return ErrLedgerClosed
	}
	if _, err := l.table.Clock(); err != nil {
		return fmt.Errorf("idempotency: probe: %w", err)
	}
	if err := probeWrite(l.table.db); err != nil {
		return fmt.Errorf("idempotency: probe: %w", err)
	}
	return nil
}

func probeWrite(db *pebble.DB) (err error) {
	defer func() {
		if p := recover(); p != nil { // a wedged store panics (see replication.FatalLogger)
			err = fmt.Errorf("store failed: %v", p)
		}
	}()
	return db.Set(ledgerProbeKey, []byte{ledgerValueVersion}, pebble.NoSync)
}

// Close stops the ledger: later calls return ErrLedgerClosed. It waits for
// decisions in progress and does not close the store. Close is idempotent.
func (l *Ledger) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.ops.Wait()
	return nil
}

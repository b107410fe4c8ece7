package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Ledger errors (besides ErrInvalidKey and ErrOutcomeTooLarge).
var (
	// ErrConflict: the request key was used before with a different payload.
	// The error is a *ConflictError carrying the earlier entry.
	ErrConflict = errors.New("idempotency: request key reused with a different payload")
	// ErrNotOwner: Complete, Fail, Extend or Release with a claim that does
	// not own the key: not a fresh claim of this ledger, its lease ended on
	// the WAL clock, or another claim took the key since. Nothing was
	// recorded; the operation must not take effect (the caller's effects
	// travel in the same log batch as the Complete, so they are refused with
	// it).
	ErrNotOwner = errors.New("idempotency: claim does not own the key")
	// ErrSettled: the claim was already completed, failed or released.
	ErrSettled = errors.New("idempotency: claim already settled")
	// ErrClosed: the Ledger was closed (a waiting claim returns it
	// when Close interrupts the wait).
	ErrClosed = errors.New("idempotency: ledger closed")
	// ErrBadOptions: ledger or table options, or a per-call duration or
	// action, out of range. Nothing changed.
	ErrBadOptions = errors.New("idempotency: invalid options")
	// ErrStoreUnavailable: the ledger's store is closed or failing. Probe
	// reports every failure with it; other calls report a closed store with
	// it instead of letting Pebble's panic escape.
	ErrStoreUnavailable = errors.New("idempotency: ledger store unavailable")
	// ErrCompleteNotAtomic: Complete on a ledger whose records share a log
	// with the operation's events (LedgerOptions.AtomicCommit: a leader
	// shard's), where a complete record logged alone is not atomic with the
	// effects logged before or after it. Nothing was recorded and the claim
	// still owns its key; complete it with the call the error names.
	ErrCompleteNotAtomic = errors.New("idempotency: Complete would log the outcome apart from the operation's events")
)

// MaxRetention bounds every ledger duration (TTL, lease, failure retention,
// an extension), so that a WAL time plus any of them cannot overflow.
const MaxRetention = 100 * 365 * 24 * time.Hour

// ConflictError is returned (wrapped as ErrConflict) when a key arrives with
// a payload fingerprint different from the one recorded for it. Existing is
// the earlier request's entry as recorded: its action (what the key was
// first used for, if the caller named it), state, times, fingerprint and
// outcome.
type ConflictError struct {
	Scope, Key string
	Existing   Entry       // the earlier entry
	Got        Fingerprint // the fingerprint of the rejected payload
	GotAction  string      // the rejected request's action, if any
}

func (e *ConflictError) Error() string {
	first := "first used"
	if e.Existing.Action != "" {
		first = fmt.Sprintf("first used for %q", e.Existing.Action)
	}
	return fmt.Sprintf("idempotency: request key %q (scope %q) reused with a different payload: %s (%s entry from WAL time %d, fingerprint %s); this request has fingerprint %s",
		e.Key, e.Scope, first, e.Existing.State, e.Existing.Time, e.Existing.Fingerprint, e.Got)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Status is the outcome of Claim.
type Status uint8

// Claim statuses.
const (
	// Fresh: the caller owns the key (an in-flight entry with a lease) and
	// must settle it with Complete, Fail or Release, extending the lease
	// while it works longer than the lease.
	Fresh Status = 1
	// Replay: the request already completed (or failed, CachedFailure); the
	// Outcome is the original, verbatim.
	Replay Status = 2
	// InFlight: another caller owns the key and has not finished (a
	// non-waiting claim only); LeaseEnd says when its lease ends unless the
	// owner extends it.
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

// Claim is the answer to Ledger.Claim and, for a fresh claim, the handle
// that extends and settles it. Its exported fields are the answer and never
// change afterwards. Extend, Complete, Fail and Release of one Claim may be
// called from different goroutines (a heartbeat next to the handler): they
// are serialized, and once one settles the claim the others get ErrSettled.
type Claim struct {
	Status      Status
	Scope, Key  string
	Fingerprint Fingerprint
	Token       Token  // fresh: this claim; in-flight: the owner's; replay: the completing claim's
	Time        int64  // WAL time of the entry's last decision
	LeaseEnd    int64  // fresh, in-flight: WAL time at which the lease ends (Extend returns later ends)
	Action      string // the action recorded with the entry's claim (fresh: this request's)
	// Replay only:
	Outcome       []byte // the recorded outcome, verbatim (a copy)
	Replayed      bool   // always true for a replay: the answer is not a new execution
	CachedFailure bool   // the outcome is a recorded failure (Fail), not a success
	Expires       int64  // WAL time at which the outcome leaves the replay window

	ledger *Ledger
	// Guarded by the key's turn (see Ledger.turn).
	settled  bool
	leaseEnd int64
}

// ClaimOptions are the per-call options of ClaimWith.
type ClaimOptions struct {
	// Wait makes the claim wait while another caller owns the key, instead
	// of answering InFlight: it returns when the owner completes or fails
	// (Replay), releases (Fresh), or its lease ends on the WAL clock without
	// an extension (Fresh) — whatever a Claim would answer at that moment.
	// The context ends the wait.
	Wait bool
	// Action says what the request does ("POST /v1/transfers", "refund
	// order 42"); at most MaxActionLen bytes. A fresh claim records it with
	// the entry, and a later request that reuses the key with another
	// payload gets it back in its *ConflictError.
	Action string
}

// EnsureDefaults returns o: every zero field is the default (no wait, no
// action).
func (o *ClaimOptions) EnsureDefaults() *ClaimOptions { return o }

// Validate reports an oversized Action wrapping ErrBadOptions.
func (o *ClaimOptions) Validate() error {
	var errs []error
	if len(o.Action) > MaxActionLen {
		errs = append(errs, fmt.Errorf("Action is %d bytes, limit %d", len(o.Action), MaxActionLen))
	}
	return invalidOptions("claim", errs)
}

// LogFunc makes a decision's records durable and applies them to the ledger
// table, atomically and in order, before it returns nil: after it returns,
// LedgerTable.Get must see them. On a replicated leader it appends them to
// the WAL (in one batch) and applies that batch locally; see package
// replication. An error means the records were not logged; the Ledger then
// reports the error and changes nothing in memory.
type LogFunc func(recs []Record) error

// ScopeOptions override the ledger's failure retention for one scope.
type ScopeOptions struct {
	// FailureTTL is how long a failure recorded by Fail (with ttl 0) replays
	// in this scope. Zero: LedgerOptions.FailureTTL.
	FailureTTL time.Duration
	// FinalFailures makes failures in this scope as final as successes:
	// they replay for the TTL, so a failed request is never re-executed
	// within the replay window. It excludes FailureTTL.
	FinalFailures bool
}

// EnsureDefaults returns o: a zero FailureTTL already means the ledger's
// (LedgerOptions.FailureTTL), which only the Ledger knows.
func (o *ScopeOptions) EnsureDefaults() *ScopeOptions { return o }

// Validate reports every invalid field in one error wrapping ErrBadOptions.
func (o *ScopeOptions) Validate() error { return invalidOptions("scope", o.problems("ScopeOptions")) }

// problems names the fields as in's.
func (o *ScopeOptions) problems(in string) []error {
	var errs []error
	if err := checkDuration(o.FailureTTL); err != nil {
		errs = append(errs, fmt.Errorf("%s.FailureTTL %v %w", in, o.FailureTTL, err))
	}
	if o.FinalFailures && o.FailureTTL != 0 {
		errs = append(errs, fmt.Errorf("%s: FinalFailures and FailureTTL %v both set", in, o.FailureTTL))
	}
	return errs
}

// LedgerOptions configures a Ledger. Zero fields take the documented
// defaults (EnsureDefaults); negative or oversized ones are refused
// (Validate, called by OpenLedger).
type LedgerOptions struct {
	// TTL is how long a completed outcome replays: the replay window.
	// A retry later than this re-executes. Default 24h.
	TTL time.Duration
	// Lease is how long a claim, or an extension of it, stays in flight
	// before it frees itself, so a claim abandoned by a crashed caller does
	// not block the key forever. An owner working longer extends it (Extend).
	// Default 1 minute.
	Lease time.Duration
	// FailureTTL is how long a failure recorded by Fail replays when neither
	// the call nor the scope says otherwise: a short cache, because a
	// failure is often transient. Default 10s. See Scopes and Fail for final
	// failures.
	FailureTTL time.Duration
	// Scopes overrides the failure retention per scope (see ScopeOptions).
	// The map is copied by OpenLedger.
	Scopes map[string]ScopeOptions
	// WaitRecheck bounds how long a waiting claim sleeps before it re-reads
	// the entry and the WAL clock. Decisions made through this Ledger wake
	// waiters at once and a lease end is timed from the WAL clock, so the
	// recheck matters only when Now does not follow the wall clock (a
	// simulated clock) or a promoted leader's WAL clock runs ahead of its
	// wall clock. Default 1s.
	WaitRecheck time.Duration
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
	// AtomicCommit, when set, names the call that completes a claim in one
	// log batch with the operation's events: Log then carries those events
	// too (a leader shard's ledger: "leader.Shard.Commit", set by the
	// leader), so Complete refuses with ErrCompleteNotAtomic naming it
	// instead of logging the outcome on its own. Default: "" (Complete
	// logs).
	AtomicCommit string
	// FreeOrphanedClaims frees at once, instead of at its lease's end,
	// every claim that was in flight when this ledger opened (its last
	// record older than Now at OpenLedger). Set it when every claim's owner
	// runs in the process that writes this ledger's log, as the client
	// service's handlers do (package clientapi; oncewal node and oncewal
	// leader set it): such a claim's owner died with the process that
	// wrote the log before, or was deposed with it and is fenced, so it can
	// never complete or extend the claim, and a retry would wait out the
	// lease for nothing. Its effects were never logged without its outcome
	// (AtomicCommit), so the retry, run afresh, runs it once. Leave it
	// unset when an owner may outlive the ledger's process (a worker that
	// claims through an RPC and acts outside the log): the lease is then
	// what keeps a retry from running beside it. Now must be strictly
	// increasing and above every logged time (the default clock and the
	// leader's WAL clock are). Default false.
	FreeOrphanedClaims bool
}

// Defaults of LedgerOptions.
const (
	DefaultTTL         = 24 * time.Hour
	DefaultLease       = time.Minute
	DefaultFailureTTL  = 10 * time.Second
	DefaultWaitRecheck = time.Second
)

// EnsureDefaults fills unset (zero) fields with their defaults and returns o
// (Now and Log are defaulted by OpenLedger, which needs the table).
func (o *LedgerOptions) EnsureDefaults() *LedgerOptions {
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	if o.FailureTTL == 0 {
		o.FailureTTL = DefaultFailureTTL
	}
	if o.WaitRecheck == 0 {
		o.WaitRecheck = DefaultWaitRecheck
	}
	if o.NewToken == nil {
		o.NewToken = NewToken
	}
	return o
}

// Validate reports every invalid field in one error wrapping
// ErrBadOptions. Zero durations are valid (they mean the default).
func (o *LedgerOptions) Validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"TTL", o.TTL}, {"Lease", o.Lease}, {"FailureTTL", o.FailureTTL}, {"WaitRecheck", o.WaitRecheck}} {
		if err := checkDuration(d.v); err != nil {
			errs = append(errs, fmt.Errorf("%s %v %w", d.name, d.v, err))
		}
	}
	for scope, so := range o.Scopes {
		if len(scope) > MaxScopeLen {
			errs = append(errs, fmt.Errorf("Scopes: scope of %d bytes, limit %d", len(scope), MaxScopeLen))
		}
		errs = append(errs, so.problems(fmt.Sprintf("Scopes[%q]", scope))...)
	}
	return invalidOptions("ledger", errs)
}

func checkDuration(d time.Duration) error {
	switch {
	case d < 0:
		return errors.New("is negative")
	case d > MaxRetention:
		return fmt.Errorf("exceeds MaxRetention (%v)", MaxRetention)
	}
	return nil
}

func invalidOptions(what string, errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: %w", ErrBadOptions, what, errors.Join(errs...))
}

// Ledger is the leader-side request ledger: request-level idempotency over
// a LedgerTable. See the package documentation for its guarantees.
//
// Decisions about one key are serialized (a per-key turn held across the
// log call); decisions about different keys run concurrently.
type Ledger struct {
	table *LedgerTable
	opts  LedgerOptions

	mu      sync.Mutex
	busy    map[string]chan struct{} // row key → closed when its turn ends
	watches map[string]*watch        // row key → waiters, woken when a record about the key is logged
	waiting int                      // waiting claims parked right now
	closed  bool
	closing chan struct{} // closed by Close: wakes waiting claims
	ops     sync.WaitGroup

	clockMu sync.Mutex // default Now
	last    int64
	// orphanedBefore: an in-flight claim last recorded before it is free
	// (FreeOrphanedClaims); 0 otherwise.
	orphanedBefore int64
	logMu          sync.Mutex // default Log: table transactions are serialized

	stats ledgerCounters
}

// LedgerStats counts a Ledger's answers and decisions since it was opened.
type LedgerStats struct {
	// Claim answers (a waiting claim counts every answer it got).
	Fresh, Replay, InFlight, Conflicts uint64
	// Owner decisions logged.
	Completed, Failed, Released, Extended uint64
	// NotOwner counts owner decisions refused because the claim no longer
	// owns its key (its lease ended, or another claim took it).
	NotOwner uint64
}

type ledgerCounters struct {
	fresh, replay, inFlight, conflicts, completed, failed, released, extended, notOwner atomic.Uint64
}

// Stats returns the ledger's counters.
func (l *Ledger) Stats() LedgerStats {
	c := &l.stats
	return LedgerStats{
		Fresh: c.fresh.Load(), Replay: c.replay.Load(), InFlight: c.inFlight.Load(), Conflicts: c.conflicts.Load(),
		Completed: c.completed.Load(), Failed: c.failed.Load(), Released: c.released.Load(), Extended: c.extended.Load(),
		NotOwner: c.notOwner.Load(),
	}
}

// watch is what the waiting claims of one key sleep on.
type watch struct {
	ch   chan struct{} // closed when a record about the key is logged
	refs int
}

// OpenLedger returns a Ledger over t, or ErrBadOptions.
func OpenLedger(t *LedgerTable, opts *LedgerOptions) (*Ledger, error) {
	if t == nil {
		return nil, errors.New("idempotency: OpenLedger needs a table")
	}
	l := &Ledger{table: t, busy: make(map[string]chan struct{}), watches: make(map[string]*watch),
		closing: make(chan struct{})}
	if opts != nil {
		l.opts = *opts
	}
	if err := l.opts.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	if l.opts.Scopes != nil {
		scopes := make(map[string]ScopeOptions, len(l.opts.Scopes))
		for k, v := range l.opts.Scopes {
			scopes[k] = v
		}
		l.opts.Scopes = scopes
	}
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
	if l.opts.FreeOrphanedClaims {
		l.orphanedBefore = l.opts.Now()
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
// Passed to Fail, it makes that failure final.
func (l *Ledger) ReplayWindow() time.Duration { return l.opts.TTL }

// Lease is the claim lease (and the default extension).
func (l *Ledger) Lease() time.Duration { return l.opts.Lease }

// FailureRetention is how long a failure recorded by Fail with ttl 0
// replays in scope: the scope's FailureTTL, the TTL if the scope's failures
// are final, else LedgerOptions.FailureTTL.
func (l *Ledger) FailureRetention(scope string) time.Duration {
	if so, ok := l.opts.Scopes[scope]; ok {
		if so.FinalFailures {
			return l.opts.TTL
		}
		if so.FailureTTL > 0 {
			return so.FailureTTL
		}
	}
	return l.opts.FailureTTL
}

// Waiting is the number of waiting claims parked right now.
func (l *Ledger) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}

// turn takes key's turn, waiting for another decision on it to end. The
// returned func ends the turn; logged says the decision logged a record
// about the key, which wakes the key's waiting claims (a decision that logged
// nothing must not wake them, or waiters would wake each other forever).
func (l *Ledger) turn(rk string) (func(logged bool), error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, ErrClosed
		}
		wait, ok := l.busy[rk]
		if !ok {
			done := make(chan struct{})
			l.busy[rk] = done
			l.ops.Add(1)
			l.mu.Unlock()
			return func(logged bool) {
				l.mu.Lock()
				delete(l.busy, rk)
				if w := l.watches[rk]; logged && w != nil {
					close(w.ch)
					delete(l.watches, rk)
				}
				l.mu.Unlock()
				close(done)
				l.ops.Done()
			}, nil
		}
		l.mu.Unlock()
		<-wait
	}
}

// addWatch registers a waiter of rk before it decides, so a record logged
// between its decision and its sleep still wakes it.
func (l *Ledger) addWatch(rk string) *watch {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.watches[rk]
	if w == nil {
		w = &watch{ch: make(chan struct{})}
		l.watches[rk] = w
	}
	w.refs++
	return w
}

func (l *Ledger) dropWatch(rk string, w *watch) {
	if w == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.refs--; w.refs == 0 && l.watches[rk] == w {
		delete(l.watches, rk)
	}
}

// sleep parks a waiting claim until w fires, d passes, ctx ends or the
// ledger closes.
func (l *Ledger) sleep(ctx context.Context, w *watch, d time.Duration) error {
	t := time.NewTimer(min(d, l.opts.WaitRecheck))
	defer t.Stop()
	l.mu.Lock()
	l.waiting++
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.waiting--
		l.mu.Unlock()
	}()
	select {
	case <-w.ch:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	case <-l.closing:
		return ErrClosed
	}
	return nil
}

// guardStore turns the panic Pebble raises on a closed store into
// ErrStoreUnavailable. Other panics propagate. Deferred directly.
func guardStore(err *error) {
	if p := recover(); p != nil {
		pe, ok := p.(error)
		if !ok || !errors.Is(pe, pebble.ErrClosed) {
			panic(p)
		}
		*err = fmt.Errorf("%w: %w", ErrStoreUnavailable, pe)
	}
}

// live reads the entry of rk and reports it only if it has not expired at now.
func (l *Ledger) live(rk []byte, now int64) (Entry, bool, error) {
	e, found, err := getEntry(l.table.db, rk)
	if err != nil || !found || !e.Live(now) || e.State == StateInFlight && e.Time < l.orphanedBefore {
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
// one free key exactly one is Fresh. Claim does not wait; see ClaimWith.
func (l *Ledger) Claim(scope, key string, payload []byte) (*Claim, error) {
	return l.ClaimWith(context.Background(), scope, key, payload, ClaimOptions{})
}

// ClaimWith is Claim with per-call options. With o.Wait it never answers
// InFlight: it waits while another caller owns the key and then answers
// what Claim would at that moment — Replay once the owner completed or
// failed (a failure replays while it is retained), Fresh once the owner
// released the key or its lease ended on the WAL clock. Of several waiters
// woken together exactly one is Fresh; the others wait on. A waiting claim
// works alike on a promoted leader, whose in-flight entries come from the
// replicated table: their owners are gone, so they end with their leases.
// Waiting ends with ctx (the error wraps ctx.Err()) or Close
// (ErrClosed); either way nothing was claimed.
func (l *Ledger) ClaimWith(ctx context.Context, scope, key string, payload []byte, o ClaimOptions) (*Claim, error) {
	if err := ValidateRequest(scope, key); err != nil {
		return nil, err
	}
	if err := o.EnsureDefaults().Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("idempotency: claim of %q: %w", key, err)
	}
	fp := FingerprintOf(payload)
	rk := rowKey(scope, key)
	for {
		var w *watch
		if o.Wait {
			w = l.addWatch(string(rk))
		}
		c, now, err := l.claimOnce(rk, scope, key, fp, o.Action)
		if err != nil || c.Status != InFlight || !o.Wait {
			l.dropWatch(string(rk), w)
			return c, err
		}
		err = l.sleep(ctx, w, time.Duration(c.LeaseEnd-now))
		l.dropWatch(string(rk), w)
		if err != nil {
			return nil, fmt.Errorf("idempotency: waiting for %q (owned by %s until WAL time %d): %w", key, c.Token, c.LeaseEnd, err)
		}
	}
}

// claimOnce takes one claim decision; now is the WAL time it was taken at.
func (l *Ledger) claimOnce(rk []byte, scope, key string, fp Fingerprint, action string) (_ *Claim, now int64, err error) {
	done, err := l.turn(string(rk))
	if err != nil {
		return nil, 0, err
	}
	logged := false
	defer func() { done(logged) }()
	defer guardStore(&err)
	now = l.opts.Now()
	e, found, err := l.live(rk, now)
	if err != nil {
		return nil, now, err
	}
	c := &Claim{Scope: scope, Key: key, Fingerprint: fp, ledger: l}
	if found {
		if e.Fingerprint != fp {
			l.stats.conflicts.Add(1)
			return nil, now, &ConflictError{Scope: scope, Key: key, Existing: e, Got: fp, GotAction: action}
		}
		c.Token, c.Time, c.Action = e.Token, e.Time, e.Action
		if e.State == StateInFlight {
			c.Status, c.LeaseEnd = InFlight, e.Expires
			l.stats.inFlight.Add(1)
		} else {
			l.stats.replay.Add(1)
			c.Status, c.Replayed, c.Expires = Replay, true, e.Expires
			c.Outcome = bytes.Clone(e.Outcome)
			c.CachedFailure = e.State == StateFailed
		}
		c.settled = true
		return c, now, nil
	}
	rec := Record{Kind: RecordClaim, Token: l.opts.NewToken(), Time: now, Expires: now + int64(l.opts.Lease),
		Fingerprint: fp, Scope: scope, Key: key, Action: action}
	if err := l.opts.Log([]Record{rec}); err != nil {
		return nil, now, fmt.Errorf("idempotency: logging claim: %w", err)
	}
	logged = true
	l.stats.fresh.Add(1)
	c.Status, c.Token, c.Time, c.LeaseEnd, c.Action = Fresh, rec.Token, rec.Time, rec.Expires, action
	c.leaseEnd = rec.Expires
	return c, now, nil
}

// decide runs one owner decision for c (extend, complete, fail, release):
// it checks that c still owns its key, builds the record (its expiry d after
// now) and hands it to log.
func (l *Ledger) decide(c *Claim, kind RecordKind, outcome []byte, d time.Duration, log func(Record) error) (leaseEnd int64, err error) {
	defer func() {
		if errors.Is(err, ErrNotOwner) {
			l.stats.notOwner.Add(1)
		}
	}()
	if c == nil || c.ledger != l || c.Status != Fresh {
		return 0, fmt.Errorf("%w: not a fresh claim of this ledger", ErrNotOwner)
	}
	if len(outcome) > MaxOutcomeSize {
		return 0, fmt.Errorf("%w: %d bytes", ErrOutcomeTooLarge, len(outcome))
	}
	if err := checkDuration(d); err != nil {
		return 0, fmt.Errorf("%w: %s for %v %w", ErrBadOptions, kind, d, err)
	}
	rk := rowKey(c.Scope, c.Key)
	done, err := l.turn(string(rk))
	if err != nil {
		return 0, err
	}
	logged := false
	defer func() { done(logged) }()
	defer guardStore(&err)
	if c.settled {
		return 0, ErrSettled
	}
	now := l.opts.Now()
	e, found, err := l.live(rk, now)
	switch {
	case err != nil:
		return 0, err
	case found && e.Token != c.Token:
		return 0, fmt.Errorf("%w: key %q is held by another claim (%s) since WAL time %d", ErrNotOwner, c.Key, e.State, e.Time)
	case found && e.State != StateInFlight:
		c.settled = true
		return 0, ErrSettled
	case !found && kind == RecordRelease:
		c.settled = true // the lease ended: nothing to free
		return 0, nil
	case !found:
		// The lease ended on the WAL clock. Even if nobody took the key
		// yet, a waiter may be about to: the owner's time is over.
		return 0, fmt.Errorf("%w: the lease of %q ended at WAL time %d (now %d)", ErrNotOwner, c.Key, c.leaseEnd, now)
	}
	rec := Record{Kind: kind, Token: c.Token, Time: now, Scope: c.Scope, Key: c.Key}
	switch kind {
	case RecordComplete, RecordFail:
		rec.Expires, rec.Fingerprint, rec.Outcome = now+int64(d), c.Fingerprint, outcome
	case RecordExtend:
		rec.Expires = now + int64(d)
	}
	if err := log(rec); err != nil {
		return 0, fmt.Errorf("idempotency: logging %s: %w", kind, err)
	}
	logged = true
	switch kind {
	case RecordComplete:
		l.stats.completed.Add(1)
	case RecordFail:
		l.stats.failed.Add(1)
	case RecordRelease:
		l.stats.released.Add(1)
	case RecordExtend:
		l.stats.extended.Add(1)
	}
	if kind == RecordExtend {
		c.leaseEnd = rec.Expires
		return rec.Expires, nil
	}
	c.settled = true
	return 0, nil
}

func (l *Ledger) logOne(rec Record) error { return l.opts.Log([]Record{rec}) }

// Extend renews c's lease: it now ends d after the current WAL time (d = 0:
// the ledger's Lease), and Extend returns that WAL time. The extension is a
// logged record like every decision, so a follower promoted while the owner
// works keeps the extended lease. An owner working longer than the lease
// calls Extend before the lease ends (a heartbeat at a fraction of it);
// once it has ended, Extend, Complete and Fail return ErrNotOwner. Errors:
// ErrNotOwner, ErrSettled, ErrBadOptions (d negative or above
// MaxRetention), or a log error.
func (l *Ledger) Extend(c *Claim, d time.Duration) (leaseEnd int64, err error) {
	if d == 0 {
		d = l.opts.Lease
	}
	return l.decide(c, RecordExtend, nil, d, l.logOne)
}

// Complete records that c's operation succeeded with outcome: retries within
// the replay window get outcome back verbatim. Errors: ErrNotOwner (c's
// lease ended, or another claim took the key: the operation must not take
// effect), ErrSettled, ErrOutcomeTooLarge, ErrCompleteNotAtomic (a leader
// shard's ledger: use leader.Shard.Commit), or a log error.
func (l *Ledger) Complete(c *Claim, outcome []byte) error {
	if l.opts.AtomicCommit != "" {
		return fmt.Errorf("%w: complete the claim with %s(claim, outcome, events...), which logs the outcome and the events in one batch",
			ErrCompleteNotAtomic, l.opts.AtomicCommit)
	}
	_, err := l.decide(c, RecordComplete, outcome, l.opts.TTL, l.logOne)
	return err
}

// CompleteWith is Complete with the caller's own log call: log must make the
// complete record durable atomically with the operation's effects (one WAL
// batch holding the effects and the record) and apply it to the table.
// Called while c's key is held, so no other decision on the key interleaves.
func (l *Ledger) CompleteWith(c *Claim, outcome []byte, log func(Record) error) error {
	_, err := l.decide(c, RecordComplete, outcome, l.opts.TTL, log)
	return err
}

// Fail records that c's operation failed in a way a re-execution would
// reproduce (a validation error, say): retries replay the failure, marked
// CachedFailure, instead of re-executing, for ttl — or, when ttl is 0, for
// the scope's retention (FailureRetention: by default a short cache,
// LedgerOptions.FailureTTL). To make this failure as final as a success,
// pass ReplayWindow(). Errors as Complete, and ErrBadOptions for a
// negative ttl or one above MaxRetention.
func (l *Ledger) Fail(c *Claim, outcome []byte, ttl time.Duration) error {
	if ttl == 0 && c != nil {
		ttl = l.FailureRetention(c.Scope)
	}
	_, err := l.decide(c, RecordFail, outcome, ttl, l.logOne)
	return err
}

// Release frees c's key after the operation did not take effect (rejected,
// faulted before doing anything): the next Claim is fresh and re-executes.
// Releasing a claim whose lease already ended, with the key still free, is
// a no-op; ErrNotOwner if another claim holds the key.
func (l *Ledger) Release(c *Claim) error {
	_, err := l.decide(c, RecordRelease, nil, 0, l.logOne)
	return err
}

// Lookup returns the live entry of (scope, key) at the current WAL clock,
// without claiming anything.
func (l *Ledger) Lookup(scope, key string) (_ Entry, _ bool, err error) {
	if err := ValidateRequest(scope, key); err != nil {
		return Entry{}, false, err
	}
	defer guardStore(&err)
	return l.live(rowKey(scope, key), l.opts.Now())
}

// Probe checks that the ledger can serve: not closed (ErrClosed), its
// store readable and writable and its clock decodable (else an error
// wrapping ErrStoreUnavailable, also when the store was closed under the
// ledger or has failed). Call it before accepting traffic and from
// readiness checks; it never panics.
func (l *Ledger) Probe() (err error) {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return ErrClosed
	}
	defer func() {
		if p := recover(); p != nil { // a closed store panics, and so does a failed one (see replication.FatalLogger)
			if pe, ok := p.(error); ok {
				err = fmt.Errorf("%w: probe: %w", ErrStoreUnavailable, pe)
			} else {
				err = fmt.Errorf("%w: probe: %v", ErrStoreUnavailable, p)
			}
		}
	}()
	if _, err := l.table.Clock(); err != nil {
		return fmt.Errorf("%w: probe: %w", ErrStoreUnavailable, err)
	}
	if err := l.table.db.Set(ledgerProbeKey, []byte{ledgerValueVersion}, pebble.NoSync); err != nil {
		return fmt.Errorf("%w: probe: %w", ErrStoreUnavailable, err)
	}
	return nil
}

// Close stops the ledger: later calls return ErrClosed, and so do
// waiting claims, at once. It waits for decisions in progress and does not
// close the store. Close is idempotent.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.closing)
	}
	l.mu.Unlock()
	l.ops.Wait()
	return nil
}

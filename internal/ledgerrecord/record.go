package ledgerrecord

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/oncewal/oncewal/corruption"
)

// Limits of a ledger entry's identity and outcome. They bound what a client
// can make the ledger store and log, and keep every record well inside one
// WAL event (wal.MaxPayloadSize).
const (
	// MaxRequestKeyLen bounds a request key in bytes.
	MaxRequestKeyLen = 200
	// MaxScopeLen bounds a scope in bytes. A scope may be empty.
	MaxScopeLen = 200
	// MaxOutcomeSize bounds the outcome bytes recorded by Complete or Fail.
	MaxOutcomeSize = 1 << 20
	// MaxActionLen bounds the action a claim records (idempotency.ClaimOptions.Action).
	MaxActionLen = 200
)

// Ledger record errors.
var (
	// ErrInvalidKey: a request key that is empty after trimming white space or
	// longer than MaxRequestKeyLen bytes, or a scope longer than MaxScopeLen.
	// The call changed nothing.
	ErrInvalidKey = errors.New("idempotency: invalid request key")
	// ErrOutcomeTooLarge: an outcome above MaxOutcomeSize. Nothing changed.
	ErrOutcomeTooLarge = errors.New("idempotency: outcome too large")
	// ErrBadRecord: bytes that are not a canonical ledger record (wrong
	// version, non-minimal varint, trailing bytes, bad key, ...).
	ErrBadRecord = errors.New("idempotency: bad ledger record")
)

// Kind is what a ledger record does to its entry. The numeric values
// are part of the record format; package wal maps each kind to its own op.
type Kind uint8

// Record kinds.
const (
	Claim    Kind = 1 // a caller took the key: in-flight entry with a lease
	Complete Kind = 2 // the operation succeeded: outcome kept for the replay window
	Release  Kind = 3 // the operation did not happen: the key is free again
	Fail     Kind = 4 // the operation failed reproducibly: failure kept for its retention
	Extend   Kind = 5 // the owner renewed its lease: the in-flight entry's lease ends later

	lastKind = Extend
)

var kindNames = [...]string{Claim: "claim", Complete: "complete", Release: "release", Fail: "fail",
	Extend: "extend"}

// Valid reports whether k is an assigned kind.
func (k Kind) Valid() bool { return k >= Claim && k <= lastKind }

// String returns claim|complete|release|fail|extend or "kind(N)".
func (k Kind) String() string {
	if k.Valid() {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Token identifies one claim: 128 random bits chosen by the leader that
// granted it. Complete, Release, Fail and Extend name the claim they act on,
// so a record can never settle or renew somebody else's claim.
type Token [16]byte

// NewToken returns a random token.
func NewToken() Token {
	var t Token
	_, _ = rand.Read(t[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return t
}

// String returns the token as 32 hex characters.
func (t Token) String() string { return hex.EncodeToString(t[:]) }

// Fingerprint is BLAKE3-256 of a request's payload. A key reused with a
// different fingerprint is a conflict, not a retry.
type Fingerprint [32]byte

// String returns the first 8 bytes in hex, enough to tell fingerprints apart
// in messages.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:8]) }

// ValidateRequest checks a (scope, request key) pair: the key must be
// non-empty after trimming white space and at most MaxRequestKeyLen bytes; the
// scope at most MaxScopeLen bytes. Errors wrap ErrInvalidKey.
func ValidateRequest(scope, key string) error {
	switch {
	case strings.TrimSpace(key) == "":
		return fmt.Errorf("%w: empty request key", ErrInvalidKey)
	case len(key) > MaxRequestKeyLen:
		return fmt.Errorf("%w: request key is %d bytes, limit %d", ErrInvalidKey, len(key), MaxRequestKeyLen)
	case len(scope) > MaxScopeLen:
		return fmt.Errorf("%w: scope is %d bytes, limit %d", ErrInvalidKey, len(scope), MaxScopeLen)
	}
	return nil
}

// Record is one ledger decision as it travels through the WAL: a leader's
// idempotency.Ledger emits it, every node applies it to its ledger table
// (idempotency.LedgerTx.Apply).
//
// Which fields are meaningful depends on Kind:
//
//	claim:    Token, Time, Expires (lease end), Fingerprint, Scope, Key, Action (may be empty)
//	complete: Token, Time, Expires (end of replay), Fingerprint, Scope, Key, Outcome
//	fail:     same as complete (Expires: end of the failure's retention)
//	release:  Token, Time, Scope, Key
//	extend:   Token, Time, Expires (the new lease end), Scope, Key
//
// Time is the decision's WAL-clock timestamp (leader unix nanos). It is not
// part of the encoded body: a WAL carries it as the event's Time.
type Record struct {
	Kind        Kind
	Token       Token
	Time        int64
	Expires     int64
	Fingerprint Fingerprint
	Scope       string
	Key         string
	Outcome     []byte
	// Action is what the claimed request does, as its caller described it
	// (idempotency.ClaimOptions.Action): a later conflict on the key names it.
	Action string
}

// Record body versions: the first byte of every encoded body. Version 2 is
// a claim that carries an action; every other body, a claim without one
// included, is version 1, so each record has exactly one encoding and
// bodies written before actions existed decode unchanged.
const (
	recordVersion       = 1
	recordVersionAction = 2
)

func (k Kind) hasExpires() bool     { return k != Release }
func (k Kind) hasFingerprint() bool { return k != Release && k != Extend }
func (k Kind) hasOutcome() bool     { return k == Complete || k == Fail }

// Validate checks that r can be encoded canonically: a valid kind and
// request, no fields the kind does not carry, an outcome within bounds.
func (r *Record) Validate() error {
	if !r.Kind.Valid() {
		return fmt.Errorf("%w: %s", ErrBadRecord, r.Kind)
	}
	if err := ValidateRequest(r.Scope, r.Key); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRecord, err)
	}
	if !r.Kind.hasExpires() && r.Expires != 0 {
		return fmt.Errorf("%w: %s carries an expiry", ErrBadRecord, r.Kind)
	}
	if !r.Kind.hasFingerprint() && r.Fingerprint != (Fingerprint{}) {
		return fmt.Errorf("%w: %s carries a fingerprint", ErrBadRecord, r.Kind)
	}
	if !r.Kind.hasOutcome() && len(r.Outcome) != 0 {
		return fmt.Errorf("%w: %s carries an outcome", ErrBadRecord, r.Kind)
	}
	if r.Kind != Claim && r.Action != "" {
		return fmt.Errorf("%w: %s carries an action", ErrBadRecord, r.Kind)
	}
	if len(r.Action) > MaxActionLen {
		return fmt.Errorf("%w: action is %d bytes, limit %d", ErrBadRecord, len(r.Action), MaxActionLen)
	}
	if len(r.Outcome) > MaxOutcomeSize {
		return fmt.Errorf("%w: %w: %d bytes", ErrBadRecord, ErrOutcomeTooLarge, len(r.Outcome))
	}
	return nil
}

// AppendBody appends r's canonical body encoding (everything but Kind and
// Time) to dst. Layout, integers little-endian:
//
//	version u8 (2: a claim with an action; else 1) | token 16
//	| [expires i64]     (all but release)
//	| [fingerprint 32]  (claim, complete, fail)
//	| uvarint len + scope | uvarint len + key
//	| [uvarint len + outcome] (complete, fail) | [uvarint len + action] (version 2)
//
// Varints are minimal; decoding rejects anything else (and a version 2 body
// with an empty action), so a body has exactly one encoding. AppendBody does
// not validate r (see Validate).
func (r *Record) AppendBody(dst []byte) []byte {
	withAction := r.Kind == Claim && r.Action != ""
	if withAction {
		dst = append(dst, recordVersionAction)
	} else {
		dst = append(dst, recordVersion)
	}
	dst = append(dst, r.Token[:]...)
	if r.Kind.hasExpires() {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(r.Expires))
	}
	if r.Kind.hasFingerprint() {
		dst = append(dst, r.Fingerprint[:]...)
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.Scope)))
	dst = append(dst, r.Scope...)
	dst = binary.AppendUvarint(dst, uint64(len(r.Key)))
	dst = append(dst, r.Key...)
	if r.Kind.hasOutcome() {
		dst = binary.AppendUvarint(dst, uint64(len(r.Outcome)))
		dst = append(dst, r.Outcome...)
	}
	if withAction {
		dst = binary.AppendUvarint(dst, uint64(len(r.Action)))
		dst = append(dst, r.Action...)
	}
	return dst
}

// BodySize is len(r.AppendBody(nil)).
func (r *Record) BodySize() int {
	n := 1 + len(Token{})
	if r.Kind.hasExpires() {
		n += 8
	}
	if r.Kind.hasFingerprint() {
		n += len(Fingerprint{})
	}
	n += uvarintSize(uint64(len(r.Scope))) + len(r.Scope) + uvarintSize(uint64(len(r.Key))) + len(r.Key)
	if r.Kind.hasOutcome() {
		n += uvarintSize(uint64(len(r.Outcome))) + len(r.Outcome)
	}
	if r.Kind == Claim && r.Action != "" {
		n += uvarintSize(uint64(len(r.Action))) + len(r.Action)
	}
	return n
}

func uvarintSize(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// Decode decodes a record body of the given kind and time. It is
// strict: wrong version, non-minimal varints, lengths beyond the limits,
// trailing bytes and invalid requests are ErrBadRecord (marked
// corruption.Err), so decode(encode(r)) == r and nothing else decodes. Outcome aliases body.
func Decode(kind Kind, time int64, body []byte) (Record, error) {
	var p parsed
	if err := parse(kind, body, &p); err != nil {
		return Record{}, corruption.Mark(err)
	}
	r := Record{Kind: kind, Time: time, Token: p.token, Expires: p.expires, Fingerprint: p.fp,
		Scope: string(p.scope), Key: string(p.key), Outcome: p.outcome, Action: string(p.action)}
	return r, nil
}

// Check reports whether body is a canonical record body of kind, as
// Decode would, without allocating.
func Check(kind Kind, body []byte) error {
	var p parsed
	return corruption.Mark(parse(kind, body, &p))
}

type parsed struct {
	token                       Token
	expires                     int64
	fp                          Fingerprint
	scope, key, outcome, action []byte
}

func parse(kind Kind, body []byte, p *parsed) error {
	if !kind.Valid() {
		return fmt.Errorf("%w: %s", ErrBadRecord, kind)
	}
	if len(body) < 1+len(p.token) {
		return fmt.Errorf("%w: short body", ErrBadRecord)
	}
	withAction := body[0] == recordVersionAction && kind == Claim
	if body[0] != recordVersion && !withAction {
		return fmt.Errorf("%w: version %d of a %s body", ErrBadRecord, body[0], kind)
	}
	off := 1 + copy(p.token[:], body[1:])
	if kind.hasExpires() {
		if len(body)-off < 8 {
			return fmt.Errorf("%w: short body", ErrBadRecord)
		}
		p.expires = int64(binary.LittleEndian.Uint64(body[off:]))
		off += 8
	}
	if kind.hasFingerprint() {
		if len(body)-off < len(p.fp) {
			return fmt.Errorf("%w: short body", ErrBadRecord)
		}
		off += copy(p.fp[:], body[off:])
	}
	field := func(limit int, what string) ([]byte, error) {
		n, w := binary.Uvarint(body[off:])
		if w <= 0 || w != uvarintSize(n) {
			return nil, fmt.Errorf("%w: bad %s length varint", ErrBadRecord, what)
		}
		if n > uint64(limit) || n > uint64(len(body)-off-w) {
			return nil, fmt.Errorf("%w: %s length %d", ErrBadRecord, what, n)
		}
		b := body[off+w : off+w+int(n) : off+w+int(n)]
		off += w + int(n)
		if n == 0 {
			b = nil
		}
		return b, nil
	}
	var err error
	if p.scope, err = field(MaxScopeLen, "scope"); err != nil {
		return err
	}
	if p.key, err = field(MaxRequestKeyLen, "key"); err != nil {
		return err
	}
	if len(bytes.TrimSpace(p.key)) == 0 {
		return fmt.Errorf("%w: %w: empty request key", ErrBadRecord, ErrInvalidKey)
	}
	if kind.hasOutcome() {
		if p.outcome, err = field(MaxOutcomeSize, "outcome"); err != nil {
			return err
		}
	}
	if withAction {
		if p.action, err = field(MaxActionLen, "action"); err != nil {
			return err
		}
		if len(p.action) == 0 {
			return fmt.Errorf("%w: version 2 claim without an action", ErrBadRecord)
		}
	}
	if off != len(body) {
		return fmt.Errorf("%w: %d trailing bytes", ErrBadRecord, len(body)-off)
	}
	return nil
}

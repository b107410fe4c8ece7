package client

import (
	"errors"
	"fmt"
)

// ErrConflict: the request ID was already used with another payload (or
// action); nothing ran. The error is a *ConflictError carrying the node's
// message.
var ErrConflict = errors.New("client: request ID conflict")

// ErrOutcomeUnknown: the call's budget ended after an attempt that may
// have run (invariant 3). Retry with the same request ID: the retry
// answers the outcome, and never runs the request twice.
var ErrOutcomeUnknown = errors.New("client: outcome unknown: the request may have run; retry with the same request ID to learn its outcome (it will not run twice)")

// ErrUnavailable: the call's budget ended and no attempt could have run
// (every node refused the connection, or answered that it does not lead or
// cannot serve before the request was sent). The request did not run;
// retry later.
var ErrUnavailable = errors.New("client: no node took the request (it did not run); check that the nodes in Addrs are up and one leads, then retry")

// ErrRefused: the node refused the request (or the client did before
// sending it): it is invalid, or the node's handler or store will not run
// it. Retrying the same request will not help.
var ErrRefused = errors.New("client: request refused; retrying it will not help: fix the request")

// ErrDenied: the node refused the caller's identity (gRPC PermissionDenied
// or Unauthenticated): the certificate names no client, or another role.
// Retrying will not help.
var ErrDenied = errors.New("client: the node refused this client's identity; give the client a certificate of the cluster's CA naming oncewal://client/NAME")

// ErrClosed: the Client was closed.
var ErrClosed = errors.New("client: closed")

// ConflictError is the ErrConflict a Submit returns: RequestID was used
// before with another payload or action.
type ConflictError struct {
	RequestID string
	// Action is what this Submit said the request does (WithAction).
	Action string
	// Message is the node's account of the conflict (the recorded action
	// among it).
	Message string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%v: request ID %q (action %q): %s; a request ID names one request: use a new ID for another request", ErrConflict, e.RequestID, e.Action, e.Message)
}

// Is makes errors.Is(err, ErrConflict) hold.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// ErrRejected: a business rule rejected the request; the rejection is
// recorded under the request ID, so a retry answers it again and the
// request never runs. The error is a *RejectedError.
var ErrRejected = errors.New("client: request rejected")

// RejectedError is the ErrRejected a call returns: Code for a program to
// branch on ("insufficient_funds", "not_counter"), Detail for a person.
type RejectedError struct {
	RequestID string
	Code      string
	Detail    string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("%v: request ID %q: %s: %s (recorded: a retry with the same ID answers it again)", ErrRejected, e.RequestID, e.Code, e.Detail)
}

// Is makes errors.Is(err, ErrRejected) hold.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }

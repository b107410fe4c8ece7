// Package clienthistory records what the callers of package client were
// told, request by request, and checks it against the effects the requests
// left in a replica: the exactly-once oracle that the in-process tests of
// package client and the real-process nemesis of cmd/oncewal share.
//
// Every request adds 1 to a counter of its own (Request.Key) and 1 to the
// shared counter Total. The checks:
//
//  1. Acknowledged ⇒ took effect exactly once: a request any answer of
//     which was OK holds its counter at 1 in every replica checked.
//  2. Nothing twice: a request never told holds its counter at 0 or 1; one
//     every answer of which said it did not run (ErrUnavailable) at 0.
//  3. Total is the number of requests that took effect.
//  4. At most one fresh (not replayed) OK per request, and every OK
//     answers the same outcome (CheckAnswers).
//  5. Each client's (session's) successful answers are linearizable
//     against the sequential contract of a request ID (porcupine,
//     CheckLinearizable).
//  6. Epochs only grow as the clients see them: no write is acknowledged
//     at an epoch below one acknowledged before it was sent
//     (CheckEpochsGrow) — a deposed leader answers nothing once its
//     successor has.
//
// Contract: only _test.go files import this package (testutil's
// TestOnlyTestsImport); it is test code kept in one place.
package clienthistory

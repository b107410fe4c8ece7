// Package idempotency is part of oncewal. See the repository README.
package idempotency

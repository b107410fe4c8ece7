package idempotency

// Key is a 128-bit idempotency key.
type Key [16]byte

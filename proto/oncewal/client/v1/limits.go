package clientv1

// Limits of the client service's messages. A node refuses a request over
// one (REFUSED, or the gRPC status InvalidArgument for a session ID that is
// not SessionIDLen bytes); the Go client refuses it before sending. They
// match the request ledger's (idempotency.MaxRequestKeyLen, MaxActionLen,
// MaxOutcomeSize), so that a request the service takes is never refused by
// the ledger for its size.
const (
	SessionIDLen = 16      // a session ID's bytes
	MaxRequestID = 200     // a request ID's bytes
	MaxAction    = 200     // an action's bytes
	MaxOutcome   = 1 << 20 // a recorded outcome's bytes
	MaxPayload   = 1 << 20 // a Submit's payload bytes
	MaxOps       = 1 << 12 // the ops of a default payload (Ops)
	MaxMessage   = 1 << 12 // a reply's message bytes (longer ones are cut)
	// MaxRequest bounds every request message: the largest payload with
	// room for the other fields.
	MaxRequest = MaxPayload + 1<<12
)

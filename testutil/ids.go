package testutil

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/oncewal/oncewal/internal/eventid"
)

// SessionID draws a session ID from rng (session.ID is the same type):
// where session.NewID is random, a test that replays a seed gets the same
// sessions again.
func SessionID(rng *rand.Rand) eventid.SessionID {
	var id eventid.SessionID
	binary.LittleEndian.PutUint64(id[:8], rng.Uint64())
	binary.LittleEndian.PutUint64(id[8:], rng.Uint64())
	return id
}

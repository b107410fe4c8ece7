package client

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/oncewal/oncewal/internal/pki"
	clientv1 "github.com/oncewal/oncewal/proto/oncewal/client/v1"
)

// sessionID is a session's ID as the node gave it.
type sessionID = [clientv1.SessionIDLen]byte

// sessions is the Client's one session (invariant 6).
type sessions struct {
	opts *Options
	// renewing holds one token: one OpenSession at a time, and a caller
	// waiting for it can give up when its context ends.
	renewing chan struct{}

	// home is the Near of the first session when hasHome (invariant 8).
	home    sessionID
	hasHome bool
	// shard, when byShard, is the shard this session must be in: the
	// session of a shard's keys (invariant 10).
	shard   uint32
	byShard bool

	mu      sync.Mutex
	id      sessionID
	open    bool
	horizon time.Duration // the node's: an idle session expires after it
	lastUse time.Time     // opened, or last logged in (an OK Submit)
}

// initShard makes s the session of shard's keys.
func (s *sessions) initShard(o *Options, shard uint32) {
	s.opts, s.shard, s.byShard = o, shard, true
	s.renewing = make(chan struct{}, 1)
}

func (s *sessions) init(o *Options) {
	s.opts = o
	s.renewing = make(chan struct{}, 1)
	if name, ok := principalName(o); ok {
		s.home, s.hasHome = homeOf(name), true
	}
}

// homeOf is the fixed session ID whose shard every Client of principal
// name opens its first session in (invariant 8). The node only routes by
// it (a session's shard is a hash of its ID); no session has this ID.
func homeOf(name string) (home sessionID) {
	sum := sha256.Sum256([]byte("oncewal client home\x00" + name))
	copy(home[:], sum[:])
	return home
}

// principalName is the name the node will scope this client's requests
// by: Options.Principal when Insecure, else the name in the URI SAN of
// the TLS client certificate. A certificate given only through
// GetClientCertificate, or one that names no identity, has none here.
func principalName(o *Options) (string, bool) {
	if o.Insecure {
		return o.Principal, true
	}
	if len(o.TLS.Certificates) == 0 || len(o.TLS.Certificates[0].Certificate) == 0 {
		return "", false
	}
	leaf := o.TLS.Certificates[0].Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(o.TLS.Certificates[0].Certificate[0]); err != nil {
			return "", false
		}
	}
	id, err := pki.IdentityOf(leaf)
	if err != nil {
		return "", false
	}
	return id.Name, true
}

// usable returns the session and whether it can be used as is: it is
// open, not the one a node just said expired, and not idle for more than
// half its horizon (renewing early leaves the other half for clock skew
// between client and node, and for the request itself).
func (s *sessions) usable(expired *sessionID) (sessionID, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.open, expired != nil && *expired == s.id:
		return s.id, false
	case s.horizon > 0 && s.opts.now().Sub(s.lastUse) > s.horizon/2:
		return s.id, false
	}
	return s.id, true
}

// used records that the session logged a request: its idle time restarts.
func (s *sessions) used(id sessionID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open && s.id == id {
		s.lastUse = s.opts.now()
	}
}

// get returns the session to log in at addr, opening or renewing it there
// first if it is not usable. When it cannot (ok false), the step says what
// the attempt ends with; nothing of the request was sent.
func (s *sessions) get(ctx context.Context, c *Client, cc *grpc.ClientConn, addr string, expired *sessionID) (_ sessionID, _ step, ok bool) {
	if id, ok := s.usable(expired); ok {
		return id, step{}, true
	}
	select {
	case s.renewing <- struct{}{}:
	case <-ctx.Done():
		return sessionID{}, step{v: vWait, err: fmt.Errorf("waiting for the session: %w", ctx.Err())}, false
	}
	defer func() { <-s.renewing }()
	old, ok := s.usable(expired)
	if ok { // another call renewed it meanwhile
		return old, step{}, true
	}
	s.mu.Lock()
	renew := s.open
	req := clientv1.OpenSessionRequest{Shard: s.shard}
	switch {
	case renew:
		req.Near = s.id[:]
	case s.hasHome && !s.byShard:
		req.Near = s.home[:]
	}
	s.mu.Unlock()
	rep, err := clientv1.NewClientClient(cc).OpenSession(c.callContext(ctx), &req)
	if err != nil {
		return old, rpcStep(addr, fmt.Errorf("opening a session: %w", err), false), false
	}
	if rep.GetCode() != clientv1.Code_OK {
		return old, replyStep(addr, rep.GetCode(), rep.GetLeader(), rep.GetEpoch(), "opening a session: "+rep.GetMessage(), false), false
	}
	if len(rep.GetSession()) != clientv1.SessionIDLen {
		return old, step{v: vMove, err: fmt.Errorf("%s answered a session ID of %d bytes, want %d", addr, len(rep.GetSession()), clientv1.SessionIDLen)}, false
	}
	if s.byShard && rep.GetShard() != s.shard {
		return old, step{v: vMove, err: fmt.Errorf("%s opened a session of shard %d, not %d", addr, rep.GetShard(), s.shard)}, false
	}
	c.learned(rep.GetEpoch())
	c.learnShards(rep.GetShards())
	s.mu.Lock()
	s.id, s.open, s.horizon, s.lastUse = sessionID(rep.GetSession()), true, time.Duration(rep.GetHorizon()), s.opts.now()
	id := s.id
	s.mu.Unlock()
	if renew {
		c.opts.Logger.Info("client: session renewed", "addr", addr, "horizon", time.Duration(rep.GetHorizon()), "expired", expired != nil)
	} else {
		c.opts.Logger.Debug("client: session opened", "addr", addr, "horizon", time.Duration(rep.GetHorizon()))
	}
	return id, step{}, true
}

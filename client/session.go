package client

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/oncewal/oncewal/internal/clientwire"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// sessions is the Client's one session (invariant 6).
type sessions struct {
	opts *Options
	// renewing holds one token: one OpenSession at a time, and a caller
	// waiting for it can give up when its context ends.
	renewing chan struct{}

	// home is the Near of the first session when hasHome (invariant 8).
	home    clientwire.SessionID
	hasHome bool

	mu      sync.Mutex
	id      clientwire.SessionID
	open    bool
	horizon time.Duration // the node's: an idle session expires after it
	lastUse time.Time     // opened, or last logged in (an OK Submit)
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
func homeOf(name string) (home clientwire.SessionID) {
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
	id, err := grpctransport.IdentityOf(leaf)
	if err != nil {
		return "", false
	}
	return id.Name, true
}

// usable returns the session and whether it can be used as is: it is
// open, not the one a node just said expired, and not idle for more than
// half its horizon (renewing early leaves the other half for clock skew
// between client and node, and for the request itself).
func (s *sessions) usable(expired *clientwire.SessionID) (clientwire.SessionID, bool) {
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
func (s *sessions) used(id clientwire.SessionID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open && s.id == id {
		s.lastUse = s.opts.now()
	}
}

// get returns the session to log in at addr, opening or renewing it there
// first if it is not usable. When it cannot (ok false), the step says what
// the attempt ends with; nothing of the request was sent.
func (s *sessions) get(ctx context.Context, c *Client, cc *grpc.ClientConn, addr string, expired *clientwire.SessionID) (_ clientwire.SessionID, _ step, ok bool) {
	if id, ok := s.usable(expired); ok {
		return id, step{}, true
	}
	select {
	case s.renewing <- struct{}{}:
	case <-ctx.Done():
		return clientwire.SessionID{}, step{v: vWait, err: fmt.Errorf("waiting for the session: %w", ctx.Err())}, false
	}
	defer func() { <-s.renewing }()
	old, ok := s.usable(expired)
	if ok { // another call renewed it meanwhile
		return old, step{}, true
	}
	s.mu.Lock()
	renew := s.open
	req := clientwire.OpenSessionRequest{Near: s.id, HasNear: true}
	if !renew {
		req.Near, req.HasNear = s.home, s.hasHome
	}
	s.mu.Unlock()
	out, err := c.call(ctx, cc, clientwire.OpenSessionMethod, req.Marshal(), nil)
	if err != nil {
		return old, rpcStep(addr, fmt.Errorf("opening a session: %w", err), false), false
	}
	var rep clientwire.OpenSessionReply
	if err := rep.Unmarshal(out); err != nil {
		return old, step{v: vMove, err: fmt.Errorf("%s answered a malformed session: %w", addr, err)}, false
	}
	if rep.Code != clientwire.OK {
		return old, replyStep(addr, rep.Code, rep.Leader, rep.Epoch, "opening a session: "+rep.Message, false), false
	}
	c.learned(rep.Epoch)
	s.mu.Lock()
	s.id, s.open, s.horizon, s.lastUse = rep.Session, true, time.Duration(rep.Horizon), s.opts.now()
	s.mu.Unlock()
	if renew {
		c.opts.Logger.Info("client: session renewed", "addr", addr, "horizon", time.Duration(rep.Horizon), "expired", expired != nil)
	} else {
		c.opts.Logger.Debug("client: session opened", "addr", addr, "horizon", time.Duration(rep.Horizon))
	}
	return rep.Session, step{}, true
}

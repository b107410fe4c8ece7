package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Identity is who a certificate says its holder is: a role in the
// deployment (RoleNode, RoleFollower, RoleClient) and a name (a follower's
// ID, a client's principal). A certificate names it with one URI SAN,
// oncewal://ROLE/NAME (IdentityURI).
type Identity struct {
	Role string
	Name string
}

// ErrNoIdentity: a peer without a verified certificate (an insecure
// server), or a certificate that names no oncewal identity.
var ErrNoIdentity = errors.New("pki: no oncewal identity")

// URI returns the URI SAN that names id.
func (id Identity) URI() *url.URL { return IdentityURI(id.Role, id.Name) }

func (id Identity) String() string { return id.Role + "/" + id.Name }

// IdentityOf returns the identity cert names: its one URI SAN of scheme
// oncewal, with a known role and a non-empty name without slashes. A
// certificate that names none, or more than one, is ErrNoIdentity.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var ids []Identity
	for _, u := range cert.URIs {
		if u.Scheme != identityScheme {
			continue
		}
		name := strings.TrimPrefix(u.Path, "/")
		switch {
		case u.Host != RoleNode && u.Host != RoleFollower && u.Host != RoleClient:
			return Identity{}, fmt.Errorf("%w: %s names the unknown role %q", ErrNoIdentity, u, u.Host)
		case name == "" || strings.Contains(name, "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil:
			return Identity{}, fmt.Errorf("%w: %s is not oncewal://ROLE/NAME", ErrNoIdentity, u)
		}
		ids = append(ids, Identity{Role: u.Host, Name: name})
	}
	switch len(ids) {
	case 0:
		return Identity{}, fmt.Errorf("%w: certificate %q has no oncewal:// URI SAN", ErrNoIdentity, cert.Subject.CommonName)
	case 1:
		return ids[0], nil
	}
	return Identity{}, fmt.Errorf("%w: certificate %q names %d identities", ErrNoIdentity, cert.Subject.CommonName, len(ids))
}

// identityScheme is the scheme of the URI SAN that names an Identity.
const identityScheme = "oncewal"

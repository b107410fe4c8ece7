// Package pki makes a throwaway certificate authority and one certificate
// per identity of a deployment — the leader's node, each follower, each
// client — for trying oncewal's mutual TLS locally: oncewal gencerts, the
// network demo, tests and examples. A certificate names its identity with
// one URI SAN, oncewal://ROLE/NAME (IdentityURI), the form IdentityOf
// reads; the leader binds a follower's hello to it. Add issues more
// identities later with the CA a directory already holds (LoadCA), writing
// only their files. Production deployments bring their own PKI (issuing
// the same URI SANs) and load it with grpctransport.LoadServerTLS and LoadClientTLS. It
// is internal: not part of oncewal's API.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// CA is a certificate authority for trying mutual TLS locally (oncewal
// gencerts, the network demo, tests). Production deployments bring their own
// PKI and only use LoadServerTLS/LoadClientTLS.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
}

// NewCA makes a self-signed ECDSA P-256 CA valid in [notBefore, notAfter].
func NewCA(name string, notBefore, notAfter time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"oncewal"}},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}

// Pool returns a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Roles a certificate names (Identity.Role; grpctransport's tests check
// that IdentityOf reads what IssueIdentity writes).
const (
	RoleNode     = "node"     // a replica: serves as leader, may follow under its own name
	RoleFollower = "follower" // follows under its own name only
	RoleClient   = "client"   // calls the client service; may not follow
)

// MaxNameLen bounds an identity's name: a follower's name is its ID, which
// replication.MaxFollowerIDLen bounds.
const MaxNameLen = 64

// ErrBadName: an identity name that is empty, too long, has a byte outside
// [A-Za-z0-9._-] (a slash included), or is given twice. Nothing is issued
// or written.
var ErrBadName = errors.New("pki: bad identity name")

// ValidName reports whether name can name an identity: 1..MaxNameLen bytes
// of [A-Za-z0-9._-], the alphabet of follower IDs, safe in a URI path and
// a file name. The error wraps ErrBadName.
func ValidName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: %q is not 1-%d bytes; choose a name of 1-%d bytes of [A-Za-z0-9._-]", ErrBadName, name, MaxNameLen, MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q: byte %q at %d is not in [A-Za-z0-9._-]; choose a name of 1-%d bytes of [A-Za-z0-9._-]", ErrBadName, name, c, i, MaxNameLen)
		}
	}
	return nil
}

// IdentityURI is the URI SAN that names the identity role/name:
// oncewal://ROLE/NAME, what IdentityOf reads back.
func IdentityURI(role, name string) *url.URL {
	return &url.URL{Scheme: "oncewal", Host: role, Path: "/" + name}
}

// Leaf is an issued certificate and its key (PEM) and the identity it
// names.
type Leaf struct {
	Role, Name string
	Cert, Key  []byte
	// member: a cluster member's node certificate (Spec.Nodes), filed
	// under its name; the one other node certificate is the leader's.
	member bool
}

// Pair is the certificate and key for a tls.Config.
func (l Leaf) Pair() (tls.Certificate, error) { return tls.X509KeyPair(l.Cert, l.Key) }

// Issue signs an ECDSA P-256 leaf for hosts (DNS names or IP literals)
// when server is true, a client certificate otherwise. It returns the
// certificate and PKCS#8 key as PEM. It names no identity: IssueIdentity
// does.
func (ca *CA) Issue(name string, hosts []string, server bool, notBefore, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if server {
		usage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	return ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: name, Organization: []string{"oncewal"}}, ExtKeyUsage: usage},
		hosts, notBefore, notAfter)
}

// IssueIdentity signs a certificate naming role/name with its one URI SAN.
// A node's is both a server certificate for hosts and a client one (a node
// leads, and follows under its name after a failover); a follower's and a
// client's are client certificates (hosts must be empty). A bad name wraps
// ErrBadName.
func (ca *CA) IssueIdentity(role, name string, hosts []string, notBefore, notAfter time.Time) (Leaf, error) {
	if err := ValidName(name); err != nil {
		return Leaf{}, err
	}
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	switch role {
	case RoleNode:
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	case RoleFollower, RoleClient:
		if len(hosts) > 0 {
			return Leaf{}, fmt.Errorf("pki: a %s certificate is a client certificate and names no hosts (%v)", role, hosts)
		}
	default:
		return Leaf{}, fmt.Errorf("pki: unknown role %q (node, follower, client)", role)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "oncewal " + role + " " + name, Organization: []string{"oncewal"}},
		ExtKeyUsage: usage,
		URIs:        []*url.URL{IdentityURI(role, name)},
	}
	cert, key, err := ca.issue(tmpl, hosts, notBefore, notAfter)
	if err != nil {
		return Leaf{}, err
	}
	return Leaf{Role: role, Name: name, Cert: cert, Key: key}, nil
}

// issue completes tmpl (serial, validity, key usage, hosts) and signs it
// with a fresh key.
func (ca *CA) issue(tmpl *x509.Certificate, hosts []string, notBefore, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = notBefore, notAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// DefaultHosts are the names a generated leader certificate is valid for.
var DefaultHosts = []string{"localhost", "127.0.0.1", "::1"}

const (
	// DefaultNode is the node identity the leader's certificate names.
	DefaultNode = "n0"
	// DefaultFollower is the follower GenerateCerts issues a certificate
	// for (Certs.FollowerPair).
	DefaultFollower = "f1"
)

// Spec says which certificates Generate issues.
type Spec struct {
	// Hosts are the names and IPs the leader's certificate is valid for.
	// Default DefaultHosts.
	Hosts []string
	// Node is the node identity the leader's certificate names. Default
	// DefaultNode.
	Node string
	// Followers and Clients get one certificate each, naming them. Default
	// none.
	Followers, Clients []string
	// Nodes are the members of a cluster of oncewal node processes: one
	// node certificate each (oncewal://node/NAME, server and client: a
	// member serves and dials with it), valid for Hosts. Default none.
	Nodes []string
	// ValidFor is the validity from an hour ago (the hour absorbs clock
	// skew between machines). Required.
	ValidFor time.Duration
}

// withDefaults is s with its unset fields defaulted.
func (s Spec) withDefaults() Spec {
	if len(s.Hosts) == 0 {
		s.Hosts = DefaultHosts
	}
	if s.Node == "" {
		s.Node = DefaultNode
	}
	return s
}

// Validate reports every problem of s (its unset fields defaulted),
// joined: a name ValidName refuses or given twice in a role (wrapping
// ErrBadName; a follower may not share the node's name either, as both
// could follow as that ID), an empty host, a validity that is not
// positive.
func (s Spec) Validate() error { return s.withDefaults().validate(true) }

// ValidateAdd is Validate for Add: the same rules without the leader's
// node (Add issues no leader certificate, so Node is not used).
func (s Spec) ValidateAdd() error { return s.withDefaults().validate(false) }

func (s Spec) validate(leader bool) error {
	var errs []error
	seen := map[string]string{} // follow-capable names, then clients'
	add := func(role, name string) {
		if err := ValidName(name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", role, err))
			return
		}
		key := name
		if role == RoleClient {
			key = "client/" + name
		}
		switch prev, dup := seen[key]; {
		case dup && prev == role:
			errs = append(errs, fmt.Errorf("%w: %s %q is given twice; give each %s its own name", ErrBadName, role, name, role))
			return
		case dup:
			errs = append(errs, fmt.Errorf("%w: %q names both the %s and a %s, which could then follow as each other; give each its own name", ErrBadName, name, prev, role))
			return
		}
		seen[key] = role
	}
	if leader {
		add(RoleNode, s.Node)
	}
	for _, f := range s.Followers {
		add(RoleFollower, f)
	}
	for _, c := range s.Clients {
		add(RoleClient, c)
	}
	for _, n := range s.Nodes {
		add(RoleNode, n)
	}
	for _, h := range s.Hosts {
		if strings.TrimSpace(h) == "" {
			errs = append(errs, fmt.Errorf("%w: an empty host name in %q", ErrBadName, s.Hosts))
		}
	}
	if s.ValidFor <= 0 {
		errs = append(errs, fmt.Errorf("pki: validity %v is not positive", s.ValidFor))
	}
	return errors.Join(errs...)
}

// Certs is a CA and the certificates it issued, all PEM: the leader's (a
// node identity), one per follower, one per client and one per member.
// Certs from Add hold no leader certificate (a zero Leader) and a CA that
// is already in its directory.
type Certs struct {
	CA        *CA
	Leader    Leaf
	Followers []Leaf
	Clients   []Leaf
	Nodes     []Leaf
	// NotAfter is when the issued certificates expire.
	NotAfter time.Time
	// caWritten: the CA came from the directory (Add), and WriteDir
	// writes only the issued certificates.
	caWritten bool
}

// Generate makes a fresh CA and the certificates s asks for. A bad name
// (ErrBadName) issues nothing.
func Generate(s Spec) (*Certs, error) {
	s = s.withDefaults()
	if err := s.Validate(); err != nil {
		return nil, err
	}
	nb := time.Now().Add(-time.Hour)
	na := time.Now().Add(s.ValidFor)
	ca, err := NewCA("oncewal CA", nb, na)
	if err != nil {
		return nil, err
	}
	c := &Certs{CA: ca, NotAfter: na}
	if c.Leader, err = ca.IssueIdentity(RoleNode, s.Node, s.Hosts, nb, na); err != nil {
		return nil, err
	}
	for _, set := range []struct {
		role  string
		names []string
		out   *[]Leaf
	}{{RoleFollower, s.Followers, &c.Followers}, {RoleClient, s.Clients, &c.Clients}} {
		for _, name := range set.names {
			l, err := ca.IssueIdentity(set.role, name, nil, nb, na)
			if err != nil {
				return nil, err
			}
			*set.out = append(*set.out, l)
		}
	}
	for _, name := range s.Nodes {
		l, err := ca.IssueIdentity(RoleNode, name, s.Hosts, nb, na)
		if err != nil {
			return nil, err
		}
		l.member = true
		c.Nodes = append(c.Nodes, l)
	}
	return c, nil
}

// GenerateCerts makes a fresh CA, a leader certificate for hosts (default
// DefaultHosts) naming the node DefaultNode, and a follower certificate
// naming DefaultFollower, valid for validFor from an hour ago.
func GenerateCerts(hosts []string, validFor time.Duration) (*Certs, error) {
	return Generate(Spec{Hosts: hosts, Followers: []string{DefaultFollower}, ValidFor: validFor})
}

// LeaderPair is the leader's certificate and key, for
// grpctransport.ServerTLSConfig(c.CA.Pool(), pair).
func (c *Certs) LeaderPair() (tls.Certificate, error) { return c.Leader.Pair() }

// FollowerPair is the first follower's certificate and key (GenerateCerts:
// DefaultFollower's), for grpctransport.ClientTLSConfig(c.CA.Pool(), pair, "").
func (c *Certs) FollowerPair() (tls.Certificate, error) {
	if len(c.Followers) == 0 {
		return tls.Certificate{}, errors.New("pki: no follower certificate was issued")
	}
	return c.Followers[0].Pair()
}

// Certificate file names WriteDir uses: the CA's and the leader's here,
// a follower's and a client's from their names (FollowerFiles,
// ClientFiles).
const (
	FileCA        = "ca.pem"
	FileCAKey     = "ca-key.pem"
	FileLeader    = "leader.pem"
	FileLeaderKey = "leader-key.pem"
)

// FollowerFiles are the certificate and key file names of follower name:
// follower-NAME.pem and follower-NAME-key.pem.
func FollowerFiles(name string) (cert, key string) { return leafFiles(RoleFollower, name) }

// ClientFiles are the certificate and key file names of client name:
// client-NAME.pem and client-NAME-key.pem.
func ClientFiles(name string) (cert, key string) { return leafFiles(RoleClient, name) }

// NodeFiles are the certificate and key file names of cluster member name
// (Spec.Nodes): node-NAME.pem and node-NAME-key.pem.
func NodeFiles(name string) (cert, key string) { return leafFiles(RoleNode, name) }

func leafFiles(role, name string) (cert, key string) {
	return role + "-" + name + ".pem", role + "-" + name + "-key.pem"
}

// Files are the file names WriteDir gives l's certificate and key: the
// leader's node certificate is leader.pem, a member's node-NAME.pem.
func (l Leaf) Files() (cert, key string) {
	if l.Role == RoleNode && !l.member {
		return FileLeader, FileLeaderKey
	}
	return leafFiles(l.Role, l.Name)
}

// ErrExists: a file WriteDir (or Add) would write already exists. Nothing
// is written; the error names every such file.
var ErrExists = errors.New("pki: file already exists")

// KeyPEM is the CA's key as PKCS#8 PEM, what WriteDir writes as
// FileCAKey.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

type outFile struct {
	name string
	data []byte
	mode os.FileMode
}

// files are what WriteDir writes: the CA's (unless it came from the
// directory) and each issued certificate and key.
func (c *Certs) files() ([]outFile, error) {
	var files []outFile
	if !c.caWritten {
		caKey, err := c.CA.KeyPEM()
		if err != nil {
			return nil, err
		}
		files = append(files, outFile{FileCA, c.CA.CertPEM, 0o644}, outFile{FileCAKey, caKey, 0o600})
	}
	for _, l := range c.Leaves() {
		cert, key := l.Files()
		files = append(files, outFile{cert, l.Cert, 0o644}, outFile{key, l.Key, 0o600})
	}
	return files, nil
}

// refuseExisting returns ErrExists naming every one of names that exists
// in dir, or another error if one cannot be checked.
func refuseExisting(dir string, names []string) error {
	var there []string
	for _, name := range names {
		p := filepath.Join(dir, name)
		if _, err := os.Lstat(p); err == nil {
			there = append(there, p)
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	switch len(there) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%w: %s; not overwriting (choose an empty directory, or names not yet issued)", ErrExists, there[0])
	}
	return fmt.Errorf("%w: %s; not overwriting (choose an empty directory, or names not yet issued)", ErrExists, strings.Join(there, ", "))
}

// WriteDir writes the certificates (0644) and keys (0600) into dir, creating
// it (0700); for Certs from Add, only the issued ones (the CA is there). It
// refuses to overwrite existing files (ErrExists), and then writes none; a
// write that fails removes the files this call wrote.
func (c *Certs) WriteDir(dir string) (err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files, err := c.files()
	if err != nil {
		return err
	}
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f.name
	}
	if err := refuseExisting(dir, names); err != nil {
		return err
	}
	var written []string
	defer func() {
		if err != nil {
			for _, p := range written {
				_ = os.Remove(p)
			}
		}
	}()
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		fh, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, f.mode)
		if err != nil {
			if errors.Is(err, os.ErrExist) {
				err = fmt.Errorf("%w: %s; not overwriting (it appeared while writing)", ErrExists, p)
			}
			return err
		}
		written = append(written, p)
		_, err = fh.Write(f.data)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Leaves are the leader's (none from Add), the followers', the clients'
// and the members' certificates, in that order.
func (c *Certs) Leaves() []Leaf {
	var out []Leaf
	if c.Leader.Cert != nil {
		out = append(out, c.Leader)
	}
	return append(append(append(out, c.Followers...), c.Clients...), c.Nodes...)
}

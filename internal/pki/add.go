package pki

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Errors of an existing CA that LoadCA (and so Add) cannot sign with.
// Each names the file and what to do; nothing is issued or written.
var (
	// ErrCAMissing: the directory holds ca.pem without ca-key.pem, or the
	// reverse (or neither, to LoadCA).
	ErrCAMissing = errors.New("pki: the CA is incomplete")
	// ErrBadCA: ca.pem or ca-key.pem cannot be read, is not PEM, holds
	// something else than one certificate or one private key, or a key
	// of a kind pki does not sign with (ECDSA only).
	ErrBadCA = errors.New("pki: unusable CA file")
	// ErrNotCA: ca.pem holds a certificate that is not a CA's (basic
	// constraints CA:FALSE, or a key usage without certSign).
	ErrNotCA = errors.New("pki: not a CA certificate")
	// ErrCAKeyMismatch: ca-key.pem is not the key of ca.pem's certificate.
	ErrCAKeyMismatch = errors.New("pki: the CA key does not match the CA certificate")
	// ErrCAExpired: the CA's certificate is expired (or not yet valid):
	// certificates it signs would not verify.
	ErrCAExpired = errors.New("pki: the CA certificate is expired")
)

// HasCA reports whether dir holds a CA's file, FileCA or FileCAKey
// (either: Add then says which is missing). A dir that does not exist
// holds none.
func HasCA(dir string) (bool, error) {
	for _, name := range []string{FileCA, FileCAKey} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			return true, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return false, err
		}
	}
	return false, nil
}

// LoadCA reads the CA that Generate's WriteDir wrote into dir, FileCA and
// FileCAKey (PKCS#8 or SEC 1 PEM, ECDSA), and checks that it can sign:
// both files there (ErrCAMissing), each one PEM block of the right kind
// (ErrBadCA), a CA certificate (ErrNotCA), the key its own
// (ErrCAKeyMismatch), valid now (ErrCAExpired).
func LoadCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, FileCA), filepath.Join(dir, FileCAKey)
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	switch noCert, noKey := errors.Is(cerr, os.ErrNotExist), errors.Is(kerr, os.ErrNotExist); {
	case noCert && noKey:
		return nil, fmt.Errorf("%w: %s holds neither %s nor %s", ErrCAMissing, dir, FileCA, FileCAKey)
	case noCert:
		return nil, fmt.Errorf("%w: %s is there but %s is not: put the CA's certificate back beside its key, or choose an empty directory for a new CA",
			ErrCAMissing, keyPath, certPath)
	case noKey:
		return nil, fmt.Errorf("%w: %s is there but its key %s is not: only the CA's key can sign; put it back (mode 0600), or choose an empty directory for a new CA",
			ErrCAMissing, certPath, keyPath)
	case cerr != nil:
		return nil, fmt.Errorf("%w: %w", ErrBadCA, cerr)
	case kerr != nil:
		return nil, fmt.Errorf("%w: %w", ErrBadCA, kerr)
	}
	der, err := onePEM(certPath, certPEM, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w; %s", ErrBadCA, certPath, err, restore)
	}
	kb, err := onePEM(keyPath, keyPEM, "PRIVATE KEY", "EC PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	var key any
	if kb.Type == "EC PRIVATE KEY" {
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	} else {
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w; %s", ErrBadCA, keyPath, err, restore)
	}
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%w: %s holds a %T key; gencerts signs with ECDSA CA keys only (a CA of another kind issues its own certificates)", ErrBadCA, keyPath, key)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, fmt.Errorf("%w: %s (%s) is not a CA (basic constraints CA:FALSE) and cannot sign certificates; %s must hold the CA's own certificate",
			ErrNotCA, certPath, cert.Subject, FileCA)
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("%w: %s (%s) has no certSign key usage and cannot sign certificates; %s must hold the CA's own certificate",
			ErrNotCA, certPath, cert.Subject, FileCA)
	}
	if !ec.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%w: %s is not the key of %s (%s): certificates it signed would not chain to that CA; put the CA's own key beside it",
			ErrCAKeyMismatch, keyPath, certPath, cert.Subject)
	}
	now := time.Now()
	if now.After(cert.NotAfter) {
		return nil, fmt.Errorf("%w: %s expired on %s: certificates it signs would be refused; make a new CA in an empty directory and issue every identity's certificate from it",
			ErrCAExpired, certPath, cert.NotAfter.UTC().Format(time.DateTime))
	}
	if now.Before(cert.NotBefore) {
		return nil, fmt.Errorf("%w: %s is not valid before %s (is this machine's clock right?)", ErrCAExpired, certPath, cert.NotBefore.UTC().Format(time.DateTime))
	}
	return &CA{Cert: cert, Key: ec, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})}, nil
}

// restore is what to do about a CA file that does not parse.
const restore = "restore it from a copy, or choose an empty directory for a new CA"

// onePEM is the one PEM block of data, of one of types; anything else
// (no block, another type, more blocks or bytes after it) is ErrBadCA.
func onePEM(path string, data []byte, types ...string) (*pem.Block, error) {
	b, rest := pem.Decode(data)
	if b == nil {
		return nil, fmt.Errorf("%w: %s holds no PEM block (corrupt or not PEM); %s", ErrBadCA, path, restore)
	}
	if !slices.Contains(types, b.Type) {
		return nil, fmt.Errorf("%w: %s holds a %q PEM block, want %s", ErrBadCA, path, b.Type, strings.Join(types, " or "))
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return nil, fmt.Errorf("%w: %s holds more than one %s (or bytes after it); gencerts signs with exactly one CA", ErrBadCA, path, b.Type)
	}
	return b, nil
}

// Add issues, with the CA in dir (LoadCA), only the certificates s names:
// one per s.Followers, s.Clients and s.Nodes (the members' valid for
// s.Hosts), for WriteDir to write beside the CA. No leader certificate is
// issued and s.Node is not used. The certificates are valid from an hour
// ago (not before the CA) for s.ValidFor, ending no later than the CA does
// (Certs.NotAfter). Before issuing anything it refuses: a bad name or a
// spec naming nobody (ErrBadName), a CA LoadCA refuses, a certificate file
// already in dir (ErrExists, naming every one), and a follower or member
// named as a node or follower that a certificate of this CA in dir already
// names (ErrBadName: the two could follow as each other).
func Add(dir string, s Spec) (*Certs, error) {
	s = s.withDefaults()
	if err := s.validate(false); err != nil {
		return nil, err
	}
	if len(s.Followers)+len(s.Clients)+len(s.Nodes) == 0 {
		return nil, fmt.Errorf("%w: nothing to add: name followers, clients or nodes", ErrBadName)
	}
	ca, err := LoadCA(dir)
	if err != nil {
		return nil, err
	}
	var errs []error
	held := heldIdentities(dir, ca)
	for _, set := range []struct{ role, other string }{{RoleFollower, RoleNode}, {RoleNode, RoleFollower}} {
		names := s.Followers
		if set.role == RoleNode {
			names = s.Nodes
		}
		for _, name := range names {
			if file, ok := held[set.other+"/"+name]; ok {
				errs = append(errs, fmt.Errorf("%w: %s names the %s %q; a %s of that name could then follow as it: give the new %s another name",
					ErrBadName, filepath.Join(dir, file), set.other, name, set.role, set.role))
			}
		}
	}
	var names []string
	for _, set := range []struct {
		files func(string) (string, string)
		names []string
	}{{FollowerFiles, s.Followers}, {ClientFiles, s.Clients}, {NodeFiles, s.Nodes}} {
		for _, n := range set.names {
			cert, key := set.files(n)
			names = append(names, cert, key)
		}
	}
	if err := refuseExisting(dir, names); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	nb, na := time.Now().Add(-time.Hour), time.Now().Add(s.ValidFor)
	if nb.Before(ca.Cert.NotBefore) {
		nb = ca.Cert.NotBefore
	}
	if na.After(ca.Cert.NotAfter) {
		na = ca.Cert.NotAfter
	}
	c := &Certs{CA: ca, NotAfter: na, caWritten: true}
	for _, set := range []struct {
		role  string
		names []string
		hosts []string
		out   *[]Leaf
	}{{RoleFollower, s.Followers, nil, &c.Followers}, {RoleClient, s.Clients, nil, &c.Clients}, {RoleNode, s.Nodes, s.Hosts, &c.Nodes}} {
		for _, name := range set.names {
			l, err := ca.IssueIdentity(set.role, name, set.hosts, nb, na)
			if err != nil {
				return nil, err
			}
			l.member = set.role == RoleNode
			*set.out = append(*set.out, l)
		}
	}
	return c, nil
}

// heldIdentities are the identities ("node/a") that the certificates of ca
// in dir name (*.pem but keys and the CA's own), each with its file. A
// file that is not such a certificate is skipped: it names nobody ca
// vouches for.
func heldIdentities(dir string, ca *CA) map[string]string {
	held := map[string]string{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return held
	}
	for _, e := range ents {
		n := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(n, ".pem") || strings.HasSuffix(n, "-key.pem") || n == FileCA {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			continue
		}
		b, _ := pem.Decode(data)
		if b == nil || b.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil || cert.CheckSignatureFrom(ca.Cert) != nil {
			continue
		}
		for _, u := range cert.URIs {
			if u.Scheme == "oncewal" && strings.HasPrefix(u.Path, "/") {
				held[u.Host+u.Path] = n
			}
		}
	}
	return held
}

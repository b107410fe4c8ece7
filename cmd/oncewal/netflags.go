package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/oncewal/oncewal/internal/pki"
	"github.com/oncewal/oncewal/replication"
	"github.com/oncewal/oncewal/replication/grpctransport"
)

// tlsFlags are the transport-security flags shared by leader and follower.
type tlsFlags struct {
	ca, cert, key *string
	insecure      *bool
}

func addTLSFlags(fs *flag.FlagSet, role string) *tlsFlags {
	return &tlsFlags{
		ca:       fs.String("tls-ca", "", "PEM file of the CA that "+map[string]string{"leader": "followers'", "follower": "the leader's", "node": "the other members' and clients'"}[role]+" certificates must chain to"),
		cert:     fs.String("tls-cert", "", "PEM file of this "+role+"'s certificate"),
		key:      fs.String("tls-key", "", "PEM file of this "+role+"'s private key"),
		insecure: fs.Bool("insecure", false, "plaintext, no authentication: ONLY for tests on loopback (follower IDs are taken on trust; anyone who reaches the port can read the log or pose as any follower)"),
	}
}

// usage is the flags' usage problem, "" if none: --insecure with a TLS
// flag, or not every TLS flag without it.
func (f *tlsFlags) usage() string {
	given := *f.ca != "" || *f.cert != "" || *f.key != ""
	switch {
	case *f.insecure && given:
		return "--insecure excludes --tls-ca/--tls-cert/--tls-key"
	case !*f.insecure && (*f.ca == "" || *f.cert == "" || *f.key == ""):
		return "mutual TLS needs --tls-ca, --tls-cert and --tls-key (make them with `oncewal gencerts DIR`), or --insecure for loopback tests"
	}
	return ""
}

// load returns the TLS config, or nil with insecure set; a usage problem is
// returned as a message.
func (f *tlsFlags) load(server bool) (*tls.Config, string, error) {
	if msg := f.usage(); msg != "" || *f.insecure {
		return nil, msg, nil
	}
	var cfg *tls.Config
	var err error
	if server {
		cfg, err = grpctransport.LoadServerTLS(*f.ca, *f.cert, *f.key)
	} else {
		cfg, err = grpctransport.LoadClientTLS(*f.ca, *f.cert, *f.key)
	}
	return cfg, "", err
}

// open is load for a command whose flags passed their checks: a usage
// problem is a usage error (exit 2), files that do not load are logged as
// cmd's TLS error (exit 1), and plaintext is warned about with insecure,
// what --insecure means for cmd. ok false: exit with code.
func (f *tlsFlags) open(fs *flag.FlagSet, stderr io.Writer, log *slog.Logger, cmd string, server bool, insecure string) (cfg *tls.Config, code int, ok bool) {
	cfg, msg, err := f.load(server)
	switch {
	case msg != "":
		return nil, usageError(fs, stderr, "%s", msg), false
	case err != nil:
		log.Error(cmd+": TLS", "err", err)
		return nil, exitFailure, false
	case cfg == nil:
		log.Warn(cmd + ": --insecure: " + insecure)
	}
	return cfg, 0, true
}

// logFlags are the logging flags shared by leader and follower.
type logFlags struct {
	format, level *string
	debug         *bool
}

func addLogFlags(fs *flag.FlagSet) *logFlags {
	return &logFlags{
		format: fs.String("log-format", "text", "log line format: text (key=value) or json (one object per line)"),
		level:  fs.String("log-level", "info", "lowest level logged: debug, info, warn or error (Pebble's own lines carry component=pebble; its routine ones are debug)"),
		debug:  fs.Bool("debug", false, "same as --log-level debug"),
	}
}

// check validates the flags into c.
func (f *logFlags) check(c *flagCheck) {
	if *f.format != "text" && *f.format != "json" {
		c.failf("--log-format %q: want text or json", *f.format)
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(*f.level)); err != nil {
		c.failf("--log-level %q: want debug, info, warn or error", *f.level)
	}
}

// logger returns the logger the flags describe, writing to w; the flags
// must have passed check.
func (f *logFlags) logger(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(*f.level))
	if *f.debug {
		level = slog.LevelDebug
	}
	return newLogger(w, *f.format, level)
}

// newLogger returns a logger writing format ("text" or "json") lines at level
// and above to w.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// every calls fn every d until done is closed (d <= 0: never).
func every(d time.Duration, done <-chan struct{}, fn func()) {
	if d <= 0 {
		<-done
		return
	}
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			fn()
		case <-done:
			return
		}
	}
}

// loopbackTransport returns, when on, a sim.Options.Transport that runs the
// demo over the real network transport: per shard a gRPC server on
// 127.0.0.1 with mutual TLS, certificates generated in memory, and a
// Dialer every follower shares that dials each with its own certificate.
func loopbackTransport(on bool) func(uint32) (replication.Listener, replication.Dialer, func() error, error) {
	if !on {
		return nil
	}
	return func(uint32) (replication.Listener, replication.Dialer, func() error, error) {
		certs, err := pki.Generate(pki.Spec{Hosts: []string{"127.0.0.1"}, ValidFor: time.Hour})
		if err != nil {
			return nil, nil, nil, err
		}
		leaderPair, err := certs.LeaderPair()
		if err != nil {
			return nil, nil, nil, err
		}
		st := grpctransport.ServerTLSConfig(certs.CA.Pool(), leaderPair)
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		srv, err := grpctransport.Listen("127.0.0.1:0", &grpctransport.ServerOptions{TLS: st, Logger: quiet})
		if err != nil {
			return nil, nil, nil, err
		}
		d := &idDialer{addr: srv.Addr().String(), ca: certs.CA, log: quiet, ds: map[string]*grpctransport.Dialer{}}
		return srv, d, func() error { d.close(); return srv.Close() }, nil
	}
}

// idDialer dials the demo's leader as each hello's follower with a
// certificate naming that ID, issued by the demo's CA at its first dial:
// the leader serves a follower only under the ID its certificate names,
// and the demo's followers share one Dialer per shard.
type idDialer struct {
	addr string
	ca   *pki.CA
	log  *slog.Logger

	mu     sync.Mutex
	ds     map[string]*grpctransport.Dialer
	closed bool
}

func (d *idDialer) Dial(ctx context.Context, hello replication.Ack) (replication.FollowerConn, error) {
	dd, err := d.dialer(hello.FollowerID)
	if err != nil {
		return nil, err
	}
	return dd.Dial(ctx, hello)
}

func (d *idDialer) dialer(id string) (*grpctransport.Dialer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("demo dialer: %w", replication.ErrClosed)
	}
	if dd, ok := d.ds[id]; ok {
		return dd, nil
	}
	leaf, err := d.ca.IssueIdentity(pki.RoleFollower, id, nil, d.ca.Cert.NotBefore, d.ca.Cert.NotAfter)
	if err != nil {
		return nil, err
	}
	pair, err := leaf.Pair()
	if err != nil {
		return nil, err
	}
	ct := grpctransport.ClientTLSConfig(d.ca.Pool(), pair, "")
	dd, err := grpctransport.NewDialer(d.addr, &grpctransport.DialerOptions{TLS: ct, Logger: d.log})
	if err != nil {
		return nil, err
	}
	d.ds[id] = dd
	return dd, nil
}

func (d *idDialer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for _, dd := range d.ds {
		dd.Close()
	}
}

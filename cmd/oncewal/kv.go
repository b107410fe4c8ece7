package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"

	"github.com/oncewal/oncewal/client"
	"github.com/oncewal/oncewal/kv"
	"github.com/oncewal/oncewal/replication"
)

const kvSynopsis = `kv put|add|del|txn|get|range --addrs HOST:PORT[,...] [ARGS]
              [--tls-ca F --tls-cert F --tls-key F | --insecure --principal NAME]
              [--timeout D] [--json]

  kv put KEY VALUE     [--id ID] [--ack leader|one|majority|all]
  kv add KEY DELTA     [--id ID] [--ack ...]    a negative DELTA after --: kv add KEY -- -10
  kv del KEY           [--id ID] [--ack ...]
  kv txn [--file F]    [--id ID] [--ack ...]    the transaction read from stdin (or F)
  kv get KEY           [--min-lsn SHARD:LSN]... [-w] [--counter]
  kv range PREFIX      [--min-lsn SHARD:LSN]... [--limit N] [-w]

Reads and writes the caller's keys through a cluster's client service,
as etcdctl does etcd's: the keys belong to the principal, the name in the
client certificate (oncewal://client/NAME), not to a process or a session,
so every client of that name, anywhere, sees the same keys. --addrs may
name any nodes: the client finds the leader.

Writes. put, add (a counter: 8 bytes, little-endian int64, absent = 0)
and del are transactions of one op; txn is a conditional one. Each is one
request, run once under its request ID, --id (default a fresh random
one, printed on stderr; with --json, its "id"): sent again with the same
--id and the same arguments, it is not run again but answered from the
record of its first run ("replay"). Every key of one request must lie in one shard: give keys
that change together a common hash tag, {acct:alice} in
{acct:alice}/balance. --ack is how durable the write is when it is
answered (default majority, the client's: the leader and a majority of
the replicas). A write prints

  OK lsn=LSN shard=SHARD         (replay lsn=... on a replay)

then, for txn, "succeeded" or "failed (else)", then one line per op of
the branch that ran:

  put KEY version=V mod_lsn=M
  add KEY N version=V mod_lsn=M              N: the new counter
  del KEY deleted | del KEY not found
  get KEY VALUE version=V mod_lsn=M | get KEY not found

LSN is the write's place in its shard's log: a read with --min-lsn
SHARD:LSN sees it on any replica.

The transaction script (txn). One item a line; blank lines and lines
starting with # are skipped. First the compares (all must hold; none:
they hold), then a line "then" and its ops, then optionally a line "else"
and the ops that run when a compare fails:

  value KEY OP VALUE       the value, bytewise (false for a missing key)
  counter KEY OP N         the counter, signed (absent: 0)
  version KEY OP N         1 when created, + 1 with every put (missing: 0)
  mod_lsn KEY OP N         the LSN of the key's last write (missing: 0)
  exists KEY
  missing KEY
  then
  put KEY VALUE | add KEY DELTA | del KEY | get KEY
  else
  put KEY VALUE | add KEY DELTA | del KEY | get KEY

OP is =, !=, < or >. Keys and values are words separated by spaces: a
word as is, a Go-quoted string ("two words", "tab\there"), or hex:HEX for
any bytes. On the command line, a KEY, VALUE or PREFIX is taken as is,
but for hex:HEX. An error names every bad line (exit 2; nothing sent).
No overdraft, for instance, as one request:

  counter {acct:alice}/balance > 9
  then
  add {acct:alice}/balance -10
  else
  get {acct:alice}/balance

Reads. get prints the value (as is when it is text, else hex:HEX;
--counter: the counter in decimal), and -w a second line version=V
mod_lsn=M; a missing key prints nothing on stdout, "not found" on stderr,
and exits 0 (as etcdctl). range prints one line per key, KEY VALUE
(-w: version=V mod_lsn=M after them), in key order, at most --limit
keys ("more keys follow" on stderr when they do). Without --min-lsn a read
is linearizable, served by the leader; --min-lsn SHARD:LSN (repeatable,
one per shard) lets a replica at or past LSN in SHARD serve it. In lines
of ops and of range, a key or value is a word as in the script, and an
8-byte value that is not text is followed by counter=N.

--json prints one JSON object on stdout instead, for every answer, a
failure included:

  write: {"code":"OK"|"REPLAY", "id", "lsn", "shard", "epoch", "replayed",
          "succeeded", "results":[{"op":"put|add|del|get", "key", "found",
          "value", "counter", "version", "mod_lsn"}]}
  get:   {"code":"OK", "found", "kv":{"key", "value", "counter", "version",
          "mod_lsn"}}
  range: {"code":"OK", "kvs":[{...as get's kv}], "more"}
  failure: {"code":"CONFLICT"|"REJECTED"|"OUTCOME_UNKNOWN"|"UNAVAILABLE"|
          "REFUSED"|"DENIED"|"FAILED", "id" (writes), "error",
          "rejection":{"code","detail"} (REJECTED)}

A key or value is "key"/"value" when it is UTF-8, else "key_base64"/
"value_base64"; "counter" is present when the value is 8 bytes.

Exit status: 0 success (a missing key too); 1 the request failed: no node
took it (it did not run: retry), its outcome is unknown (it may have run:
retry with the same --id, it will not run twice), or it was refused or
the certificate denied (retrying will not help); 2 bad usage (nothing
sent); 3 conflict: the --id was used for another request (nothing ran:
use a new --id); 4 rejected by a rule of the key space (an add to a key
that holds no counter: not_counter; an overflow), a result recorded
under the --id: a retry answers the same.

Examples, against the leader of the README's recipe (gencerts ./certs
--clients load; oncewal leader ... --listen 127.0.0.1:7070):

  C="--tls-ca certs/ca.pem --tls-cert certs/client-load.pem --tls-key certs/client-load-key.pem"
` + kvExamples

// kvExamples are the examples of oncewal help kv and of the README; the
// real-process test runs them as they are written here.
const kvExamples = `  oncewal kv put --addrs localhost:7070 $C --ack leader --id name-1 '{acct:alice}/name' Alice
  oncewal kv get --addrs localhost:7070 $C '{acct:alice}/name'
  oncewal kv add --addrs localhost:7070 $C --ack leader --id deposit-1 '{acct:alice}/balance' 25
  oncewal kv add --addrs localhost:7070 $C --ack leader --id deposit-1 '{acct:alice}/balance' 25
  printf 'counter {acct:alice}/balance > 9\nthen\nadd {acct:alice}/balance -10\nelse\nget {acct:alice}/balance\n' |
    oncewal kv txn --addrs localhost:7070 $C --ack leader --id withdraw-1
  oncewal kv get --addrs localhost:7070 $C --counter '{acct:alice}/balance'
  oncewal kv range --addrs localhost:7070 $C -w '{acct:alice}/'`

// kvWrites are the verbs that write, and kvReads those that read.
var (
	kvWrites = map[string]bool{"put": true, "add": true, "del": true, "txn": true}
	kvReads  = map[string]bool{"get": true, "range": true}
)

// kvDefaultTimeout is --timeout's default, the client's RetryTimeout.
const kvDefaultTimeout = client.DefaultRetryTimeout

func runKV(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("kv", kvSynopsis, stderr)
	addrs := fs.String("addrs", "", "comma-separated host:port of the nodes to reach (any of them: the client finds the leader); required")
	tf := &tlsFlags{
		ca:       fs.String("tls-ca", "", "PEM file of the CA the nodes' certificates must chain to"),
		cert:     fs.String("tls-cert", "", "PEM file of this client's certificate (its URI SAN oncewal://client/NAME names the principal, the owner of the keys)"),
		key:      fs.String("tls-key", "", "PEM file of this client's private key"),
		insecure: fs.Bool("insecure", false, "plaintext, no authentication, the principal taken from --principal: ONLY for tests on loopback against an --insecure node"),
	}
	principal := fs.String("principal", "", "with --insecure: the client's name, the owner of the keys (with TLS the certificate names it)")
	id := fs.String("id", "", "writes: the request ID (1 to 200 bytes); the same --id with the same arguments is answered from the first run's record (default: a fresh random one, printed on stderr)")
	ack := fs.String("ack", client.DefaultAck.String(), "writes: how durable the write is when answered: leader, one, majority or all")
	file := fs.String("file", "-", "txn: the file the transaction script is read from (-: stdin)")
	var minLSN kvMinLSNs
	fs.Var(&minLSN, "min-lsn", "reads: SHARD:LSN, a replica at or past LSN in SHARD may answer (repeatable, one per shard; default: a linearizable read on the leader)")
	limit := fs.Int("limit", 0, "range: at most this many keys (0: the node's maximum, 10,000)")
	meta := fs.Bool("w", false, "get, range: also print version=V mod_lsn=M")
	counter := fs.Bool("counter", false, "get: print the value as a counter (8 bytes, little-endian int64), in decimal")
	timeout := fs.Duration("timeout", kvDefaultTimeout, "how long the client retries (no attempt starts after it; the one in flight may take up to 10s more)")
	jsonOut := fs.Bool("json", false, "print one JSON object on stdout (see above)")
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		if status == exitUsage && negativeArg(args) {
			fmt.Fprintln(stderr, "oncewal kv: a negative DELTA goes after --: oncewal kv add KEY -- -10")
		}
		return status
	}
	if len(pos) == 0 {
		return usageError(fs, stderr, "give put, add, del, txn, get or range")
	}
	verb, rest := pos[0], pos[1:]
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var c flagCheck
	var req kvRequest
	switch {
	case kvWrites[verb]:
		for _, f := range []string{"min-lsn", "w", "limit", "counter"} {
			if set[f] {
				c.failf("--%s is for reads (get, range), not %s", f, verb)
			}
		}
	case kvReads[verb]:
		for _, f := range []string{"id", "ack"} {
			if set[f] {
				c.failf("--%s is for writes (put, add, del, txn), not %s", f, verb)
			}
		}
		if set["limit"] && verb != "range" {
			c.failf("--limit is for range")
		}
		if set["counter"] && verb != "get" {
			c.failf("--counter is for get")
		}
	default:
		return usageError(fs, stderr, "unknown action %q: give put, add, del, txn, get or range", verb)
	}
	if set["file"] && verb != "txn" {
		c.failf("--file is for txn")
	}
	req.parseArgs(&c, verb, rest, *file)
	nodes := addrList(&c, *addrs)
	policy, ackOK := parseClientAck(*ack)
	if !ackOK {
		c.failf("--ack %q is not one of leader, one, majority, all", *ack)
	}
	if set["id"] && (*id == "" || len(*id) > client.MaxRequestID) {
		c.failf("--id of %d bytes: want 1 to %d", len(*id), client.MaxRequestID)
	}
	inRange(&c, "limit", *limit, 0, 1<<31-1)
	if *timeout <= 0 {
		c.failf("--timeout %v must be > 0", *timeout)
	}
	for _, p := range minLSN.bad {
		c.failf("%s", p)
	}
	if msg := tf.usage(); msg != "" {
		c.failf("%s", msg)
	}
	switch {
	case *tf.insecure && strings.TrimSpace(*principal) == "":
		c.failf("--insecure needs --principal NAME: a plaintext node takes the caller's name from it")
	case !*tf.insecure && *principal != "":
		c.failf("--principal is only for --insecure: with TLS the client certificate's oncewal://client/NAME names the caller")
	}
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}

	log := newLogger(stderr, "text", slog.LevelWarn)
	tlsCfg, code, ok := tf.open(fs, stderr, log, "oncewal kv", false, "plaintext, the principal named by --principal; use only on loopback for tests")
	if !ok {
		return code
	}
	opts := &client.Options{Addrs: nodes, TLS: tlsCfg, Insecure: tlsCfg == nil, Ack: policy, Logger: log,
		RetryTimeout: *timeout, AttemptTimeout: min(*timeout, client.DefaultAttemptTimeout)}
	if tlsCfg == nil {
		opts.Principal = strings.TrimSpace(*principal)
	}
	cl, err := client.New(opts)
	if err != nil {
		fmt.Fprintf(stderr, "oncewal kv: %v\n", err)
		return exitFailure
	}
	defer cl.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	out := kvOutput{stdout: stdout, stderr: stderr, json: *jsonOut, verb: verb}
	if kvWrites[verb] {
		out.id = *id
		if out.id == "" {
			out.id = newKVRequestID()
			if !*jsonOut {
				fmt.Fprintf(stderr, "oncewal kv: --id %s\n", out.id)
			}
		}
		res, err := cl.Txn(ctx, out.id, req.txn, client.WithAction(req.action))
		if err != nil {
			return out.failed(err)
		}
		out.written(res, req.branches[kvBranch(res.Succeeded)])
		return exitOK
	}
	var ropts []client.ReadOption
	for _, m := range minLSN.v {
		ropts = append(ropts, client.MinLSN(m.shard, m.lsn))
	}
	if verb == "range" {
		kvs, more, err := cl.Range(ctx, req.key, *limit, ropts...)
		if err != nil {
			return out.failed(err)
		}
		out.ranged(kvs, more, *meta)
		return exitOK
	}
	var (
		row   client.KeyValue
		found bool
	)
	row, found, err = cl.Get(ctx, req.key, ropts...)
	if err != nil {
		return out.failed(err)
	}
	return out.got(req.key, row, found, *meta, *counter)
}

// negativeArg says whether args hold a negative number, which the flag
// package takes for a flag.
func negativeArg(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if _, err := strconv.ParseInt(a, 10, 64); err == nil && strings.HasPrefix(a, "-") {
			return true
		}
	}
	return false
}

// newKVRequestID is a fresh request ID: 64 random bits.
func newKVRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "kv-" + hex.EncodeToString(b[:])
}

// kvMinLSN is one --min-lsn.
type kvMinLSN struct {
	shard uint32
	lsn   uint64
}

// kvMinLSNs is the repeatable --min-lsn; bad collects the values that do
// not parse, so that the flag check reports them with every other problem.
type kvMinLSNs struct {
	v   []kvMinLSN
	bad []string
}

func (m *kvMinLSNs) String() string { return "" }

func (m *kvMinLSNs) Set(s string) error {
	sh, l, ok := strings.Cut(s, ":")
	shard, err1 := strconv.ParseUint(sh, 10, 32)
	lsn, err2 := strconv.ParseUint(l, 10, 64)
	switch {
	case !ok || err1 != nil || err2 != nil:
		m.bad = append(m.bad, fmt.Sprintf("--min-lsn %q is not SHARD:LSN (two decimal numbers)", s))
	case shard >= replication.MaxShards:
		m.bad = append(m.bad, fmt.Sprintf("--min-lsn %q: shard %d is not below %d", s, shard, replication.MaxShards))
	default:
		for _, o := range m.v {
			if o.shard == uint32(shard) {
				m.bad = append(m.bad, fmt.Sprintf("--min-lsn %q: shard %d given twice", s, shard))
				return nil
			}
		}
		m.v = append(m.v, kvMinLSN{uint32(shard), lsn})
	}
	return nil
}

// kvOpDesc names one op of a request, for the lines that print its result.
type kvOpDesc struct {
	verb string
	key  []byte
}

// kvRequest is what the positional arguments (or txn's script) ask for.
type kvRequest struct {
	key []byte // get, range
	txn client.Txn
	// branches are the ops of Then and Else, for printing.
	branches [2][]kvOpDesc
	// action names the request in the ledger (and in a conflict's
	// message): the same arguments give the same action.
	action string
}

func kvBranch(succeeded bool) int {
	if succeeded {
		return 0
	}
	return 1
}

// parseArgs checks verb's positional arguments (txn: its script, from
// file) into c.
func (r *kvRequest) parseArgs(c *flagCheck, verb string, args []string, file string) {
	want := map[string]int{"put": 2, "add": 2, "del": 1, "get": 1, "range": 1, "txn": 0}[verb]
	names := map[string]string{"put": "KEY VALUE", "add": "KEY DELTA", "del": "KEY", "get": "KEY", "range": "PREFIX", "txn": "no argument (the script is read from stdin or --file)"}[verb]
	if len(args) != want {
		c.failf("%s takes %s, got %d argument(s)", verb, names, len(args))
		if verb != "txn" {
			return
		}
	}
	if verb == "txn" {
		r.action = "kv txn"
		r.parseScript(c, file)
		return
	}
	arg := func(what, s string) []byte {
		b, err := kvArg(s)
		if err != nil {
			c.failf("%s %s: %v", verb, what, err)
		}
		return b
	}
	key := arg("KEY", args[0])
	if verb == "range" {
		r.key = key
		return
	}
	if err := checkKVKey(key); err != nil {
		c.failf("%s KEY: %v", verb, err)
	}
	r.key = key
	r.action = "kv " + verb + " " + strconv.Quote(args[0])
	if len(r.action) > client.MaxAction {
		r.action = r.action[:client.MaxAction]
	}
	var op client.TxnOp
	switch verb {
	case "put":
		op = client.OpPut(key, arg("VALUE", args[1]))
	case "add":
		d, err := strconv.ParseInt(args[1], 10, 64)
		if err != nil {
			c.failf("add DELTA %q is not a signed 64-bit integer", args[1])
		}
		op = client.OpAdd(key, d)
	case "del":
		op = client.OpDelete(key)
	case "get":
		return
	}
	r.txn.Then = []client.TxnOp{op}
	r.branches[0] = []kvOpDesc{{verb, key}}
}

// checkKVKey refuses a key the node would: empty, or longer than kv.MaxKey.
func checkKVKey(k []byte) error {
	if len(k) == 0 || len(k) > kv.MaxKey {
		return fmt.Errorf("a key of %d bytes: want 1 to %d", len(k), kv.MaxKey)
	}
	return nil
}

// kvArg is a key or value given on the command line: as is, but for hex:HEX.
func kvArg(s string) ([]byte, error) {
	h, ok := strings.CutPrefix(s, "hex:")
	if !ok {
		return []byte(s), nil
	}
	b, err := hex.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("%q: not hex after hex: (%v)", s, err)
	}
	return b, nil
}

// parseScript reads txn's script from file ("-": stdin) into r, each
// problem into c with its line number.
func (r *kvRequest) parseScript(c *flagCheck, file string) {
	var in io.Reader = os.Stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			c.failf("--file: %v", err)
			return
		}
		defer f.Close()
		in = f
	}
	section := 0 // 0 compares, 1 then, 2 else
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		words, err := scriptWords(line)
		if err != nil {
			c.failf("line %d: %v", n, err)
			continue
		}
		failf := func(format string, args ...any) { c.failf("line %d: %s", n, fmt.Sprintf(format, args...)) }
		head := words[0].text
		switch head {
		case "then", "else":
			switch {
			case len(words) != 1:
				failf("%s stands alone on its line", head)
			case head == "then" && section != 0:
				failf("a second then")
			case head == "else" && section == 0:
				failf("else before then")
			case head == "else" && section == 2:
				failf("a second else")
			}
			section = map[string]int{"then": 1, "else": 2}[head]
			continue
		}
		if section == 0 {
			if cmp, ok := parseCompare(words, failf); ok {
				r.txn.If = append(r.txn.If, cmp)
			}
			continue
		}
		op, desc, ok := parseOp(words, failf)
		if !ok {
			continue
		}
		if section == 1 {
			r.txn.Then = append(r.txn.Then, op)
		} else {
			r.txn.Else = append(r.txn.Else, op)
		}
		r.branches[section-1] = append(r.branches[section-1], desc)
	}
	if err := sc.Err(); err != nil {
		c.failf("reading the script: %v", err)
		return
	}
	if section == 0 {
		c.failf("the script has no line then: give the compares (if any), a line then, and its ops")
	}
}

// scriptWord is a word of a script line: its text as written (unquoted
// words only: the keywords), and the bytes it stands for.
type scriptWord struct {
	text string
	b    []byte
}

// scriptWords splits a script line into words: as is, "Go-quoted", or
// hex:HEX.
func scriptWords(line string) ([]scriptWord, error) {
	var ws []scriptWord
	for {
		line = strings.TrimLeftFunc(line, unicode.IsSpace)
		if line == "" {
			return ws, nil
		}
		if line[0] == '"' {
			q, err := strconv.QuotedPrefix(line)
			if err != nil {
				return nil, fmt.Errorf("an unterminated or malformed quoted string: %s", line)
			}
			s, _ := strconv.Unquote(q)
			ws = append(ws, scriptWord{b: []byte(s)})
			line = line[len(q):]
			if line != "" && !unicode.IsSpace(rune(line[0])) {
				return nil, fmt.Errorf("a quoted string runs into %q", line)
			}
			continue
		}
		end := strings.IndexFunc(line, unicode.IsSpace)
		if end < 0 {
			end = len(line)
		}
		w := line[:end]
		line = line[end:]
		b, err := kvArg(w)
		if err != nil {
			return nil, err
		}
		ws = append(ws, scriptWord{text: w, b: b})
	}
}

// parseCompare parses a compare line.
func parseCompare(ws []scriptWord, failf func(string, ...any)) (client.Cmp, bool) {
	head := ws[0].text
	switch head {
	case "exists", "missing":
		if len(ws) != 2 {
			failf("%s KEY: want 2 words, got %d", head, len(ws))
			return client.Cmp{}, false
		}
		if err := checkKVKey(ws[1].b); err != nil {
			failf("%s KEY: %v", head, err)
			return client.Cmp{}, false
		}
		if head == "exists" {
			return client.Exists(ws[1].b), true
		}
		return client.Missing(ws[1].b), true
	case "value", "counter", "version", "mod_lsn":
	case "put", "add", "del", "get":
		failf("%s is an op: ops come after a line then", head)
		return client.Cmp{}, false
	default:
		failf("%q is not a compare (value, counter, version, mod_lsn, exists, missing) nor then", head)
		return client.Cmp{}, false
	}
	if len(ws) != 4 {
		failf("%s KEY OP OPERAND: want 4 words, got %d", head, len(ws))
		return client.Cmp{}, false
	}
	key, op, operand := ws[1].b, client.CmpOp(ws[2].text), ws[3]
	ok := true
	if err := checkKVKey(key); err != nil {
		failf("%s KEY: %v", head, err)
		ok = false
	}
	switch op {
	case "=", "!=", "<", ">":
	default:
		failf("%s: OP %q is not =, !=, < or >", head, ws[2].text)
		ok = false
	}
	switch head {
	case "value":
		return client.Value(key, op, operand.b), ok
	case "counter":
		n, err := strconv.ParseInt(operand.text, 10, 64)
		if err != nil {
			failf("counter: %q is not a signed 64-bit integer", operand.text)
			return client.Cmp{}, false
		}
		return client.Counter(key, op, n), ok
	}
	n, err := strconv.ParseUint(operand.text, 10, 64)
	if err != nil {
		failf("%s: %q is not an unsigned 64-bit integer", head, operand.text)
		return client.Cmp{}, false
	}
	if head == "version" {
		return client.Version(key, op, n), ok
	}
	return client.ModLSN(key, op, n), ok
}

// parseOp parses an op line.
func parseOp(ws []scriptWord, failf func(string, ...any)) (client.TxnOp, kvOpDesc, bool) {
	head := ws[0].text
	want := map[string]int{"put": 3, "add": 3, "del": 2, "get": 2}[head]
	if want == 0 {
		failf("%q is not an op (put, add, del, get) nor else", head)
		return client.TxnOp{}, kvOpDesc{}, false
	}
	if len(ws) != want {
		failf("%s: want %d words, got %d", head, want, len(ws))
		return client.TxnOp{}, kvOpDesc{}, false
	}
	key := ws[1].b
	if err := checkKVKey(key); err != nil {
		failf("%s KEY: %v", head, err)
		return client.TxnOp{}, kvOpDesc{}, false
	}
	desc := kvOpDesc{head, key}
	switch head {
	case "put":
		return client.OpPut(key, ws[2].b), desc, true
	case "add":
		d, err := strconv.ParseInt(ws[2].text, 10, 64)
		if err != nil {
			failf("add: DELTA %q is not a signed 64-bit integer", ws[2].text)
			return client.TxnOp{}, kvOpDesc{}, false
		}
		return client.OpAdd(key, d), desc, true
	case "del":
		return client.OpDelete(key), desc, true
	}
	return client.OpGet(key), desc, true
}

// kvOutput prints a kv command's answer, as text or JSON.
type kvOutput struct {
	stdout, stderr io.Writer
	json           bool
	verb, id       string
}

// kvJSON is --json's object.
type kvJSON struct {
	Code      string        `json:"code"`
	ID        string        `json:"id,omitempty"`
	LSN       *uint64       `json:"lsn,omitempty"`
	Shard     *uint32       `json:"shard,omitempty"`
	Epoch     *uint64       `json:"epoch,omitempty"`
	Replayed  *bool         `json:"replayed,omitempty"`
	Succeeded *bool         `json:"succeeded,omitempty"`
	Results   []kvJSONOp    `json:"results,omitempty"`
	Found     *bool         `json:"found,omitempty"`
	KV        *kvJSONRow    `json:"kv,omitempty"`
	KVs       *[]kvJSONRow  `json:"kvs,omitempty"`
	More      *bool         `json:"more,omitempty"`
	Error     string        `json:"error,omitempty"`
	Rejection *kvJSONReject `json:"rejection,omitempty"`
}

type kvJSONReject struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

type kvJSONRow struct {
	Key         string  `json:"key,omitempty"`
	KeyBase64   string  `json:"key_base64,omitempty"`
	Value       *string `json:"value,omitempty"`
	ValueBase64 string  `json:"value_base64,omitempty"`
	Counter     *int64  `json:"counter,omitempty"`
	Version     uint64  `json:"version"`
	ModLSN      uint64  `json:"mod_lsn"`
}

type kvJSONOp struct {
	Op    string `json:"op"`
	Found bool   `json:"found"`
	kvJSONRow
}

func jsonRow(key, value []byte, version, modLSN uint64) kvJSONRow {
	r := kvJSONRow{Version: version, ModLSN: modLSN}
	if utf8.Valid(key) {
		r.Key = string(key)
	} else {
		r.KeyBase64 = base64.StdEncoding.EncodeToString(key)
	}
	if utf8.Valid(value) {
		v := string(value)
		r.Value = &v
	} else {
		r.ValueBase64 = base64.StdEncoding.EncodeToString(value)
	}
	if len(value) == 8 {
		n := int64(binary.LittleEndian.Uint64(value))
		r.Counter = &n
	}
	return r
}

func (o *kvOutput) printJSON(v kvJSON) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(o.stdout, "%s\n", b)
}

// written prints a write's answer; descs are the ops of the branch that ran.
func (o *kvOutput) written(res client.TxnResult, descs []kvOpDesc) {
	if o.json {
		code := "OK"
		if res.Replayed {
			code = "REPLAY"
		}
		v := kvJSON{Code: code, ID: o.id, LSN: &res.LSN, Shard: &res.Shard, Epoch: &res.Epoch, Replayed: &res.Replayed,
			Succeeded: &res.Succeeded, Results: []kvJSONOp{}}
		for i, r := range res.Ops {
			d := opDesc(descs, i)
			v.Results = append(v.Results, kvJSONOp{Op: d.verb, Found: r.Found, kvJSONRow: jsonRow(d.key, r.Value, r.Version, r.ModLSN)})
		}
		o.printJSON(v)
		return
	}
	status := "OK"
	if res.Replayed {
		status = "replay"
	}
	fmt.Fprintf(o.stdout, "%s lsn=%d shard=%d\n", status, res.LSN, res.Shard)
	if o.verb == "txn" {
		if res.Succeeded {
			fmt.Fprintln(o.stdout, "succeeded")
		} else {
			fmt.Fprintln(o.stdout, "failed (else)")
		}
	}
	for i, r := range res.Ops {
		d := opDesc(descs, i)
		k := kvWord(d.key)
		switch d.verb {
		case "put":
			fmt.Fprintf(o.stdout, "put %s version=%d mod_lsn=%d\n", k, r.Version, r.ModLSN)
		case "add":
			n := "?"
			if len(r.Value) == 8 {
				n = strconv.FormatInt(int64(binary.LittleEndian.Uint64(r.Value)), 10)
			}
			fmt.Fprintf(o.stdout, "add %s %s version=%d mod_lsn=%d\n", k, n, r.Version, r.ModLSN)
		case "del":
			if r.Found {
				fmt.Fprintf(o.stdout, "del %s deleted\n", k)
			} else {
				fmt.Fprintf(o.stdout, "del %s not found\n", k)
			}
		default:
			if r.Found {
				fmt.Fprintf(o.stdout, "get %s %s version=%d mod_lsn=%d\n", k, kvValueWords(r.Value), r.Version, r.ModLSN)
			} else {
				fmt.Fprintf(o.stdout, "get %s not found\n", k)
			}
		}
	}
}

// opDesc is descs[i], or an unnamed op if the node answered more results
// than the request had ops.
func opDesc(descs []kvOpDesc, i int) kvOpDesc {
	if i < len(descs) {
		return descs[i]
	}
	return kvOpDesc{verb: "?", key: nil}
}

// got prints get's answer.
func (o *kvOutput) got(key []byte, row client.KeyValue, found, meta, counter bool) int {
	if counter && found && len(row.Value) != 8 {
		msg := fmt.Sprintf("%s holds %d bytes, not a counter (8 bytes, little-endian int64)", kvWord(key), len(row.Value))
		if o.json {
			o.printJSON(kvJSON{Code: "FAILED", Error: msg})
		}
		fmt.Fprintf(o.stderr, "oncewal kv get: %s\n", msg)
		return exitFailure
	}
	if o.json {
		v := kvJSON{Code: "OK", Found: &found}
		if found {
			r := jsonRow(row.Key, row.Value, row.Version, row.ModLSN)
			v.KV = &r
		}
		o.printJSON(v)
		return exitOK
	}
	if !found {
		fmt.Fprintf(o.stderr, "oncewal kv get: %s: not found\n", kvWord(key))
		return exitOK
	}
	if counter {
		fmt.Fprintln(o.stdout, int64(binary.LittleEndian.Uint64(row.Value)))
	} else {
		fmt.Fprintln(o.stdout, kvText(row.Value))
	}
	if meta {
		fmt.Fprintf(o.stdout, "version=%d mod_lsn=%d\n", row.Version, row.ModLSN)
	}
	return exitOK
}

// ranged prints range's answer.
func (o *kvOutput) ranged(kvs []client.KeyValue, more, meta bool) {
	if o.json {
		rows := []kvJSONRow{}
		for _, r := range kvs {
			rows = append(rows, jsonRow(r.Key, r.Value, r.Version, r.ModLSN))
		}
		o.printJSON(kvJSON{Code: "OK", KVs: &rows, More: &more})
		return
	}
	for _, r := range kvs {
		if meta {
			fmt.Fprintf(o.stdout, "%s %s version=%d mod_lsn=%d\n", kvWord(r.Key), kvValueWords(r.Value), r.Version, r.ModLSN)
		} else {
			fmt.Fprintf(o.stdout, "%s %s\n", kvWord(r.Key), kvValueWords(r.Value))
		}
	}
	if more {
		fmt.Fprintf(o.stderr, "oncewal kv range: more keys follow (at most %d were asked for): raise --limit, or range a longer prefix\n", len(kvs))
	}
}

// failed reports a request's error and returns its exit status.
func (o *kvOutput) failed(err error) int {
	var (
		rej  *client.RejectedError
		conf *client.ConflictError
		code string
		msg  string
		exit = exitFailure
		js   = kvJSON{ID: o.id, Error: err.Error()}
	)
	switch {
	case errors.As(err, &rej):
		code, exit = "REJECTED", exitRejected
		js.Rejection = &kvJSONReject{Code: rej.Code, Detail: rej.Detail}
		msg = fmt.Sprintf("rejected: %s: %s (recorded under --id %s: a retry with it answers the same, and nothing runs)", rej.Code, rej.Detail, o.id)
	case errors.As(err, &conf):
		code, exit = "CONFLICT", exitConflict
		msg = fmt.Sprintf("conflict: --id %s was used for another request, which it names (%s); nothing ran: give this request a new --id", o.id, conf.Message)
	case errors.Is(err, client.ErrOutcomeUnknown):
		code = "OUTCOME_UNKNOWN"
		msg = fmt.Sprintf("the outcome is unknown: the request may have run; retry with the same --id %s to learn it (it will not run twice): %v", o.id, err)
	case errors.Is(err, client.ErrUnavailable):
		code = "UNAVAILABLE"
		msg = fmt.Sprintf("no node took the request; it did not run: %v", err)
		if o.id == "" {
			msg = fmt.Sprintf("no node answered the read: %v", err)
		}
	case errors.Is(err, client.ErrDenied):
		code = "DENIED"
		msg = err.Error()
	case errors.Is(err, client.ErrRefused):
		code = "REFUSED"
		msg = err.Error()
	default:
		code = "FAILED"
		msg = err.Error()
		if o.id != "" {
			msg += fmt.Sprintf(" (if it may have run, retry with the same --id %s)", o.id)
		}
	}
	if o.json {
		js.Code = code
		o.printJSON(js)
	}
	fmt.Fprintf(o.stderr, "oncewal kv %s: %s\n", o.verb, msg)
	return exit
}

// kvWord renders key or value bytes as one word of the script syntax: as
// is when it is a plain word, else Go-quoted when it is UTF-8, else
// hex:HEX.
func kvWord(b []byte) string {
	s := string(b)
	plain := s != "" && utf8.ValidString(s) && !strings.HasPrefix(s, "hex:") && s[0] != '"' && s[0] != '#' &&
		strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) < 0
	switch {
	case plain:
		return s
	case isText(b):
		return strconv.Quote(s)
	}
	return "hex:" + hex.EncodeToString(b)
}

// kvValueWords is a value's word, and counter=N after an 8-byte value that
// is not text.
func kvValueWords(b []byte) string {
	if len(b) == 8 && !isText(b) {
		return fmt.Sprintf("%s counter=%d", kvWord(b), int64(binary.LittleEndian.Uint64(b)))
	}
	return kvWord(b)
}

// isText: valid UTF-8 without control characters.
func isText(b []byte) bool {
	return utf8.Valid(b) && bytes.IndexFunc(b, unicode.IsControl) < 0
}

// kvText is get's rendering of a value: as is when it is text (and does
// not start with hex:), else hex:HEX.
func kvText(b []byte) string {
	if isText(b) && !bytes.HasPrefix(b, []byte("hex:")) {
		return string(b)
	}
	return "hex:" + hex.EncodeToString(b)
}

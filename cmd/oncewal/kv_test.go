package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/oncewal/oncewal/internal/pki"
)

// TestKVUsage: oncewal kv refuses a bad command line before it dials
// anything (exit 2), naming every problem at once.
func TestKVUsage(t *testing.T) {
	base := []string{"--addrs", "127.0.0.1:1", "--insecure", "--principal", "p"}
	with := func(args ...string) []string { return append(append([]string{"kv"}, args...), base...) }
	for _, tc := range []struct {
		args []string
		want []string // in stderr
	}{
		{[]string{"kv"}, []string{"give put, add, del, txn, get or range"}},
		{with("frob", "k"), []string{`unknown action "frob"`}},
		{[]string{"kv", "get", "k"}, []string{"--addrs is required", "mutual TLS needs --tls-ca"}},
		{[]string{"kv", "get", "k", "--addrs", "nohostport", "--insecure"}, []string{`--addrs "nohostport" is not host:port`, "--insecure needs --principal"}},
		{[]string{"kv", "get", "k", "--addrs", "127.0.0.1:1", "--principal", "p", "--tls-ca", "a", "--tls-cert", "b", "--tls-key", "c"},
			[]string{"--principal is only for --insecure"}},
		{with("put", "k", "v", "--ack", "most"), []string{`--ack "most" is not one of leader, one, majority, all`}},
		{with("get", "k", "--min-lsn", "1", "--min-lsn", "x:2", "--min-lsn", "70000:1", "--min-lsn", "2:3", "--min-lsn", "2:4"),
			[]string{`--min-lsn "1" is not SHARD:LSN`, `--min-lsn "x:2" is not SHARD:LSN`, "shard 70000 is not below 65536", `--min-lsn "2:4": shard 2 given twice`}},
		{with("put", "k", "v", "--min-lsn", "1:2", "-w", "--limit", "3"),
			[]string{"--min-lsn is for reads (get, range), not put", "--w is for reads", "--limit is for reads"}},
		{with("get", "k", "--id", "x", "--ack", "all", "--limit", "3", "--file", "f"),
			[]string{"--id is for writes (put, add, del, txn), not get", "--ack is for writes", "--limit is for range", "--file is for txn"}},
		{with("range", "p", "--counter", "--limit", "-1"), []string{"--counter is for get", "--limit -1 is out of range"}},
		{with("put", "k"), []string{"put takes KEY VALUE, got 1 argument(s)"}},
		{with("del", "k", "extra"), []string{"del takes KEY, got 2 argument(s)"}},
		{with("put", "", "v"), []string{"put KEY: a key of 0 bytes: want 1 to 4096"}},
		{with("put", "hex:zz", "v"), []string{`"hex:zz": not hex after hex:`}},
		{with("add", "k", "ten", "--timeout", "0s"), []string{`add DELTA "ten" is not a signed 64-bit integer`, "--timeout 0s must be > 0"}},
		{with("put", "k", "v", "--id", strings.Repeat("x", 201)), []string{"--id of 201 bytes: want 1 to 200"}},
		{with("add", "k", "-10"), []string{"flag provided but not defined: -10", "a negative DELTA goes after --"}},
		{with("txn", "extra", "--file", filepath.Join(t.TempDir(), "none")), []string{"txn takes no argument", "--file: open"}},
	} {
		out, errOut, code := runCmd(t, tc.args...)
		if code != exitUsage || out != "" {
			t.Errorf("%q: exit %d (want %d), stdout %q, stderr:\n%s", tc.args, code, exitUsage, out, errOut)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%q: stderr lacks %q:\n%s", tc.args, w, errOut)
			}
		}
	}
}

// TestKVScriptSyntax: a txn script's errors are usage errors, each named
// with its line, all at once; a good script parses into the compares and
// both branches.
func TestKVScriptSyntax(t *testing.T) {
	dir := t.TempDir()
	script := func(s string) string {
		p := filepath.Join(dir, fmt.Sprintf("s%d", len(s)))
		must(t, os.WriteFile(p, []byte(s), 0o644))
		return p
	}
	bad := script(`# a comment, then a blank line

counter {a}/b >= 9
value {a}/b = "unterminated
version {a}/b = -1
put {a}/b 1
exists
frob {a}/b
else
then
add {a}/b ten
del
get {a}/b extra
then
else
else
`)
	out, errOut, code := runCmd(t, "kv", "txn", "--file", bad, "--addrs", "127.0.0.1:1", "--insecure", "--principal", "p")
	if code != exitUsage || out != "" {
		t.Fatalf("bad script: exit %d, stdout %q, stderr:\n%s", code, out, errOut)
	}
	for _, w := range []string{
		`line 3: counter: OP ">=" is not =, !=, < or >`,
		"line 4: an unterminated or malformed quoted string",
		`line 5: version: "-1" is not an unsigned 64-bit integer`,
		"line 6: put is an op: ops come after a line then",
		"line 7: exists KEY: want 2 words, got 1",
		`line 8: "frob" is not a compare`,
		"line 9: else before then",
		`line 11: add: DELTA "ten" is not a signed 64-bit integer`,
		"line 12: del: want 2 words, got 1",
		"line 13: get: want 2 words, got 3",
		"line 14: a second then",
		"line 16: a second else",
	} {
		if !strings.Contains(errOut, w) {
			t.Errorf("stderr lacks %q:\n%s", w, errOut)
		}
	}
	if _, errOut, code := runCmd(t, "kv", "txn", "--file", script("exists k\n"), "--addrs", "127.0.0.1:1", "--insecure", "--principal", "p"); code != exitUsage ||
		!strings.Contains(errOut, "the script has no line then") {
		t.Errorf("a script without then: exit %d:\n%s", code, errOut)
	}

	var c flagCheck
	var r kvRequest
	r.parseScript(&c, script("value \"{a} x\" = \"two words\"\ncounter {a}/n > -3\nmissing hex:7b617d\nthen\nput {a}/k hex:00ff\nadd {a}/n -1\nelse\nget {a}/k\ndel {a}/n\n"))
	if len(c.problems) != 0 || len(r.txn.If) != 3 || len(r.txn.Then) != 2 || len(r.txn.Else) != 2 {
		t.Fatalf("good script: problems %q, txn %+v", c.problems, r.txn)
	}
	if got := fmt.Sprint(r.branches); got != "[[{put [123 97 125 47 107]} {add [123 97 125 47 110]}] [{get [123 97 125 47 107]} {del [123 97 125 47 110]}]]" {
		t.Errorf("branches %s", got)
	}
}

// TestKVWords: the words oncewal kv prints read back as the script's.
func TestKVWords(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		want string
	}{
		{[]byte("plain"), "plain"},
		{[]byte("two words"), `"two words"`},
		{[]byte(""), `""`},
		{[]byte("hex:41"), `"hex:41"`},
		{[]byte("#x"), `"#x"`},
		{[]byte{0, 0xff}, "hex:00ff"},
	} {
		got := kvWord(tc.b)
		if got != tc.want {
			t.Errorf("kvWord(%q) = %s, want %s", tc.b, got, tc.want)
		}
		ws, err := scriptWords(got)
		if err != nil || len(ws) != 1 || string(ws[0].b) != string(tc.b) {
			t.Errorf("scriptWords(%s) = %v, %v: want %q back", got, ws, err, tc.b)
		}
	}
	if got := kvText([]byte("hex:41")); got != "hex:6865783a3431" {
		t.Errorf("kvText of a value starting hex: = %s", got)
	}
	if got := kvValueWords([]byte{5, 0, 0, 0, 0, 0, 0, 0}); got != "hex:0500000000000000 counter=5" {
		t.Errorf("a counter's words: %s", got)
	}
}

// TestKVHelpExamples: the examples of oncewal help kv are in the README as
// written (./oncewal for oncewal), and the help documents every exit
// status.
func TestKVHelpExamples(t *testing.T) {
	out, _, code := runCmd(t, "help", "kv")
	if code != exitOK || !strings.Contains(out, kvExamples) {
		t.Fatalf("help kv: exit %d, lacks the examples:\n%s", code, out)
	}
	for _, w := range []string{"Exit status: 0", "1 the request failed", "2 bad usage", "3 conflict", "4 rejected", `"value_base64"`, "hex:HEX", "--min-lsn SHARD:LSN"} {
		if !strings.Contains(out, w) {
			t.Errorf("help kv lacks %q", w)
		}
	}
	readme := readFile(t, filepath.Join("..", "..", "README.md"))
	for _, line := range strings.Split(kvExamples, "\n") {
		if !strings.Contains(readme, strings.Replace(strings.TrimSpace(line), "oncewal kv", "./oncewal kv", 1)) {
			t.Errorf("the README lacks the example %q", line)
		}
	}
	if !strings.Contains(readme, "| `oncewal kv ") {
		t.Errorf("the README's command table has no kv row")
	}
}

// TestRealProcessesKV runs the built binary's kv against a real leader of
// 4 shards under mutual TLS (gencerts --clients load; no follower runs, so
// writes ask --ack leader): help kv's examples as written, then a replay,
// a conflict (exit 3), both branches of the no-overdraft transaction, a
// rejection (exit 4, not_counter), a range, --json decoded, and reads with
// --min-lsn, one the leader has passed and one it has not (exit 1).
func TestRealProcessesKV(t *testing.T) {
	rp := newRealProcs(t, "f1")
	ld := rp.startLeader(t, 4, "load")

	certFile, keyFile := pki.ClientFiles("load")
	if certFile != "client-load.pem" || keyFile != "client-load-key.pem" {
		t.Fatalf("gencerts' client files are %s, %s: fix the examples", certFile, keyFile)
	}
	addr := fmt.Sprintf("localhost:%d", rp.port)
	// sh runs a command line as help kv writes it: in rp.dir (certs/...),
	// $C set, the binary first on PATH, the README's port replaced.
	sh := func(line string) (string, string, int) {
		t.Helper()
		c := exec.Command("/bin/sh", "-c", strings.ReplaceAll(line, "localhost:7070", addr))
		c.Dir = rp.dir
		c.Env = append(os.Environ(), "PATH="+filepath.Dir(rp.bin)+":"+os.Getenv("PATH"),
			"C=--tls-ca certs/ca.pem --tls-cert certs/client-load.pem --tls-key certs/client-load-key.pem")
		var o, e strings.Builder
		c.Stdout, c.Stderr = &o, &e
		err := c.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		return o.String(), e.String(), code
	}
	expect := func(line string, wantCode int, wantOut string, wantErr ...string) []string {
		t.Helper()
		out, errOut, code := sh(line)
		m := regexp.MustCompile(`^` + wantOut + `$`).FindStringSubmatch(out)
		if code != wantCode || m == nil {
			t.Fatalf("%s\nexit %d (want %d), stdout:\n%s\nwant /%s/; stderr:\n%s", line, code, wantCode, out, wantOut, errOut)
		}
		for _, w := range wantErr {
			if !strings.Contains(errOut, w) {
				t.Fatalf("%s\nstderr lacks %q:\n%s", line, w, errOut)
			}
		}
		return m
	}

	// The examples of help kv and the README, as written, in order.
	examples := strings.Split(strings.ReplaceAll(kvExamples, "|\n    ", "| "), "\n")
	wants := []string{
		`OK lsn=(\d+) shard=(\d+)\nput \{acct:alice\}/name version=1 mod_lsn=\d+\n`,
		"Alice\n",
		`OK lsn=\d+ shard=\d+\nadd \{acct:alice\}/balance 25 version=1 mod_lsn=\d+\n`,
		`replay lsn=\d+ shard=\d+\nadd \{acct:alice\}/balance 25 version=1 mod_lsn=\d+\n`,
		`OK lsn=\d+ shard=\d+\nsucceeded\nadd \{acct:alice\}/balance 15 version=2 mod_lsn=\d+\n`,
		"15\n",
		`\{acct:alice\}/balance hex:0f00000000000000 counter=15 version=2 mod_lsn=\d+\n\{acct:alice\}/name Alice version=1 mod_lsn=\d+\n`,
	}
	if len(examples) != len(wants) {
		t.Fatalf("%d examples, %d expectations", len(examples), len(wants))
	}
	var put []string
	for i, want := range wants {
		m := expect(strings.TrimSpace(examples[i]), exitOK, want)
		if i == 0 {
			put = m
		}
	}
	K := "oncewal kv --addrs localhost:7070 $C "
	kv := func(verb string) string { return strings.Replace(K, "kv ", "kv "+verb+" ", 1) }

	// The same --id for another request: a conflict, named; nothing ran.
	expect(kv("put")+"--ack leader --id name-1 '{acct:alice}/name' Bob", exitConflict, "",
		"conflict: --id name-1 was used for another request", "kv put")
	expect(kv("get")+"'{acct:alice}/name'", exitOK, "Alice\n")

	// No overdraft, both branches: 15 → 5, then 5 is not > 9.
	withdraw := `printf 'counter {acct:alice}/balance > 9\nthen\nadd {acct:alice}/balance -10\nelse\nget {acct:alice}/balance\n' | ` + kv("txn") + "--ack leader --id "
	expect(withdraw+"withdraw-2", exitOK, `OK lsn=\d+ shard=\d+\nsucceeded\nadd \{acct:alice\}/balance 5 version=3 mod_lsn=\d+\n`)
	expect(withdraw+"withdraw-3", exitOK, `OK lsn=\d+ shard=\d+\nfailed \(else\)\nget \{acct:alice\}/balance hex:0500000000000000 counter=5 version=3 mod_lsn=\d+\n`)
	expect(withdraw+"withdraw-2", exitOK, `replay lsn=\d+ shard=\d+\nsucceeded\nadd \{acct:alice\}/balance 5 version=3 mod_lsn=\d+\n`)

	// An add to a key that holds no counter: rejected, recorded.
	for range 2 {
		expect(kv("add")+"--ack leader --id bad-add '{acct:alice}/name' 1", exitRejected, "", "rejected: not_counter", "--id bad-add")
	}
	// A generated --id is printed; a negative delta after --.
	expect(kv("add")+"--ack leader '{acct:bob}/n' -- -3", exitOK, `OK lsn=\d+ shard=\d+\nadd \{acct:bob\}/n -3 version=1 mod_lsn=\d+\n`, "oncewal kv: --id kv-")
	expect(kv("del")+"--ack leader --id del-1 '{acct:bob}/n'", exitOK, `OK lsn=\d+ shard=\d+\ndel \{acct:bob\}/n deleted\n`)
	expect(kv("del")+"--ack leader --id del-2 '{acct:bob}/n'", exitOK, `OK lsn=\d+ shard=\d+\ndel \{acct:bob\}/n not found\n`)
	expect(kv("get")+"'{acct:bob}/n'", exitOK, "", "not found")

	// Ranges: a hash-tagged prefix reads its shard; --limit.
	expect(kv("put")+`--ack leader --id sp "{acct:alice}/a b" "x y"`, exitOK, `OK lsn=\d+ shard=\d+\nput "\{acct:alice\}/a b" version=1 mod_lsn=\d+\n`)
	expect(kv("range")+"'{acct:alice}/'", exitOK, `"\{acct:alice\}/a b" "x y"\n\{acct:alice\}/balance hex:0500000000000000 counter=5\n\{acct:alice\}/name Alice\n`)
	expect(kv("range")+"--limit 1 '{acct:alice}/'", exitOK, `"\{acct:alice\}/a b" "x y"\n`, "more keys follow")

	// --json, decoded.
	var w kvTestJSON
	decode := func(out string) {
		t.Helper()
		w = kvTestJSON{}
		if err := json.Unmarshal([]byte(out), &w); err != nil || strings.Count(out, "\n") != 1 {
			t.Fatalf("--json: %v:\n%s", err, out)
		}
	}
	out, _, code := sh(kv("add") + "--ack leader --id j1 --json '{acct:carol}/n' 7")
	decode(out)
	if code != exitOK || w.Code != "OK" || w.ID != "j1" || w.LSN == 0 || w.Epoch != 1 || w.Replayed || !w.Succeeded ||
		len(w.Results) != 1 || w.Results[0].Op != "add" || w.Results[0].Key != "{acct:carol}/n" || w.Results[0].Counter == nil || *w.Results[0].Counter != 7 {
		t.Fatalf("add --json: exit %d, %+v", code, w)
	}
	carolLSN, carolShard := w.LSN, w.Shard
	out, _, code = sh(kv("add") + "--ack leader --id j1 --json '{acct:carol}/n' 7")
	decode(out)
	if code != exitOK || w.Code != "REPLAY" || !w.Replayed {
		t.Fatalf("add --json again: exit %d, %+v", code, w)
	}
	out, _, code = sh(kv("put") + "--ack leader --id j1 --json '{acct:carol}/n' 7")
	decode(out)
	if code != exitConflict || w.Code != "CONFLICT" || w.ID != "j1" || w.Error == "" {
		t.Fatalf("put --json with add's --id: exit %d, %+v", code, w)
	}
	out, _, code = sh(kv("add") + "--ack leader --id bad-add --json '{acct:alice}/name' 1")
	decode(out)
	if code != exitRejected || w.Code != "REJECTED" || w.Rejection == nil || w.Rejection.Code != "not_counter" {
		t.Fatalf("a rejection --json: exit %d, %+v", code, w)
	}
	out, _, code = sh(kv("put") + "--ack leader --id j2 --json '{acct:carol}/bin' hex:00ff")
	decode(out)
	if code != exitOK || w.Code != "OK" {
		t.Fatalf("put hex: --json: exit %d, %+v", code, w)
	}
	out, _, code = sh(kv("get") + "--json '{acct:carol}/bin'")
	decode(out)
	if code != exitOK || w.Found == nil || !*w.Found || w.KV == nil || w.KV.ValueBase64 != "AP8=" {
		t.Fatalf("get --json of bytes: exit %d, %s", code, out)
	}
	out, _, code = sh(kv("get") + "--json '{acct:carol}/none'")
	decode(out)
	if code != exitOK || w.Found == nil || *w.Found || w.KV != nil {
		t.Fatalf("get --json of a missing key: exit %d, %s", code, out)
	}
	out, _, code = sh(kv("range") + "--json '{acct:alice}/'")
	decode(out)
	if code != exitOK || w.More == nil || *w.More || len(w.KVs) != 3 || w.KVs[2].Key != "{acct:alice}/name" || w.KVs[2].Value != "Alice" {
		t.Fatalf("range --json: exit %d, %s", code, out)
	}

	// --min-lsn: at a write's LSN the read is served; far past the leader's
	// applied LSN it is answered BEHIND until --timeout (exit 1).
	expect(kv("get")+fmt.Sprintf("--min-lsn %d:%d --counter '{acct:carol}/n'", carolShard, carolLSN), exitOK, "7\n")
	expect(kv("get")+fmt.Sprintf("--min-lsn %s:%s '{acct:alice}/name'", put[2], put[1]), exitOK, "Alice\n")
	expect(kv("get")+fmt.Sprintf("--min-lsn %d:%d --timeout 2s '{acct:carol}/n'", carolShard, carolLSN+1_000_000), exitFailure, "",
		"no node answered the read", "behind the read's minimum LSN")
	if s, _ := strconv.Atoi(put[2]); s < 0 || s > 3 {
		t.Fatalf("shard %d of 4", s)
	}
	must(t, ld.stop(t))
}

// kvTestJSON is what the test reads of oncewal kv --json.
type kvTestJSON struct {
	Code      string `json:"code"`
	ID        string `json:"id"`
	LSN       uint64 `json:"lsn"`
	Shard     uint32 `json:"shard"`
	Epoch     uint64 `json:"epoch"`
	Replayed  bool   `json:"replayed"`
	Succeeded bool   `json:"succeeded"`
	Results   []struct {
		Op      string `json:"op"`
		Key     string `json:"key"`
		Value   string `json:"value"`
		Counter *int64 `json:"counter"`
		Version uint64 `json:"version"`
	} `json:"results"`
	Found *bool `json:"found"`
	KV    *struct {
		Key         string `json:"key"`
		Value       string `json:"value"`
		ValueBase64 string `json:"value_base64"`
	} `json:"kv"`
	KVs []struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"kvs"`
	More      *bool  `json:"more"`
	Error     string `json:"error"`
	Rejection *struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	} `json:"rejection"`
}

// Command oncewal is oncewal's command-line tool: a self-verifying demo of
// exactly-once replication, a WAL dumper in the spirit of pg_waldump, a
// read-only inspector for follower stores, and the benchmark suite.
//
// Every subcommand is a func runX(args []string, stdout, stderr io.Writer) int
// returning the exit status, so tests run them in-process. Exit status: 0
// success, 1 the command ran and found a problem (corrupt WAL, not a store,
// verification failed, I/O error), 2 bad usage; kv adds 3 and 4 for a
// write's final answers a script branches on.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	// exitConflict (kv): the request ID was used for another request;
	// nothing ran.
	exitConflict = 3
	// exitRejected (kv): a rule of the key space rejected the request, a
	// result recorded under its ID.
	exitRejected = 4
)

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands is in the order usage lists them.
var commands = []command{
	{"demo", "run leader → faulty transport → follower in one process and verify it against an oracle", runDemo},
	{"waldump", "print the batches and events of a WAL segment file or directory", runWaldump},
	{"inspect", "print a follower store's position, window and sessions (opens it read-only)", runInspect},
	{"bench", "run the benchmark suite and print each figure beside its reference", runBench},
	{"leader", "run the leader of every shard: WAL, stamping, retention; serve registered followers over gRPC with mutual TLS", runLeader},
	{"follower", "replicate a shard (or every shard, into a node directory) from a leader over gRPC with mutual TLS", runFollower},
	{"kv", "read and write the caller's keys through the client service: put, get, del, add, range, txn (each write once under its request ID), as etcdctl", runKV},
	{"load", "drive a cluster over the network with concurrent clients through its client service (retries, acks, an ack log)", runLoad},
	{"node", "run one member of a cluster with automatic failover on etcd: follow, campaign, fence, promote, publish", runNode},
	{"members", "add, remove or list a cluster's members in etcd (the replica set oncewal node runs)", runMembers},
	{"promote", "turn the most advanced stopped follower into the leader at a higher epoch", runPromote},
	{"gencerts", "write a CA and a certificate per identity (the leader, each follower, each client, each member of a node cluster) for trying mutual TLS locally, or add identities signed by the CA already in DIR", runGencerts},
	{"version", "print the module version and VCS revision this binary was built from", runVersion},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		return runHelp(rest, stdout, stderr)
	case "-version", "--version":
		return runVersion(rest, stdout, stderr)
	}
	if c := lookup(name); c != nil {
		return c.run(rest, stdout, stderr)
	}
	fmt.Fprintf(stderr, "oncewal: unknown command %q\n%s\n", name, helpHint(""))
	return exitUsage
}

func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// runHelp prints the overview, or a subcommand's own help (its -h output).
func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return exitOK
	}
	c := lookup(args[0])
	if c == nil {
		fmt.Fprintf(stderr, "oncewal help: unknown command %q\n%s\n", args[0], helpHint(""))
		return exitUsage
	}
	// Asked-for help goes to stdout, so `oncewal help waldump | less` works.
	c.run([]string{"-h"}, stdout, stdout)
	return exitOK
}

func usage(w io.Writer) {
	fmt.Fprint(w, `oncewal — exactly-once session replication over a write-ahead log

Usage:
  oncewal <command> [arguments]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s  %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `  help      show this text, or "oncewal help <command>" for a command's flags

Examples:
  oncewal demo
  oncewal waldump DIR/leader --json --from 100
  oncewal inspect DIR/follower
`)
}

// newFlagSet returns a FlagSet that reports errors instead of exiting and
// prints its help, headed by synopsis, to its output: stderr, except while
// parseArgs answers -h (then stdout).
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: oncewal %s\n", synopsis)
		var any bool
		fs.VisitAll(func(*flag.Flag) { any = true })
		if any {
			fmt.Fprintln(fs.Output(), "\nflags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseArgs parses flags that may come before, between or after positional
// arguments ("waldump PATH --json" as well as "waldump --json PATH"); the
// standard flag package stops at the first positional argument, so parsing
// resumes after each one. A "--" ends flag parsing: everything after it is
// positional. It returns the positional arguments in order.
//
// The returned exit status is meaningful only when ok is false: exitOK for
// -h/--help (usage was printed to stdout: asked-for help is output, so
// `oncewal demo -h | less` works), exitUsage for a bad flag (the error and
// helpHint went to the FlagSet's output, stderr; see usageError).
func parseArgs(fs *flag.FlagSet, args []string, stdout io.Writer) (pos []string, status int, ok bool) {
	// The flag package prints usage before it returns, not knowing yet
	// whether it was asked for; hold the text until the outcome says where
	// it goes.
	stderr := fs.Output()
	var held bytes.Buffer
	fs.SetOutput(&held)
	defer fs.SetOutput(stderr)
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				_, _ = held.WriteTo(stdout)
				return nil, exitOK, false
			}
			// The held text is the error and the whole help: print the
			// error alone, as every other usage error does.
			fs.SetOutput(stderr)
			return nil, usageError(fs, stderr, "%v", err), false
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), 0, true
		}
		if len(rest) == 0 {
			return pos, 0, true
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// usageError prints msg and one line pointing at the subcommand's help,
// and returns exitUsage. Every command's usage errors (a bad flag, a bad
// value, a missing argument) come through here. The help itself is not
// printed: at 50–90 lines it scrolled the error out of sight; -h prints it.
func usageError(fs *flag.FlagSet, stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "oncewal %s: %s\n%s\n", fs.Name(), fmt.Sprintf(format, args...), helpHint(fs.Name()))
	return exitUsage
}

// helpHint is the line that follows a usage error: where the help is.
func helpHint(cmd string) string {
	if cmd == "" {
		return "run 'oncewal help' for the commands"
	}
	return fmt.Sprintf("run 'oncewal %s -h' for the flags", cmd)
}

// quote renders user bytes for human output: Go-quoted, cut at max bytes with
// the full length noted, so one huge value cannot flood a terminal.
func quote(b []byte, max int) string {
	if len(b) <= max {
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%q… (%d B)", b[:max], len(b))
}

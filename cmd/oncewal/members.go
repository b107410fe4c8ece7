package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/oncewal/oncewal/node"
	"github.com/oncewal/oncewal/replication"
)

const membersSynopsis = `members add|remove|list --etcd URLS --cluster NAME [ID] [--json]

Edits or lists the replica set of a cluster of 'oncewal node' processes,
kept in etcd at PREFIX/NAME/data/members. Only members campaign, follow
and are shipped to: add every member's --id before (or after) starting
it. add ID adds it (already a member: nothing changes); the leader starts
shipping to it at once. remove ID removes it: the leader drops its slots
and refuses it, and it stops following and campaigning. list prints one
member ID a line and, when a term is published, its winner's line says
which member leads (or fences) at which epoch and address; --json prints
{"members": [...], "term": {...}} instead. Every change is a
compare-and-swap in etcd, so concurrent edits do not lose each other.
Exit 1 when etcd does not answer within --etcd-dial-timeout (nothing
changed); 2 on bad usage.`

func runMembers(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("members", membersSynopsis, stderr)
	ef := addEtcdFlags(fs)
	jsonOut := fs.Bool("json", false, "list: print JSON")
	lf := addLogFlags(fs)
	pos, status, ok := parseArgs(fs, args, stdout)
	if !ok {
		return status
	}
	if len(pos) == 0 {
		return usageError(fs, stderr, "give add ID, remove ID or list")
	}
	verb, rest := pos[0], pos[1:]
	var c flagCheck
	ef.check(&c)
	lf.check(&c)
	var id string
	switch verb {
	case "add", "remove":
		if len(rest) != 1 {
			c.failf("%s needs exactly one member ID", verb)
			break
		}
		id = rest[0]
		if err := replication.ValidFollowerID(id); err != nil || id == "" {
			c.failf("member ID %q: %v", id, err)
		}
	case "list":
		if len(rest) > 0 {
			c.failf("list takes no argument (got %q)", rest[0])
		}
	default:
		c.failf("unknown action %q: give add ID, remove ID or list", verb)
	}
	if *jsonOut && verb != "list" {
		c.failf("--json is for list")
	}
	if code, bad := c.refuse(fs, stderr); bad {
		return code
	}
	log := lf.logger(stderr)
	if err := members(log, ef, verb, id, *jsonOut, stdout); err != nil {
		log.Error("oncewal members: "+verb, "cluster", *ef.cluster, "err", err)
		return exitFailure
	}
	return exitOK
}

func members(log *slog.Logger, ef *etcdFlags, verb, id string, jsonOut bool, stdout io.Writer) error {
	co, before, err := ef.open(log, 0)
	if err != nil {
		return err
	}
	defer co.Close()
	cluster := *ef.cluster
	ctx, cancel := context.WithTimeout(context.Background(), *ef.dialTimeout)
	defer cancel()
	switch verb {
	case "add":
		m, err := node.AddMember(ctx, co, cluster, id)
		if err != nil {
			return err
		}
		what := "added"
		if before.Has(id) {
			what = "already a member:"
		}
		fmt.Fprintf(stdout, "%s %s; members of %s: %s\n", what, id, cluster, strings.Join(m.IDs, ","))
		return nil
	case "remove":
		m, err := node.RemoveMember(ctx, co, cluster, id)
		if err != nil {
			return err
		}
		what := "removed"
		if !before.Has(id) {
			what = "not a member:"
		}
		fmt.Fprintf(stdout, "%s %s; members of %s: %s\n", what, id, cluster, strings.Join(m.IDs, ","))
		return nil
	}
	t, ok, err := node.ReadTerm(ctx, co, cluster)
	if err != nil {
		return err
	}
	if jsonOut {
		out := struct {
			Members []string   `json:"members"`
			Term    *node.Term `json:"term"`
		}{Members: append([]string{}, before.IDs...)}
		if ok {
			out.Term = &t
		}
		b, _ := json.Marshal(out)
		fmt.Fprintf(stdout, "%s\n", b)
		return nil
	}
	for _, m := range before.IDs {
		if ok && m == t.ID {
			fmt.Fprintf(stdout, "%s\t%s\n", m, termLine(t))
		} else {
			fmt.Fprintln(stdout, m)
		}
	}
	if ok && !before.Has(t.ID) {
		fmt.Fprintf(stdout, "(%s, no longer a member)\t%s\n", t.ID, termLine(t))
	}
	if len(before.IDs) == 0 {
		fmt.Fprintf(stdout, "cluster %s has no members: add them with oncewal members add --etcd %s --cluster %s ID\n",
			cluster, *ef.endpoints, cluster)
	}
	return nil
}

// termLine words the published term for members list.
func termLine(t node.Term) string {
	switch {
	case t.Leading():
		return fmt.Sprintf("leader, epoch %d, at %s (term %d)", t.Epoch, t.Addr, t.Term)
	case t.To != "":
		return fmt.Sprintf("%s, epoch %d (term %d): handing over to %s", t.State, t.Epoch, t.Term, t.To)
	}
	return fmt.Sprintf("%s, epoch %d (term %d): not leading yet", t.State, t.Epoch, t.Term)
}

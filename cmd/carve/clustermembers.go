package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
)

// carve cluster join and remove: the Raft configuration's changes, as
// operations.md section 6 does them.

const clusterMembersUsage = `usage:
  carve cluster join --id ID --raft-addr HOST:PORT [--http-addr HOST:PORT] --masters URL[,URL...] OPERATOR_TLS
  carve cluster remove ID --masters URL[,URL...] OPERATOR_TLS

join adds a master as a voter (a master started with --join does it itself);
remove takes a master out of the Raft configuration: stop it first, and remove
masters one at a time. An id the cluster never knew is refused (404).
`

func runClusterJoin(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve cluster join")
	id := fs.String("id", "", "the new master's Raft server id (its --id)")
	raftAddr := fs.String("raft-addr", "", "the new master's Raft address HOST:PORT (its --raft-addr)")
	httpAddr := fs.String("http-addr", "", "the new master's API address HOST:PORT (its --http-addr): the others forward writes there when it leads")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the masters")
	mf := opclient.AddMasterFlags(fs, "a certificate of role operator (carve certs issue --role operator --name NAME)")
	fs.Usage = func() { fmt.Fprint(fs.Output(), clusterMembersUsage); fs.PrintDefaults() }
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *id == "" {
		return fmt.Errorf("%w: --id is required: the new master's --id", cli.ErrUsage)
	}
	for name, addr := range map[string]string{"--raft-addr": *raftAddr, "--http-addr": *httpAddr} {
		if addr == "" && name == "--http-addr" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%w: %s %q: want HOST:PORT (the new master's own %s)", cli.ErrUsage, name, addr, name)
		}
	}
	client, _, err := mf.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := client.Join(ctx, api.JoinRequest{ID: *id, RaftAddr: *raftAddr, HTTPAddr: *httpAddr}); err != nil {
		return fmt.Errorf("join %s: %w", *id, err)
	}
	return printServers(ctx, client, out, "master "+*id+" joined")
}

func runClusterRemove(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve cluster remove")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the masters")
	mf := opclient.AddMasterFlags(fs, "a certificate of role operator (carve certs issue --role operator --name NAME)")
	fs.Usage = func() { fmt.Fprint(fs.Output(), clusterMembersUsage); fs.PrintDefaults() }
	ids, err := cli.ParseOperands(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(ids) == 0:
		return fmt.Errorf("%w: name the master to remove (its --id)\n%s", cli.ErrUsage, clusterMembersUsage)
	case len(ids) > 1:
		return fmt.Errorf("%w: remove one master at a time (check carve cluster status in between), not %q", cli.ErrUsage, ids)
	}
	id := ids[0]
	client, _, err := mf.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := client.RemoveServer(ctx, id); err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	return printServers(ctx, client, out, "master "+id+" removed")
}

// printServers prints what was done and the servers of the Raft
// configuration after it.
func printServers(ctx context.Context, client *apiclient.Client, out io.Writer, done string) error {
	st, err := client.ClusterStatus(ctx)
	if err != nil {
		fmt.Fprintln(out, done)
		return fmt.Errorf("read the cluster's status after it: %w", err)
	}
	fmt.Fprintf(out, "%s; servers: %s (check with carve cluster status)\n", done, strings.Join(serverNames(st.Servers), ", "))
	return nil
}

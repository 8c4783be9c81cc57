package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
)

// Options configure the demo.
type Options struct {
	Binary string // the carve binary (os.Executable of `carve demo`)
	Hosts  int
	Keep   bool
	Out    io.Writer
}

const demoNetwork = `{
  "vtep_subnet": "100.64.0.0/16",
  "overlays": [
    {"name": "carve", "subnet": "10.128.0.0/9", "prefix": 24},
    {"name": "blue",  "subnet": "10.96.0.0/16", "prefix": 24, "subnet6": "fd00:b::/48", "prefix6": 64}
  ]
}
`

// Run starts 3 masters, registers the hosts as agents, shows the state,
// fails the leader over, and stops everything, also when ctx is cancelled.
func Run(ctx context.Context, opts Options) (err error) {
	out := opts.Out
	dir, err := os.MkdirTemp("", "carve-demo-")
	if err != nil {
		return err
	}
	ms, err := NewMasters(opts.Binary, dir, 3, []byte(demoNetwork))
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	defer func() {
		fmt.Fprintln(out, "\n== stopping the masters and removing", dir)
		err = errors.Join(err, ms.StopAll())
		if err == nil || ctx.Err() != nil {
			os.RemoveAll(dir)
		} else {
			fmt.Fprintln(out, "keeping", dir, "for the logs (master logs: m*.log)")
		}
	}()

	fmt.Fprintf(out, "== starting 3 masters (data under %s)\n", dir)
	if err := ms.StartAll(); err != nil {
		return err
	}
	for _, p := range ms.Procs {
		fmt.Fprintf(out, "   %s  http %s  raft %s  pid %d\n", p.ID, p.HTTPAddr, p.RaftAddr, p.cmd.Process.Pid)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	leader, err := ms.WaitLeader(wctx)
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   leader elected: %s\n", ms.Procs[leader].ID)

	client, err := api.NewClient(ms.URLs(), nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== registering %d agents (spread over all masters; followers proxy to the leader)\n", opts.Hosts)
	for i := range opts.Hosts {
		if err := registerHost(ctx, ms, i, i%len(ms.Procs)); err != nil {
			return err
		}
	}
	if err := printState(ctx, out, opts.Binary, ms.URLs()); err != nil {
		return err
	}

	fmt.Fprintf(out, "\n== stopping the leader %s: the other two elect a new one\n", ms.Procs[leader].ID)
	if err := ms.Stop(leader); err != nil {
		return err
	}
	wctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	newLeader, err := ms.WaitLeader(wctx)
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   new leader: %s; registering host-%d, and host-0 again (same leases)\n", ms.Procs[newLeader].ID, opts.Hosts)
	if err := registerHost(ctx, ms, opts.Hosts, newLeader); err != nil {
		return err
	}
	if err := registerHost(ctx, ms, 0, (newLeader+1)%len(ms.Procs)); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== restarting %s from its data dir\n", ms.Procs[leader].ID)
	if err := ms.Start(leader); err != nil {
		return err
	}
	if err := printState(ctx, out, opts.Binary, ms.URLs()); err != nil {
		return err
	}
	if cs, err := client.ClusterStatus(ctx); err == nil && cs.Leader != nil {
		fmt.Fprintf(out, "\ncluster (as %s sees it): leader %s at %s, %d servers, commit index %d\n",
			cs.ID, cs.Leader.ID, cs.Leader.HTTPAddr, len(cs.Servers), cs.CommitIndex)
	}
	if opts.Keep {
		fmt.Fprintf(out, "\n--keep: masters keep running; try\n   %s state --masters %s\nCtrl-C to stop.\n", opts.Binary, strings.Join(ms.URLs(), ","))
		<-ctx.Done()
	}
	return nil
}

// registerHost registers demo host i through master via (retrying over all).
func registerHost(ctx context.Context, ms *Masters, i, via int) error {
	urls := append([]string{ms.Procs[via].URL()}, ms.URLs()...)
	cl, err := api.NewClient(urls, nil)
	if err != nil {
		return err
	}
	req := api.RegisterRequest{AgentID: fmt.Sprintf("host-%d", i), Hostname: fmt.Sprintf("host-%d", i),
		IP: fmt.Sprintf("198.18.0.%d", 10+i), MeshAddr: fmt.Sprintf("198.18.0.%d:6783", 10+i),
		NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: true}, RequestID: api.NewRequestID()}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := cl.Register(ctx, req)
		if err == nil {
			return nil
		}
		if !api.IsRetryable(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("register %s: %w", req.AgentID, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// printState runs `carve state`, as a user would.
func printState(ctx context.Context, out io.Writer, binary string, urls []string) error {
	fmt.Fprintf(out, "\n$ carve state --masters %s\n", strings.Join(urls, ","))
	cmd := exec.CommandContext(ctx, binary, "state", "--masters", strings.Join(urls, ","), "--consistent")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("carve state: %w", err)
	}
	return nil
}

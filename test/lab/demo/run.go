// Package demo runs `carve demo` (bin/carve-lab): a whole carve cluster
// inside network namespaces (labcluster), with containers on every host, and
// shows what carve did: the kernel state of one host, the masters' state and
// a ping matrix through the overlay. Everything is removed on exit, on error and on
// SIGINT/SIGTERM (the caller's ctx ends); --keep leaves it running until then.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/carve-net/carve/test/lab/dockerlab"
	"github.com/carve-net/carve/test/lab/enginelab"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// Prefix starts the names of the demo's namespaces; a demo that was killed
// leaves namespaces (and processes) with it, which the next demo removes.
const Prefix = "carvedemo"

// Options configure the demo.
type Options struct {
	// Binary is the carve binary that runs masters and agents (bin/carve,
	// next to bin/carve-lab).
	Binary string
	// Hosts is the number of host namespaces, each with an agent; masters
	// run in the first three.
	Hosts int
	// Containers is the number of container namespaces per host.
	Containers int
	// Keep leaves the cluster running until ctx ends (Ctrl-C).
	Keep bool
	// Out receives the demo's output.
	Out io.Writer
}

// Run builds the cluster, shows it, and removes it before returning.
func Run(ctx context.Context, opts Options) (err error) {
	out := opts.Out
	if !netnslab.IsRoot() {
		return errors.New("the demo creates network namespaces: run it as root (sudo make demo)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("the demo needs iproute2 (`ip`, `bridge`): run deploy/install-deps.sh or apt-get install iproute2")
	}
	if killed, removed, err := labcluster.RemoveStale(Prefix); err != nil {
		fmt.Fprintf(out, "warning: cleaning up after an earlier demo: %v\n", err)
	} else if len(killed)+len(removed) > 0 {
		fmt.Fprintf(out, "== removed the leftovers of a demo that was killed: %d processes, %d namespaces\n", len(killed), len(removed))
	}

	removeStaleDirs(out)
	dir, err := os.MkdirTemp("", fmt.Sprintf("carve-demo-%d-", os.Getpid()))
	if err != nil {
		return err
	}
	cniPath, err := cniPlugins(ctx, out, opts.Binary, dir)
	if err != nil {
		return errors.Join(err, os.RemoveAll(dir))
	}
	masters := min(3, opts.Hosts)
	c, err := labcluster.New(labcluster.Options{Binary: opts.Binary, Hosts: opts.Hosts, Masters: masters, Prefix: Prefix, Dir: dir,
		CNIPath: cniPath, DockerBridge: true,
		// The agents choose the spec version as on a real host: 1.0.0
		// when this machine's Podman 4 or containerd 1.6 (libcni 1.1) could
		// load the conflists, so that the Podman container below runs.
		CNIVersion: "auto"})
	if err != nil {
		return errors.Join(err, os.RemoveAll(dir))
	}
	defer func() {
		if err != nil && ctx.Err() == nil {
			fmt.Fprintln(out, "\n== the demo failed; the end of each process log:")
			c.DumpLogs(out, 25)
		}
		fmt.Fprintf(out, "\n== removing everything: stopping %d processes (by PID), deleting the namespaces %s* and %s\n",
			masters+opts.Hosts, c.Lab.Prefix(), c.Dir)
		err = errors.Join(err, c.Close(), os.RemoveAll(dir))
	}()
	h1 := c.Host(1)

	fmt.Fprintf(out, "== carve demo: %d host(s), each a network namespace on an underlay bridge (198.18.0.0/15);\n", opts.Hosts)
	where := fmt.Sprintf("masters in hosts 1-%d", masters)
	if masters == 1 {
		where = "a master in host 1"
	}
	fmt.Fprintf(out, "   %s, an agent in every host, containers per host: %d; files in %s\n", where, opts.Containers, c.Dir)
	printSecurity(out, c)
	start := time.Now()
	if err := c.StartMasters(ctx); err != nil {
		return err
	}
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		return err
	}
	for _, m := range c.Masters() {
		role := ""
		if m == leader {
			role = "  (leader)"
		}
		fmt.Fprintf(out, "   master %s in %s  http %s  raft %s  pid %d%s\n", m.ID, m.Host.NS.Name, m.HTTPAddr, m.RaftAddr, m.PID(), role)
	}
	// A real Docker engine on host 2, before its agent: an agent that
	// found no engine tries again only every 30s.
	eng := startDocker(ctx, out, c)
	for _, h := range c.Hosts() {
		if err := c.StartAgent(h); err != nil {
			return err
		}
	}
	if err := c.WaitConverged(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "   every agent has programmed every other agent (%s after the first master started)\n\n", time.Since(start).Round(time.Millisecond))
	if err := printHosts(ctx, out, c); err != nil {
		return err
	}

	if opts.Containers > 0 {
		fmt.Fprintf(out, "\n== containers: a namespace each, attached through CNI as a runtime does it: libcni (run inside the host)\n")
		fmt.Fprintf(out, "   loads the agent's %s, the reference bridge plugin puts a veth on m-carve and asks carve-ipam,\n",
			filepath.Join(h1.CNIConfDir(), "carve.conflist"))
		fmt.Fprintf(out, "   which asks the agent over %s for the lowest free address of the host's mesos sub-subnet\n", h1.SocketPath())
	}
	for _, h := range c.Hosts() {
		for range opts.Containers {
			if _, err := c.AddCNIContainer(ctx, h, "carve", labcluster.CNIOptions{}); err != nil {
				return err
			}
		}
	}
	if opts.Containers > 0 {
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "   CONTAINER\tHOST\tCNI ATTACHMENT\tADDRESS\tGATEWAY\tHOST VETH\tNAMESPACE")
		for _, ct := range c.Containers() {
			fmt.Fprintf(tw, "   %s\t%s\t%s/%s\t%s\t%s\t%s\t%s\n", ct.Name, ct.Host.Name, ct.ContainerID, ct.IfName, ct.Addr, ct.Gateway, ct.NS.HostLink, ct.NS.Name)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	vtep := c.Network().VTEPName
	fmt.Fprintf(out, "\n== the kernel state carve programmed in %s (ip netns exec %s ...)\n", h1.Name, h1.NS.Name)
	for _, args := range [][]string{
		{"ip", "-d", "link", "show", vtep},
		{"ip", "neigh", "show", "dev", vtep},
		{"bridge", "fdb", "show", "dev", vtep},
		{"ip", "route", "show", "proto", "202"},
	} {
		if err := runShown(ctx, out, h1.NS.ExecArgs(args...), strings.Join(args, " ")); err != nil {
			return err
		}
	}

	urls := strings.Join(c.MasterURLs(), ",")
	stateArgs := append([]string{"state", "--masters", urls, "--consistent"}, c.OperatorArgs()...)
	fmt.Fprintf(out, "\n== the masters' state, read from inside %s\n$ carve %s\n", h1.Name, strings.Join(stateArgs, " "))
	cmd := exec.CommandContext(ctx, opts.Binary, stateArgs...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := h1.NS.Run(cmd); err != nil {
		return fmt.Errorf("carve state: %w", err)
	}

	if len(c.Containers()) > 0 {
		fmt.Fprintf(out, "\n== ping matrix: every container pings every container on the other hosts, through the overlay\n")
		m := c.PingAll(ctx)
		if err := m.Print(out); err != nil {
			return err
		}
		if err := m.Err(); err != nil {
			return err
		}
	}

	if eng != nil {
		if err := mixedContainers(ctx, out, c, eng); err != nil {
			return err
		}
	}
	if err := podmanContainer(ctx, out, c, filepath.Join(dir, "podman")); err != nil {
		return err
	}

	if opts.Keep {
		printLookAround(out, c, opts.Binary)
		<-ctx.Done()
	}
	return nil
}

// startDocker starts a Docker engine on host 2 (the cluster needs two
// hosts); when dockerd cannot run here it says so and returns nil: the demo
// goes on without the Docker container.
func startDocker(ctx context.Context, out io.Writer, c *labcluster.Cluster) *dockerlab.Engine {
	if len(c.Hosts()) < 2 {
		return nil
	}
	h2 := c.Host(2)
	if _, err := enginelab.StaticBusybox(); err != nil {
		fmt.Fprintf(out, "   Docker: no image for a Docker container (%v); the demo goes on without it\n", err)
		return nil
	}
	eng, err := c.StartDocker(ctx, h2)
	if err != nil {
		fmt.Fprintf(out, "   Docker: dockerd cannot run on this machine (%v); the demo goes on without the Docker container\n", err)
		return nil
	}
	fmt.Fprintf(out, "   Docker: a real dockerd in %s (%s), with its own data and cgroups; %s's agent is its IPAM plugin\n", h2.NS.Name, eng.Host(), h2.Name)
	return eng
}

// mixedContainers is the DC/OS design's own example: a Docker container on
// host 2's Docker network for the overlay (named after it, on the bridge
// d-carve, addresses from carve's IPAM plugin) and a CNI container on host
// 1's m-carve ping each other through the overlay.
func mixedContainers(ctx context.Context, out io.Writer, c *labcluster.Cluster, eng *dockerlab.Engine) error {
	h1, h2 := c.Host(1), c.Host(2)
	fmt.Fprintf(out, "\n== Docker and CNI containers on one overlay: `docker run --net carve` on %s (the Docker network the agent\n", h2.Name)
	fmt.Fprintf(out, "   created, named after the overlay as DC/OS names it, on the bridge d-carve), and a CNI container on %s's m-carve\n", h1.Name)
	dc, err := c.RunDockerContainer(ctx, h2, eng, "carve")
	if err != nil {
		return err
	}
	var ct *labcluster.Container
	if cs := c.AttachedOn(h1, "carve"); len(cs) > 0 {
		ct = cs[0]
	} else if ct, err = c.AddCNIContainer(ctx, h1, "carve", labcluster.CNIOptions{}); err != nil {
		return err
	}
	fmt.Fprintf(out, "   Docker container %.12s on %s: %s (gateway %s)\n", dc.ID, h2.Name, dc.Addr, dc.Gateway)
	fmt.Fprintf(out, "   CNI container %s on %s: %s (gateway %s)\n", ct.Name, h1.Name, ct.Addr, ct.Gateway)
	if err := dc.Ping(ctx, ct.Addr.Addr(), 20); err != nil {
		return fmt.Errorf("the Docker container on %s cannot ping the CNI container on %s: %w", h2.Name, h1.Name, err)
	}
	fmt.Fprintf(out, "   the Docker container on %s pings the CNI container on %s: ok\n", h2.Name, h1.Name)
	if err := ct.NS.PingRetry(ctx, dc.Addr.Addr(), 20); err != nil {
		return fmt.Errorf("the CNI container on %s cannot ping the Docker container on %s: %w", h1.Name, h2.Name, err)
	}
	fmt.Fprintf(out, "   the CNI container on %s pings the Docker container on %s: ok\n", h1.Name, h2.Name)
	return nil
}

// removeStaleDirs removes the work directories of demos that were killed
// (carve-demo-<pid>-* in the temporary directory, whose pid no longer runs).
func removeStaleDirs(out io.Writer) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "carve-demo-*-*"))
	for _, d := range dirs {
		rest := strings.TrimPrefix(filepath.Base(d), "carve-demo-")
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if netnslab.PIDAlive(pid) {
			continue // that demo still runs
		}
		if err := os.RemoveAll(d); err != nil {
			fmt.Fprintf(out, "warning: remove %s: %v\n", d, err)
		}
	}
}

// printHosts prints one row per host: its namespace, addresses, and the
// leases its agent holds.
func printHosts(ctx context.Context, out io.Writer, c *labcluster.Cluster) error {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tNAMESPACE\tUNDERLAY IP\tMASTER\tAGENT ID\tVTEP IP\tVTEP MAC\tm-carve BRIDGE")
	for _, h := range c.Hosts() {
		info, err := c.AgentClient(h).Overlay(ctx)
		if err != nil {
			return fmt.Errorf("agent on %s: %w", h.Name, err)
		}
		master := "-"
		if h.Master != nil {
			master = h.Master.ID
		}
		vtepIP, vtepMAC, bridge := "-", "-", "-"
		if ov := info.Overlay("carve"); ov != nil {
			if ov.Backend != nil && ov.Backend.VXLAN != nil {
				vtepIP, vtepMAC = ov.Backend.VXLAN.VTEPIP, ov.Backend.VXLAN.VTEPMAC
			}
			if ov.MesosBridge != nil {
				bridge = ov.MesosBridge.IP
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, h.NS.Name, h.IP().Addr(), master, info.AgentID, vtepIP, vtepMAC, bridge)
	}
	return tw.Flush()
}

// runShown prints "$ shown" and runs argv with its output to out.
func runShown(ctx context.Context, out io.Writer, argv []string, shown string) error {
	fmt.Fprintf(out, "$ %s\n", shown)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	return nil
}

// printLookAround tells how to explore the running cluster.
func printLookAround(out io.Writer, c *labcluster.Cluster, binary string) {
	h1 := c.Host(1)
	hosts := c.Hosts()
	last := hosts[len(hosts)-1]
	ip := h1.IP().Addr().String()
	fmt.Fprintf(out, "\n== --keep: the cluster keeps running until Ctrl-C, which removes it. Look around (as root):\n")
	fmt.Fprintf(out, "   ip netns list | grep %s\n", c.Lab.Prefix())
	fmt.Fprintf(out, "   ip netns exec %s ip -d link show %s\n", last.NS.Name, c.Network().VTEPName)
	fmt.Fprintf(out, "   ip netns exec %s bridge fdb show dev %s\n", last.NS.Name, c.Network().VTEPName)
	op := c.OperatorFiles()
	curlTLS := fmt.Sprintf("--cacert %s --cert %s --key %s", op.CA, op.Cert, op.Key)
	fmt.Fprintf(out, "   ip netns exec %s %s\n", h1.NS.Name, strings.Join(append([]string{binary, "state", "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...), " "))
	fmt.Fprintf(out, "   ip netns exec %s curl -s %s https://%s:%d/overlay-agent/peers     # the agent's view (needs curl)\n", h1.NS.Name, curlTLS, ip, labcluster.AgentHTTPPort)
	fmt.Fprintf(out, "   ip netns exec %s curl -s --cacert %s https://%s:%d/overlay-agent/peers     # without a client certificate: 401\n", h1.NS.Name, op.CA, ip, labcluster.AgentHTTPPort)
	if cs := c.Containers(); len(cs) > 1 {
		a, b := cs[0], cs[len(cs)-1]
		fmt.Fprintf(out, "   ip netns exec %s ping -c3 %s     # %s -> %s (needs iputils-ping)\n", a.NS.Name, b.Addr.Addr(), a.Name, b.Name)
	}
	fmt.Fprintf(out, "   cat %s     # the conflist the agent wrote\n", filepath.Join(h1.CNIConfDir(), "carve.conflist"))
	fmt.Fprintf(out, "   curl -s --unix-socket %s http://agent/ipam/allocations     # the agent's IPAM (needs curl)\n", h1.SocketPath())
	fmt.Fprintf(out, "   tail -f %s/logs/*.log     # masters, agents, and the CNI plugins' stderr\n", c.Dir)
	masterCurl := "curl -s"
	if len(c.OperatorArgs()) > 0 {
		masterCurl += " " + curlTLS
	}
	fmt.Fprintf(out, "   masters' HTTP API from the lab: ip netns exec %s %s %s/overlay-master/state\n", h1.NS.Name, masterCurl, c.MasterURLs()[0])
}

// printSecurity says how the cluster is secured.
func printSecurity(out io.Writer, c *labcluster.Cluster) {
	op := c.OperatorFiles()
	fmt.Fprintf(out, "   trust: a cluster CA made for this demo (%s), a certificate for every master and agent;\n", op.CA)
	fmt.Fprintf(out, "   agents serve their API over TLS to clients with a certificate of the CA, and gossip encrypted (%s)\n", c.MeshPasswordPath())
	if len(c.OperatorArgs()) > 0 {
		fmt.Fprintf(out, "   masters serve TLS; this demo reads them with the operator certificate %s\n", op.Cert)
	} else {
		fmt.Fprintf(out, "   masters: plain http (this carve's master has no TLS flags yet); agents reach them with --insecure\n")
	}
}

// cniPlugins finds carve-ipam and the reference CNI plugins next to the
// carve binary (`make build` puts carve-ipam in bin/, `make cni-plugins` the
// reference plugins in bin/cni/), and otherwise builds them with Go into the
// demo's directory, which is removed with it.
func cniPlugins(ctx context.Context, out io.Writer, binary, dir string) ([]string, error) {
	bin := filepath.Dir(binary)
	if path, err := labcluster.FindCNIPlugins(bin, filepath.Join(bin, "cni")); err == nil {
		fmt.Fprintf(out, "== CNI plugins (carve-ipam, bridge, portmap) from %s\n", strings.Join(path, ":"))
		return path, nil
	}
	target := filepath.Join(dir, "cni-bin")
	fmt.Fprintf(out, "== building the CNI plugins (%s) into %s\n", strings.Join(labcluster.CNIPlugins(), ", "), target)
	built, err := labcluster.BuildCNIPlugins(ctx, target)
	if err != nil {
		return nil, fmt.Errorf("no CNI plugins next to %s (make build cni-plugins) and building them failed: %w", binary, err)
	}
	return []string{built}, nil
}

// Package ipamcmd is carve's `carve ipam` commands: show (each overlay's
// leases and address use, or who holds an address), check (the masters'
// leases against every agent's allocations and Docker plugin, problems
// confirmed by a second read) and release (an attachment given back
// through the agent's IPAM socket). It reads and reports; what it changes
// it changes through the agent's API.
package ipamcmd

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/internal/retry"
)

const ipamUsage = `usage:
  carve ipam show  --masters URL[,URL...] [--agent ID] [--overlay NAME] [--json] [--agent-port 9797] \
                   --ca-file CA --cert-file CERT --key-file KEY | --insecure
  carve ipam show  --ip ADDR | --owner TEXT --masters URL[,URL...] [--overlay NAME] [--json] ... (who holds an address)
  carve ipam check --masters URL[,URL...] [--json] [--settle 3s] [--agent-port 9797] \
                   --ca-file CA --cert-file CERT --key-file KEY | --insecure
  carve ipam release --container-id ID [--ifname IF] | --ip ADDR [--network NAME] [--socket PATH] [--json]
                   (on the agent's host, through its IPAM socket)
`

// Run runs carve ipam with args (the subcommand and its flags), printing
// on out; errors wrap cli.ErrUsage for bad arguments and cli.ErrUnhealthy
// when check finds problems.
func Run(ctx context.Context, args []string, out io.Writer) error {
	return cli.Subcommand("carve ipam", ipamUsage, args, out, map[string]func([]string) error{
		"show":    func(args []string) error { return runIPAMShow(ctx, args, out) },
		"check":   func(args []string) error { return runIPAMCheck(ctx, args, out) },
		"release": func(args []string) error { return runIPAMRelease(ctx, args, out) },
	})
}

// bridgeUse is a bridge's leased range and its use on one agent.
type bridgeUse struct {
	Bridge string `json:"bridge"`
	// Name is the bridge's device (m-<overlay>, d-<overlay>).
	Name    string `json:"name,omitempty"`
	Subnet  string `json:"subnet,omitempty"`
	Subnet6 string `json:"subnet6,omitempty"`
	// Used, Used6 and Free are the agent's counts (absent when the agent
	// could not be read).
	Used  *uint64 `json:"used,omitempty"`
	Used6 *uint64 `json:"used6,omitempty"`
	Free  *uint64 `json:"free,omitempty"`
}

// agentUse is an agent's leases and address use on one overlay.
type agentUse struct {
	AgentID string `json:"agent_id"`
	IP      string `json:"ip,omitempty"`
	Subnet  string `json:"subnet,omitempty"`
	Subnet6 string `json:"subnet6,omitempty"`
	// Status is the lease's status in the masters' state.
	Status string `json:"status"`
	// Ready and Error are the agent's: can it allocate now, and why not.
	Ready   bool        `json:"ready"`
	Error   string      `json:"error,omitempty"`
	Bridges []bridgeUse `json:"bridges"`
}

// overlayUse is an overlay's ranges and use on every agent.
type overlayUse struct {
	Name    string `json:"name"`
	Subnet  string `json:"subnet,omitempty"`
	Subnet6 string `json:"subnet6,omitempty"`
	Used    uint64 `json:"used"`
	Used6   uint64 `json:"used6"`
	Free    uint64 `json:"free"`
	// Unread counts the agents whose use is not in the totals (not read).
	Unread int        `json:"unread,omitempty"`
	Agents []agentUse `json:"agents"`
}

// ipamShowReport is what carve ipam show prints.
type ipamShowReport struct {
	Overlays []overlayUse `json:"overlays"`
	// DataPaths are, per agent read, its peers by how its dataplane
	// reaches them (vxlan, routed, wireguard).
	DataPaths []agentDataPath `json:"data_paths,omitempty"`
	// Unreachable names the agents that could not be read, with why.
	Unreachable map[string]string `json:"unreachable,omitempty"`
}

func runIPAMShow(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve ipam show")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	agentID := fs.String("agent", "", "show only this agent (its agent id)")
	overlay := fs.String("overlay", "", "show only this overlay")
	ip := fs.String("ip", "", "show who holds this address, on any agent (or whose range it is in when nobody does)")
	owner := fs.String("owner", "", "show the allocations whose owner has this text in a field (pod, namespace, container name or id, Nomad alloc or job, netns), on any agent")
	af := opclient.AddAgentFlags(fs)
	fs.Usage = func() { fmt.Fprint(fs.Output(), ipamUsage); fs.PrintDefaults() }
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *agentID != "" {
		if err := api.ValidateAgentID(*agentID); err != nil {
			return fmt.Errorf("%w: --agent: %v", cli.ErrUsage, err)
		}
	}
	if *overlay != "" {
		if err := api.ValidateOverlayName(*overlay); err != nil {
			return fmt.Errorf("%w: --overlay: %v", cli.ErrUsage, err)
		}
	}
	if *ip != "" || *owner != "" {
		q, err := parseWhoQuery(*ip, *owner)
		if err != nil {
			return err
		}
		if *agentID != "" {
			return fmt.Errorf("%w: --agent does not go with --ip or --owner: every agent is searched", cli.ErrUsage)
		}
		return runIPAMWho(ctx, q, *overlay, *asJSON, af, out)
	}
	client, reader, err := af.Cluster()
	if err != nil {
		return err
	}
	st, err := opclient.ReadState(ctx, client, *af.Timeout)
	if err != nil {
		return err
	}
	agents := st.Agents
	if *agentID != "" {
		a := opclient.FindAgent(st, *agentID)
		if a == nil || a.AgentID != *agentID {
			return fmt.Errorf("%w: --agent %s: no such agent in the masters' state (index %d)", cli.ErrUsage, *agentID, st.Index)
		}
		agents = []api.AgentInfo{*a}
	}
	if *overlay != "" && !slices.ContainsFunc(st.Network.Overlays, func(o api.OverlayNetwork) bool { return o.Name == *overlay }) {
		return fmt.Errorf("%w: --overlay %s: the masters' configuration has no such overlay", cli.ErrUsage, *overlay)
	}
	usage := map[string]*api.AgentIPAMStatus{}
	var paths []agentDataPath
	var mu sync.Mutex
	failed := reader.ReadAgents(ctx, agents, func(ctx context.Context, c *api.AgentClient, a api.AgentInfo) error {
		u, err := c.IPAMStatus(ctx, "")
		if err != nil {
			return err
		}
		peers, err := c.Peers(ctx)
		if err != nil {
			return err
		}
		mu.Lock()
		usage[a.AgentID] = u
		paths = append(paths, dataPathOf(a.AgentID, peers))
		mu.Unlock()
		return nil
	})
	rep := buildIPAMShow(st, agents, usage, *overlay)
	slices.SortFunc(paths, func(a, b agentDataPath) int { return strings.Compare(a.AgentID, b.AgentID) })
	rep.DataPaths = paths
	if len(failed) > 0 {
		rep.Unreachable = failed
	}
	if err := cli.PrintReport(out, *asJSON, rep, printIPAMShow); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d agents could not be read: their use is not shown", len(failed), len(agents))
	}
	return nil
}

// buildIPAMShow joins the masters' leases with the agents' use, per overlay
// of the configuration (one when only is set) and per agent.
func buildIPAMShow(st *api.State, agents []api.AgentInfo, usage map[string]*api.AgentIPAMStatus, only string) *ipamShowReport {
	rep := &ipamShowReport{Overlays: []overlayUse{}}
	for _, cfg := range st.Network.Overlays {
		if only != "" && cfg.Name != only {
			continue
		}
		ou := overlayUse{Name: cfg.Name, Subnet: cfg.Subnet, Subnet6: cfg.Subnet6, Agents: []agentUse{}}
		for _, a := range agents {
			ov := a.Overlay(cfg.Name)
			if ov == nil {
				continue
			}
			au := agentUse{AgentID: a.AgentID, IP: a.IP, Subnet: ov.Subnet, Subnet6: ov.Subnet6, Status: ov.State.Status, Bridges: []bridgeUse{}}
			var nu *api.IPAMNetworkUsage
			if u := usage[a.AgentID]; u != nil {
				for i := range u.Networks {
					if u.Networks[i].Network == cfg.Name {
						nu = &u.Networks[i]
					}
				}
			}
			if nu != nil {
				au.Ready, au.Error = nu.Ready, nu.Error
			} else if usage[a.AgentID] == nil {
				ou.Unread++
			} else {
				au.Error = "the agent reports nothing of this overlay"
			}
			for _, kind := range []string{api.BridgeMesos, api.BridgeDocker} {
				br := ov.MesosBridge
				if kind == api.BridgeDocker {
					br = ov.DockerBridge
				}
				bu := bridgeUse{Bridge: kind}
				if br != nil {
					bu.Name, bu.Subnet, bu.Subnet6 = br.Name, br.IP, br.IP6
				}
				if nu != nil {
					for _, b := range nu.Bridges {
						if b.Bridge == kind {
							bu.Used, bu.Used6, bu.Free = &b.Used, &b.Used6, b.Free
							ou.Used += b.Used
							ou.Used6 += b.Used6
							if b.Free != nil {
								ou.Free += *b.Free
							}
						}
					}
				}
				if br != nil || bu.Used != nil {
					au.Bridges = append(au.Bridges, bu)
				}
			}
			ou.Agents = append(ou.Agents, au)
		}
		rep.Overlays = append(rep.Overlays, ou)
	}
	return rep
}

func printIPAMShow(out io.Writer, rep *ipamShowReport) error {
	count := func(p *uint64) string {
		if p == nil {
			return "?"
		}
		return strconv.FormatUint(*p, 10)
	}
	for _, ou := range rep.Overlays {
		agents := fmt.Sprintf("%d agents", len(ou.Agents))
		if ou.Unread > 0 {
			// Totals of the agents read only: never a "0 free" that
			// means "not known".
			agents += fmt.Sprintf(" (%d not read: the totals are of the %d read)", ou.Unread, len(ou.Agents)-ou.Unread)
		}
		fmt.Fprintf(out, "overlay %s %s: %s, %d addresses used (IPv6: %d), %d IPv4 free\n",
			ou.Name, strings.Trim(ou.Subnet+","+ou.Subnet6, ","), agents, ou.Used, ou.Used6, ou.Free)
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  AGENT\tIP\tSUBNET\tSTATUS\tBRIDGE\tRANGE\tUSED\tUSED6\tFREE")
		for _, au := range ou.Agents {
			status := au.Status
			if au.Error != "" {
				status += " (" + au.Error + ")"
			}
			if len(au.Bridges) == 0 {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t-\t-\t-\t-\t-\n", au.AgentID, cli.OrDash(au.IP), cli.OrDash(strings.Trim(au.Subnet+","+au.Subnet6, ",")), status)
			}
			for _, b := range au.Bridges {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", au.AgentID, cli.OrDash(au.IP), cli.OrDash(strings.Trim(au.Subnet+","+au.Subnet6, ",")),
					status, b.Bridge, cli.OrDash(strings.Trim(b.Subnet+","+b.Subnet6, ",")), count(b.Used), count(b.Used6), count(b.Free))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if err := printDataPaths(out, rep.DataPaths); err != nil {
		return err
	}
	for _, id := range slices.Sorted(maps.Keys(rep.Unreachable)) {
		fmt.Fprintf(out, "unreachable: agent %s: %s\n", id, rep.Unreachable[id])
	}
	return nil
}

// ipamCheckReport is what carve ipam check prints.
type ipamCheckReport struct {
	Index       uint64        `json:"index"`
	Agents      int           `json:"agents"`
	Allocations int           `json:"allocations"`
	Clean       bool          `json:"clean"`
	Problems    []ipamProblem `json:"problems"`
}

func runIPAMCheck(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve ipam check")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	settle := fs.Duration("settle", 3*time.Second, "when a read finds problems, read again after this long and report only those seen both times (an allocation in flight is no leak); 0: one read")
	af := opclient.AddAgentFlags(fs)
	fs.Usage = func() { fmt.Fprint(fs.Output(), ipamUsage); fs.PrintDefaults() }
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *settle < 0 {
		return fmt.Errorf("%w: --settle %s: want 0 or more", cli.ErrUsage, *settle)
	}
	client, reader, err := af.Cluster()
	if err != nil {
		return err
	}
	snap, err := readIPAM(ctx, client, reader)
	if err != nil {
		return err
	}
	problems := checkIPAM(snap)
	if len(problems) > len(snap.Failed) && *settle > 0 {
		if !retry.Sleep(ctx, *settle) {
			return ctx.Err()
		}
		first, firstFailed := problems, snap.Failed
		if snap, err = readIPAM(ctx, client, reader); err != nil {
			return err
		}
		problems = confirmProblems(first, firstFailed, checkIPAM(snap))
	}
	rep := &ipamCheckReport{Index: snap.State.Index, Agents: len(snap.State.Agents), Problems: problems, Clean: len(problems) == 0}
	if rep.Problems == nil {
		rep.Problems = []ipamProblem{}
	}
	for _, list := range snap.Allocations {
		rep.Allocations += len(list.Allocations)
	}
	if err := cli.PrintReport(out, *asJSON, rep, printIPAMCheck); err != nil {
		return err
	}
	if !rep.Clean {
		return fmt.Errorf("%w: %d", cli.ErrUnhealthy, len(problems))
	}
	return nil
}

// readIPAM reads the masters' state, then every agent's allocations; the
// agents keep allocating meanwhile.
func readIPAM(ctx context.Context, client *apiclient.Client, reader *opclient.AgentReader) (ipamSnapshot, error) {
	st, err := opclient.ReadState(ctx, client, reader.Timeout)
	if err != nil {
		return ipamSnapshot{}, err
	}
	snap := ipamSnapshot{State: st, Allocations: map[string]*api.AgentAllocations{}, Status: map[string]*api.AgentIPAMStatus{},
		Docker: map[string]*dockeripam.Status{}}
	var mu sync.Mutex
	snap.Failed = reader.ReadAgents(ctx, st.Agents, func(ctx context.Context, c *api.AgentClient, a api.AgentInfo) error {
		list, err := c.IPAMAllocations(ctx, "")
		if err != nil {
			return err
		}
		if list.AgentID != a.AgentID {
			return fmt.Errorf("the agent at %s says it is %q", a.IP, list.AgentID)
		}
		// The blocks the agent's ring gives it, read after its allocations
		// so that a grant an allocation lies in is already there: the
		// grants the masters have not learned yet.
		status, err := c.IPAMStatus(ctx, "")
		if err != nil {
			return err
		}
		if status.AgentID != a.AgentID {
			return fmt.Errorf("the agent at %s says it is %q", a.IP, status.AgentID)
		}
		// What the agent's Docker plugin lists of its engine's running
		// containers, to compare with its allocations; an agent without
		// the plugin answers not_found.
		var docker dockeripam.Status
		switch err := c.Docker(ctx, &docker); {
		case api.IsCode(err, api.CodeNotFound):
		case err != nil:
			docker = dockeripam.Status{Engine: dockeripam.EngineStatus{Error: "its Docker plugin's status could not be read: " + err.Error()}}
			fallthrough
		default:
			mu.Lock()
			snap.Docker[a.AgentID] = &docker
			mu.Unlock()
		}
		mu.Lock()
		snap.Allocations[a.AgentID] = list
		snap.Status[a.AgentID] = status
		mu.Unlock()
		return nil
	})
	return snap, nil
}

func printIPAMCheck(out io.Writer, rep *ipamCheckReport) error {
	fmt.Fprintf(out, "checked %d allocations on %d agents (masters' index %d): ", rep.Allocations, rep.Agents, rep.Index)
	if rep.Clean {
		fmt.Fprintln(out, "clean")
		return nil
	}
	fmt.Fprintf(out, "%d problems\n", len(rep.Problems))
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROBLEM\tOVERLAY\tADDRESS\tHELD BY\tDETAIL")
	for _, p := range rep.Problems {
		names := make([]string, len(p.Holders))
		for i, h := range p.Holders {
			names[i] = h.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Kind, cli.OrDash(p.Network), cli.OrDash(p.Address), strings.Join(names, " "), p.Detail)
	}
	return tw.Flush()
}

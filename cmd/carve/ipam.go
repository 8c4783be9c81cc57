package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/pki"
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

// DefaultAgentPort is the port of the agents' HTTP API that carve ipam
// reaches at each agent's underlay IP (carve agent --http-addr IP:9797).
const DefaultAgentPort = 9797

// maxAgentReads bounds the agents read at once.
const maxAgentReads = 16

func runIPAM(ctx context.Context, args []string, out io.Writer) error {
	return subcommand("carve ipam", ipamUsage, args, out, map[string]func([]string) error{
		"show":    func(args []string) error { return runIPAMShow(ctx, args, out) },
		"check":   func(args []string) error { return runIPAMCheck(ctx, args, out) },
		"release": func(args []string) error { return runIPAMRelease(ctx, args, out) },
	})
}

// agentFlags are the flags of a command that reads the agents' HTTP APIs
// as well as the masters.
type agentFlags struct {
	masters *masterFlags
	port    *int
	timeout *time.Duration
}

func addAgentFlags(fs *flag.FlagSet) *agentFlags {
	return &agentFlags{
		masters: addMasterFlags(fs, "a certificate of the cluster CA, role operator or agent (carve certs issue --role operator --name NAME): presented to the masters and the agents"),
		port:    fs.Int("agent-port", DefaultAgentPort, "port of the agents' HTTP API, reached at each agent's underlay IP (the port of carve agent --http-addr)"),
		timeout: fs.Duration("timeout", 10*time.Second, "how long to wait for the masters and for each agent"),
	}
}

// cluster checks the flags and returns a client for the masters and a
// reader of the agents.
func (f *agentFlags) cluster() (*api.Client, *agentReader, error) {
	if *f.port < 1 || *f.port > 65535 {
		return nil, nil, fmt.Errorf("%w: --agent-port %d: want 1-65535", cli.ErrUsage, *f.port)
	}
	if *f.timeout <= 0 {
		return nil, nil, fmt.Errorf("%w: --timeout %s: want a positive duration", cli.ErrUsage, *f.timeout)
	}
	client, opts, err := f.masters.client()
	if err != nil {
		return nil, nil, err
	}
	return client, &agentReader{port: *f.port, tls: opts.TLS, timeout: *f.timeout}, nil
}

// agentReader reads agents' HTTP APIs at their underlay IPs: over https
// with the operator's certificate, accepting only the certificate of the
// agent named in the masters' record.
type agentReader struct {
	port    int
	tls     *tls.Config // nil: plain http (--insecure)
	timeout time.Duration
}

// client returns a client for agent a and a function that releases it.
func (r *agentReader) client(a api.AgentInfo) (*api.AgentClient, func(), error) {
	if !a.HasIP() {
		return nil, nil, errors.New("the masters' state gives it no underlay IP (another agent took it over)")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	scheme := "http://"
	if r.tls != nil {
		scheme = "https://"
		cfg := r.tls.Clone()
		want := pki.Identity{Role: pki.RoleAgent, Name: a.AgentID}
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
				return errors.New("the agent gave no verified certificate")
			}
			id, err := pki.IdentityOf(cs.VerifiedChains[0][0])
			if err != nil {
				return fmt.Errorf("the agent's certificate: %w", err)
			}
			if id != want {
				return fmt.Errorf("the certificate at %s is %s, want %s", a.IP, id, want)
			}
			return nil
		}
		tr.TLSClientConfig = cfg
	}
	base := scheme + net.JoinHostPort(a.IP, strconv.Itoa(r.port))
	return api.NewAgentClient(base, &http.Client{Transport: tr, Timeout: r.timeout}), tr.CloseIdleConnections, nil
}

// readAgents calls read for every agent, at most maxAgentReads at once,
// and returns the errors by agent id.
func (r *agentReader) readAgents(ctx context.Context, agents []api.AgentInfo, read func(context.Context, *api.AgentClient, api.AgentInfo) error) map[string]string {
	failed := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxAgentReads)
	for _, a := range agents {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			err := func() error {
				c, release, err := r.client(a)
				if err != nil {
					return err
				}
				defer release()
				ctx, cancel := context.WithTimeout(ctx, r.timeout)
				defer cancel()
				return read(ctx, c, a)
			}()
			if err != nil {
				mu.Lock()
				failed[a.AgentID] = err.Error()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// readState reads the masters' state within the timeout.
func readState(ctx context.Context, client *api.Client, timeout time.Duration) (*api.State, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := client.State(ctx, api.StateOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the masters' state: %w", err)
	}
	return st, nil
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
	af := addAgentFlags(fs)
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
	client, reader, err := af.cluster()
	if err != nil {
		return err
	}
	st, err := readState(ctx, client, *af.timeout)
	if err != nil {
		return err
	}
	agents := st.Agents
	if *agentID != "" {
		a := findAgent(st, *agentID)
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
	failed := reader.readAgents(ctx, agents, func(ctx context.Context, c *api.AgentClient, a api.AgentInfo) error {
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
	if err := printReport(out, *asJSON, rep, printIPAMShow); err != nil {
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
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t-\t-\t-\t-\t-\n", au.AgentID, orDash(au.IP), orDash(strings.Trim(au.Subnet+","+au.Subnet6, ",")), status)
			}
			for _, b := range au.Bridges {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", au.AgentID, orDash(au.IP), orDash(strings.Trim(au.Subnet+","+au.Subnet6, ",")),
					status, b.Bridge, orDash(strings.Trim(b.Subnet+","+b.Subnet6, ",")), count(b.Used), count(b.Used6), count(b.Free))
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
	af := addAgentFlags(fs)
	fs.Usage = func() { fmt.Fprint(fs.Output(), ipamUsage); fs.PrintDefaults() }
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *settle < 0 {
		return fmt.Errorf("%w: --settle %s: want 0 or more", cli.ErrUsage, *settle)
	}
	client, reader, err := af.cluster()
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
	if err := printReport(out, *asJSON, rep, printIPAMCheck); err != nil {
		return err
	}
	if !rep.Clean {
		return fmt.Errorf("%w: %d", errUnhealthy, len(problems))
	}
	return nil
}

// readIPAM reads the masters' state, then every agent's allocations; the
// agents keep allocating meanwhile.
func readIPAM(ctx context.Context, client *api.Client, reader *agentReader) (ipamSnapshot, error) {
	st, err := readState(ctx, client, reader.timeout)
	if err != nil {
		return ipamSnapshot{}, err
	}
	snap := ipamSnapshot{State: st, Allocations: map[string]*api.AgentAllocations{}, Status: map[string]*api.AgentIPAMStatus{},
		Docker: map[string]*dockeripam.Status{}}
	var mu sync.Mutex
	snap.Failed = reader.readAgents(ctx, st.Agents, func(ctx context.Context, c *api.AgentClient, a api.AgentInfo) error {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Kind, orDash(p.Network), orDash(p.Address), strings.Join(names, " "), p.Detail)
	}
	return tw.Flush()
}

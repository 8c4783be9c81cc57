package ipamcmd

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"unicode"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
)

// carve ipam show --ip ADDR | --owner TEXT answers "who has this address":
// it reads every agent's allocations (each agent's HTTP API, as ipam check
// does) and prints those that hold the address, or whose owner has TEXT
// in one of its fields.

// maxOwnerQuery bounds --owner.
const maxOwnerQuery = 256

// whoQuery is what carve ipam show --ip / --owner looks for.
type whoQuery struct {
	IP    netip.Addr `json:"ip,omitzero"`
	Owner string     `json:"owner,omitempty"`
}

// parseWhoQuery checks --ip (an address, with or without a prefix length)
// and --owner (printable text, at most 256 bytes).
func parseWhoQuery(ip, owner string) (whoQuery, error) {
	var q whoQuery
	if ip != "" {
		a, err := api.ParseHostAddr(ip)
		if err != nil {
			return q, fmt.Errorf("%w: --ip: %v", cli.ErrUsage, err)
		}
		q.IP = a
	}
	if len(owner) > maxOwnerQuery {
		return q, fmt.Errorf("%w: --owner: %d bytes, at most %d", cli.ErrUsage, len(owner), maxOwnerQuery)
	}
	for _, r := range owner {
		if !unicode.IsPrint(r) || r == unicode.ReplacementChar {
			return q, fmt.Errorf("%w: --owner: non-printable character %q (want part of a pod, container, job name or id)", cli.ErrUsage, r)
		}
	}
	q.Owner = owner
	return q, nil
}

// match tells whether an allocation of the agent answers the query.
func (q whoQuery) match(agentID string, al api.Allocation) bool {
	if q.IP.IsValid() && !slices.ContainsFunc(al.IPs, func(ip api.IPConfig) bool {
		a, err := api.ParseHostAddr(ip.Address)
		return err == nil && a == q.IP
	}) {
		return false
	}
	if q.Owner == "" || al.Owner.Matches(q.Owner) {
		return true
	}
	text := strings.ToLower(q.Owner)
	return slices.ContainsFunc(ownerForms(agentID, al), func(f string) bool { return strings.Contains(strings.ToLower(f), text) })
}

// ownerForms are the ways carve's tables name an allocation's owner, beyond
// its fields one by one, so that --owner finds what a table printed: the
// owner as carve ipam show prints it ("pod shop/web-0", "docker container
// web [id 4f1c9e0d2b7a, ...]"), a pod as namespace/name, a Docker name as
// the engine's inspect writes it (/web), and the attachment as carve ipam
// check prints it (agent/container/ifname).
func ownerForms(agentID string, al api.Allocation) []string {
	forms := []string{al.ContainerID, al.ContainerID + "/" + al.IfName, agentID + "/" + al.ContainerID + "/" + al.IfName}
	if o := al.Owner; o != nil {
		forms = append(forms, o.String())
		if o.PodNamespace != "" && o.PodName != "" {
			forms = append(forms, o.PodNamespace+"/"+o.PodName)
		}
		if o.ContainerName != "" {
			forms = append(forms, "/"+o.ContainerName)
		}
	}
	return forms
}

// whoHolder is an allocation that answers the query, with its agent.
type whoHolder struct {
	AgentID string `json:"agent_id"`
	AgentIP string `json:"agent_ip,omitempty"`
	api.AgentAllocation
}

// whoReport is what carve ipam show --ip / --owner prints.
type whoReport struct {
	Query   whoQuery    `json:"query"`
	Holders []whoHolder `json:"holders"`
	// Space names, for an address nobody holds, the agents whose range
	// (lease or grown block) contains it.
	Space []string `json:"space,omitempty"`
	// Unreachable names the agents that could not be read, with why.
	Unreachable map[string]string `json:"unreachable,omitempty"`
}

// runIPAMWho is carve ipam show with --ip or --owner.
func runIPAMWho(ctx context.Context, q whoQuery, overlay string, asJSON bool, af *opclient.AgentFlags, out io.Writer) error {
	client, reader, err := af.Cluster()
	if err != nil {
		return err
	}
	snap, err := readIPAM(ctx, client, reader)
	if err != nil {
		return err
	}
	rep := buildWho(snap, q, overlay)
	if err := cli.PrintReport(out, asJSON, rep, printWho); err != nil {
		return err
	}
	if len(rep.Unreachable) > 0 {
		return fmt.Errorf("%d of %d agents could not be read: an address they hold is not shown", len(rep.Unreachable), len(snap.State.Agents))
	}
	return nil
}

// buildWho finds the allocations that answer q (of one overlay when
// overlay is set) and, for an address nobody holds, whose space it is.
func buildWho(snap ipamSnapshot, q whoQuery, overlay string) *whoReport {
	rep := &whoReport{Query: q, Holders: []whoHolder{}}
	if len(snap.Failed) > 0 {
		rep.Unreachable = snap.Failed
	}
	ips := map[string]string{}
	for _, a := range snap.State.Agents {
		ips[a.AgentID] = a.IP
	}
	for _, id := range slices.Sorted(maps.Keys(snap.Allocations)) {
		for _, al := range snap.Allocations[id].Allocations {
			if (overlay == "" || al.Network == overlay) && q.match(id, al.Allocation) {
				rep.Holders = append(rep.Holders, whoHolder{AgentID: id, AgentIP: ips[id], AgentAllocation: al})
			}
		}
	}
	if !q.IP.IsValid() || len(rep.Holders) > 0 {
		return rep
	}
	for _, id := range slices.Sorted(maps.Keys(snap.Status)) {
		for _, n := range snap.Status[id].Networks {
			if overlay != "" && n.Network != overlay {
				continue
			}
			for _, b := range n.Bridges {
				for _, blk := range slices.Concat(b.Blocks, b.Blocks6) {
					if p, err := netip.ParsePrefix(blk.Prefix); err == nil && p.Contains(q.IP) {
						rep.Space = append(rep.Space, fmt.Sprintf("agent %s (%s), overlay %s, %s bridge's %s", id, ips[id], n.Network, b.Bridge, p))
					}
				}
			}
		}
	}
	return rep
}

func printWho(out io.Writer, rep *whoReport) error {
	what := "owner matching " + fmt.Sprintf("%q", rep.Query.Owner)
	if rep.Query.IP.IsValid() {
		what = rep.Query.IP.String()
		if rep.Query.Owner != "" {
			what += fmt.Sprintf(" with owner matching %q", rep.Query.Owner)
		}
	}
	if len(rep.Holders) == 0 {
		fmt.Fprintf(out, "no allocation holds %s\n", what)
		for _, s := range rep.Space {
			fmt.Fprintf(out, "  free in the range of %s\n", s)
		}
		if rep.Query.IP.IsValid() && len(rep.Space) == 0 {
			fmt.Fprintln(out, "  and no agent read has it in a bridge's range")
		}
	} else {
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "OVERLAY\tADDRESS\tAGENT\tBRIDGE\tOWNER\tCONTAINER")
		for _, h := range rep.Holders {
			addrs := make([]string, len(h.IPs))
			for i, ip := range h.IPs {
				addrs[i] = ip.Address
			}
			owner := h.Owner.String()
			if h.Owner == nil {
				owner = "- (" + h.ContainerID + "/" + h.IfName + ", recorded before owners)"
			}
			state := h.Container
			if h.Unclaimed {
				state += ", unclaimed"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", h.Network, strings.Join(addrs, ","), h.AgentID+" ("+cli.OrDash(h.AgentIP)+")", h.Bridge, owner, state)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, id := range slices.Sorted(maps.Keys(rep.Unreachable)) {
		fmt.Fprintf(out, "unreachable: agent %s: %s\n", id, rep.Unreachable[id])
	}
	return nil
}

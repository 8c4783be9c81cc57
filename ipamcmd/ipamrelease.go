package ipamcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
)

// errNoAttachment: carve ipam release found nothing the agent holds under
// the name it was given.
var errNoAttachment = errors.New("no such attachment")

// ipamReleaseReport is what carve ipam release prints.
type ipamReleaseReport struct {
	Released []api.Allocation `json:"released"`
}

// runIPAMRelease frees a leaked attachment through the agent's IPAM socket
// (on the agent's host), as a runtime's DEL would: by container id (every
// interface, or --ifname's), or by one of its addresses.
func runIPAMRelease(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve ipam release")
	socket := fs.String("socket", "/run/carve/agent.sock", "the agent's IPAM socket (carve agent --socket), on this host")
	network := fs.String("network", "", "the overlay (default: every overlay of the agent)")
	containerID := fs.String("container-id", "", "release this container's attachments (as carve ipam show lists it)")
	ifName := fs.String("ifname", "", "with --container-id: only this interface (default: every interface of the container)")
	ip := fs.String("ip", "", "release the attachment that holds this address")
	asJSON := fs.Bool("json", false, "print what was released as JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the agent")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var addr netip.Addr
	switch {
	case (*containerID == "") == (*ip == ""):
		return fmt.Errorf("%w: give --container-id ID or --ip ADDR (carve ipam check lists leaks with both)", cli.ErrUsage)
	case *ifName != "" && *containerID == "":
		return fmt.Errorf("%w: --ifname goes with --container-id", cli.ErrUsage)
	case *ip != "":
		var err error
		if addr, err = netip.ParseAddr(*ip); err != nil || addr.Zone() != "" {
			return fmt.Errorf("%w: --ip %q is not an IP address", cli.ErrUsage, *ip)
		}
	}
	client := api.NewIPAMClient(*socket, *timeout)
	list, err := client.List(ctx, *network)
	if err != nil {
		return fmt.Errorf("list the allocations at %s: %w", *socket, err)
	}
	var matches []api.Allocation
	for _, a := range list.Allocations {
		if addr.IsValid() && holds(a, addr) ||
			*containerID != "" && a.ContainerID == *containerID && (*ifName == "" || a.IfName == *ifName) {
			matches = append(matches, a)
		}
	}
	if len(matches) == 0 {
		what := fmt.Sprintf("container %q", *containerID)
		if *ifName != "" {
			what += fmt.Sprintf(" interface %q", *ifName)
		}
		if addr.IsValid() {
			what = "address " + addr.String()
		}
		where := "any overlay"
		if *network != "" {
			where = fmt.Sprintf("overlay %q", *network)
		}
		return fmt.Errorf("%w: the agent at %s holds no attachment of %s on %s (it holds %d): carve ipam show --agent AGENT_ID lists them, carve ipam show --ip ADDR finds an address's agent", errNoAttachment, *socket, what, where, len(list.Allocations))
	}
	rep := ipamReleaseReport{Released: []api.Allocation{}}
	for _, a := range matches {
		got, err := client.Release(ctx, api.IPAMRequest{Network: a.Network, ContainerID: a.ContainerID, IfName: a.IfName, Bridge: a.Bridge})
		if err != nil {
			return fmt.Errorf("release %s %s/%s: %w", a.Network, a.ContainerID, a.IfName, err)
		}
		rep.Released = append(rep.Released, got.Released...)
	}
	return cli.PrintReport(out, *asJSON, rep, printReleased)
}

// holds reports whether the allocation holds addr.
func holds(a api.Allocation, addr netip.Addr) bool {
	return slices.ContainsFunc(a.IPs, func(c api.IPConfig) bool {
		p, err := netip.ParsePrefix(c.Address)
		return err == nil && p.Addr() == addr
	})
}

func printReleased(w io.Writer, rep ipamReleaseReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RELEASED\tOVERLAY\tCONTAINER\tIFNAME\tBRIDGE\tADDRESSES")
	for _, a := range rep.Released {
		var ips []string
		for _, c := range a.IPs {
			ips = append(ips, c.Address)
		}
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%s\n", a.Network, a.ContainerID, a.IfName, a.Bridge, strings.Join(ips, ","))
	}
	return tw.Flush()
}

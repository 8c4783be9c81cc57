package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
)

func runState(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve state")
	asJSON := fs.Bool("json", false, "print the raw state as JSON")
	consistent := fs.Bool("consistent", false, "linearizable read through the leader (needs an operator certificate)")
	mf := opclient.AddMasterFlags(fs, "a certificate of role operator or agent (carve certs issue --role operator --name NAME)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	client, _, err := mf.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := client.State(ctx, apiclient.StateOptions{Consistent: *consistent})
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	if *asJSON {
		return cli.WriteJSON(out, st)
	}
	return printStateTable(out, st)
}

// printStateTable prints one row per agent: agent, ip, subnets, VTEP IP,
// MAC, RECORD (the Raft index of the agent's record, its version in the
// API) and CARVE (the carve version the agent registered with).
func printStateTable(out io.Writer, st *api.State) error {
	fmt.Fprintf(out, "index %d, leader %s, %d agents\n", st.Index, cli.OrDash(st.Leader), len(st.Agents))
	printEncryption(out, st)
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AGENT\tIP\tSUBNETS\tVTEP IP\tVTEP MAC\tRECORD\tCARVE")
	for _, a := range st.Agents {
		var subnets []string
		vtepIP, vtepMAC := "-", "-"
		for _, ov := range a.Overlays {
			s := ov.Info.Name + "=" + strings.Trim(ov.Subnet+","+ov.Subnet6, ",")
			switch ov.State.Status {
			case api.StatusOK:
			case api.StatusFailed:
				s += "(FAILED: " + ov.State.Error + ")"
			default:
				s += "(" + strings.ToLower(strings.TrimPrefix(ov.State.Status, "STATUS_")) + ")"
			}
			subnets = append(subnets, s)
			if ov.Backend != nil && ov.Backend.VXLAN != nil {
				vtepIP, vtepMAC = ov.Backend.VXLAN.VTEPIP, ov.Backend.VXLAN.VTEPMAC
			}
		}
		for _, nl := range a.NotLeased {
			subnets = append(subnets, nl.Name+"=NOT LEASED("+nl.Reason+")")
		}
		ip := a.IP
		if !a.HasIP() {
			ip = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", a.AgentID, ip, cli.OrDash(strings.Join(subnets, " ")), vtepIP, vtepMAC, a.Version, cli.OrDash(a.CarveVersion))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := printBlocks(out, st); err != nil {
		return err
	}
	if len(st.Tombstones) > 0 {
		fmt.Fprintf(out, "%d deleted agents (tombstones)\n", len(st.Tombstones))
	}
	if silent := silentAgents(st); len(silent) > 0 {
		fmt.Fprintf(out, "agents not heard from (the leader's view): %s\n", strings.Join(silent, ", "))
	}
	for _, q := range st.Quarantine {
		fmt.Fprintf(out, "quarantined %s %s of deleted agent %s (since index %d)\n", q.Overlay, q.Prefix, q.From, q.Since)
	}
	return nil
}

// printBlocks prints one row per block an agent holds: agent, overlay,
// bridge, prefix, origin (with the donor of a grant), used and free
// addresses as the agent last reported them ("-" when unknown).
func printBlocks(out io.Writer, st *api.State) error {
	n := 0
	for _, a := range st.Agents {
		for _, ov := range a.Overlays {
			n += len(ov.Blocks)
		}
	}
	if n == 0 {
		return nil
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AGENT\tOVERLAY\tBRIDGE\tBLOCK\tORIGIN\tUSED\tFREE")
	for _, a := range st.Agents {
		for _, ov := range a.Overlays {
			for _, b := range ov.Blocks {
				origin := b.Origin
				if b.Donor != "" {
					origin += " from " + b.Donor
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.AgentID, ov.Info.Name, b.Bridge, b.Prefix, origin, count(b.Used), count(b.Free))
			}
		}
	}
	return tw.Flush()
}

// silentAgents are the agents whose overlays the masters show silent
// (the leader's state: carve state --consistent).
func silentAgents(st *api.State) []string {
	var out []string
	for _, a := range st.Agents {
		for _, ov := range a.Overlays {
			if strings.HasPrefix(ov.State.Error, api.SilentPrefix) {
				out = append(out, a.AgentID)
				break
			}
		}
	}
	return out
}

func count(v *uint64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatUint(*v, 10)
}

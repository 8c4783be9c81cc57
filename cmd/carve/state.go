package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
)

func runState(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve state")
	asJSON := fs.Bool("json", false, "print the raw state as JSON")
	consistent := fs.Bool("consistent", false, "linearizable read through the leader (needs an operator certificate)")
	mf := addMasterFlags(fs, "a certificate of role operator or agent (carve certs issue --role operator --name NAME)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	client, _, err := mf.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := client.State(ctx, api.StateOptions{Consistent: *consistent})
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	if *asJSON {
		return writeJSON(out, st)
	}
	return printStateTable(out, st)
}

// printStateTable prints one row per agent: agent, ip, subnets, VTEP IP, MAC, version.
func printStateTable(out io.Writer, st *api.State) error {
	fmt.Fprintf(out, "index %d, leader %s, %d agents\n", st.Index, orDash(st.Leader), len(st.Agents))
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AGENT\tIP\tSUBNETS\tVTEP IP\tVTEP MAC\tVERSION")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", a.AgentID, ip, orDash(strings.Join(subnets, " ")), vtepIP, vtepMAC, a.Version)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.Tombstones) > 0 {
		fmt.Fprintf(out, "%d deleted agents (tombstones)\n", len(st.Tombstones))
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

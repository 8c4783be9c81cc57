package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
)

const agentsUsage = `usage:
  carve agents delete ID|IP... --masters URL[,URL...] [--json] [--request-id ID] \
                      --ca-file CA --cert-file OPERATOR_CERT --key-file KEY | --insecure
`

func runAgents(ctx context.Context, args []string, out io.Writer) error {
	return cli.Subcommand("carve agents", agentsUsage, args, out, map[string]func([]string) error{
		"delete": func(args []string) error { return runAgentsDelete(ctx, args, out) },
	})
}

// Results of one agent of carve agents delete.
const (
	deleteDone    = "deleted"
	deleteAlready = "already_deleted"
	deleteFailed  = "not_deleted"
)

// deletedAgent is one named agent's outcome.
type deletedAgent struct {
	// Name is what the operator gave: an agent id or an underlay IP.
	Name    string `json:"name"`
	AgentID string `json:"agent_id"`
	IP      string `json:"ip,omitempty"`
	Result  string `json:"result"`
	// Version is the Raft index of the deletion (its tombstone's version).
	Version uint64 `json:"version,omitempty"`
}

// deleteReport is what carve agents delete prints.
type deleteReport struct {
	RequestID string         `json:"request_id,omitempty"`
	Index     uint64         `json:"index"`
	Agents    []deletedAgent `json:"agents"`
}

func runAgentsDelete(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve agents delete")
	asJSON := fs.Bool("json", false, "print the outcome as JSON")
	requestID := fs.String("request-id", "", "the request id of the bulk delete (default: a new one); give an earlier attempt's to retry it with one effect")
	mf := opclient.AddMasterFlags(fs, "an operator certificate (carve certs issue --role operator --name NAME): the masters refuse deletes from other roles")
	fs.Usage = func() { fmt.Fprint(fs.Output(), agentsUsage); fs.PrintDefaults() }
	names, err := cli.ParseOperands(fs, args)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("%w: name the agents to delete (agent ids or underlay IPs)\n%s", cli.ErrUsage, agentsUsage)
	}
	for _, n := range names {
		if _, err := netip.ParseAddr(n); err == nil {
			continue
		}
		if err := api.ValidateAgentID(n); err != nil {
			return fmt.Errorf("%w: %q is neither an IP address nor an agent id: %v", cli.ErrUsage, n, err)
		}
	}
	client, _, err := mf.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	before, err := client.State(ctx, apiclient.StateOptions{})
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	rep, ids, err := resolveDeletes(before, names)
	if err != nil {
		return err
	}
	rep.Index = before.Index
	if len(ids) > 0 {
		rep.RequestID = *requestID
		if rep.RequestID == "" {
			rep.RequestID = api.NewRequestID()
		}
		after, err := client.DeleteAgentsRequest(ctx, api.DeleteAgentsRequest{Agents: ids, RequestID: rep.RequestID})
		if err != nil {
			return fmt.Errorf("delete %s (request id %s): %w", strings.Join(ids, ", "), rep.RequestID, err)
		}
		rep.Index = after.Index
		judgeDeletes(rep, after)
	}
	if err := cli.PrintReport(out, *asJSON, rep, printDeleteReport); err != nil {
		return err
	}
	for _, a := range rep.Agents {
		if a.Result == deleteFailed {
			return fmt.Errorf("agent %s is still in the masters' state after the delete", a.AgentID)
		}
	}
	return nil
}

// resolveDeletes finds the agents that names (ids or IPs) designate in st
// and the ids to delete. A name that designates no agent, live or deleted,
// is an error: nothing is deleted then.
func resolveDeletes(st *api.State, names []string) (*deleteReport, []string, error) {
	rep := &deleteReport{Agents: []deletedAgent{}}
	var ids, unknown []string
	queued := map[string]bool{}
	for _, name := range names {
		// As the masters resolve a name: an agent id first, then an IP.
		a := opclient.FindAgent(st, name)
		switch {
		case a != nil:
			if !queued[a.AgentID] {
				queued[a.AgentID] = true
				ids = append(ids, a.AgentID)
				rep.Agents = append(rep.Agents, deletedAgent{Name: name, AgentID: a.AgentID, IP: a.IP, Result: deleteFailed})
			}
		case tombstoneOf(st, name) != nil:
			rep.Agents = append(rep.Agents, deletedAgent{Name: name, AgentID: name, Result: deleteAlready, Version: tombstoneOf(st, name).Version})
		default:
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		return nil, nil, fmt.Errorf("%w: no agent has the id or IP %s in the masters' state (index %d); nothing deleted",
			cli.ErrUsage, strings.Join(unknown, ", "), st.Index)
	}
	return rep, ids, nil
}

// judgeDeletes marks the agents that the state after the delete no longer
// holds, with their tombstone's version.
func judgeDeletes(rep *deleteReport, after *api.State) {
	for i := range rep.Agents {
		a := &rep.Agents[i]
		if a.Result != deleteFailed || opclient.FindAgent(after, a.AgentID) != nil {
			continue
		}
		a.Result = deleteDone
		if ts := tombstoneOf(after, a.AgentID); ts != nil {
			a.Version = ts.Version
		}
	}
}

// tombstoneOf returns the tombstone of agent id, or nil.
func tombstoneOf(st *api.State, id string) *api.Tombstone {
	for i := range st.Tombstones {
		if st.Tombstones[i].AgentID == id {
			return &st.Tombstones[i]
		}
	}
	return nil
}

func printDeleteReport(out io.Writer, rep *deleteReport) error {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tAGENT\tIP\tRESULT")
	for _, a := range rep.Agents {
		result := a.Result
		switch a.Result {
		case deleteDone:
			result = fmt.Sprintf("deleted at index %d", a.Version)
		case deleteAlready:
			result = fmt.Sprintf("already deleted (at index %d)", a.Version)
		case deleteFailed:
			result = "NOT deleted"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.Name, a.AgentID, cli.OrDash(a.IP), result)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rep.RequestID != "" {
		fmt.Fprintf(out, "request id %s, index %d\n", rep.RequestID, rep.Index)
	}
	return nil
}

package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	neturl "net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/buildinfo"
	"github.com/carve-net/carve/internal/cli"
	"github.com/carve-net/carve/internal/opclient"
	"github.com/carve-net/carve/master/state"
)

const clusterUsage = `usage:
  carve cluster status --masters URL[,URL...] [--json] [--timeout 10s] \
                       --ca-file CA --cert-file CERT --key-file KEY | --insecure
  carve cluster join --id ID --raft-addr HOST:PORT [--http-addr HOST:PORT] --masters URL[,URL...] OPERATOR_TLS
  carve cluster remove ID --masters URL[,URL...] OPERATOR_TLS
`

func runCluster(ctx context.Context, args []string, out io.Writer) error {
	return cli.Subcommand("carve cluster", clusterUsage, args, out, map[string]func([]string) error{
		"status": func(args []string) error { return runClusterStatus(ctx, args, out) },
		"join":   func(args []string) error { return runClusterJoin(ctx, args, out) },
		"remove": func(args []string) error { return runClusterRemove(ctx, args, out) },
	})
}

// clusterReport is what carve cluster status prints.
type clusterReport struct {
	// Masters are the masters asked: those given, then the servers they
	// name that were not given.
	Masters   []opclient.MasterView `json:"masters"`
	Leader    string                `json:"leader,omitempty"`
	ClusterID string                `json:"cluster_id,omitempty"`
	// History is the history the masters' logs belong to, when they agree
	// (api.ClusterStatus.History).
	History  string   `json:"history,omitempty"`
	Healthy  bool     `json:"healthy"`
	Problems []string `json:"problems,omitempty"`
	// Unchecked names the servers that were not asked: no URL was given for
	// them and the masters know none (a follower's API address is known
	// only once it led or joined with one). Give every master in --masters
	// to check them all.
	Unchecked []string `json:"unchecked,omitempty"`
	// AgentVersions counts the agents by carve version, as the first
	// master that answered has them.
	AgentVersions map[string]int `json:"agent_versions,omitempty"`
	// SilentAgents are the agents the leader has not heard from for longer
	// than SilentAfter (its view: followers judge none).
	SilentAgents []api.SilentAgent `json:"silent_agents,omitempty"`
	SilentAfter  string            `json:"silent_after,omitempty"`
	// AgentTrust is what the live agents report of the masters' records,
	// as the leader judges them (clusteragents.go).
	AgentTrust *api.AgentTrust `json:"agent_trust,omitempty"`
	// Warnings are what does not make the masters unhealthy but should be
	// fixed: versions apart by more than the supported skew, silent agents.
	Warnings []string `json:"warnings,omitempty"`
}

func runClusterStatus(ctx context.Context, args []string, out io.Writer) error {
	fs := cli.NewFlagSet("carve cluster status")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for each master")
	mf := opclient.AddMasterFlags(fs, "a certificate of role operator or agent (carve certs issue --role operator --name NAME)")
	fs.Usage = func() { fmt.Fprint(fs.Output(), clusterUsage); fs.PrintDefaults() }
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *timeout <= 0 {
		return fmt.Errorf("%w: --timeout %s: want a positive duration", cli.ErrUsage, *timeout)
	}
	rep, err := askClusterStatus(ctx, mf, *timeout)
	if err != nil {
		return err
	}
	if err := cli.PrintReport(out, *asJSON, rep, printClusterReport); err != nil {
		return err
	}
	if !rep.Healthy {
		return fmt.Errorf("%w: %d (the cluster is not healthy)", cli.ErrUnhealthy, len(rep.Problems))
	}
	return nil
}

// askClusterStatus asks every master of mf's --masters for its status,
// each within timeout (opclient.AskMasters), and judges the answers.
func askClusterStatus(ctx context.Context, mf *opclient.MasterFlags, timeout time.Duration) (*clusterReport, error) {
	views, err := opclient.AskMasters(ctx, mf, timeout)
	if err != nil {
		return nil, err
	}
	rep := &clusterReport{Masters: views}
	judgeCluster(rep)
	return rep, nil
}

// judgeCluster fills the report's leader, cluster id and problems (a master
// that did not answer, that sees no leader or another leader than the
// others, that cannot write its data dir, that has not caught up, that
// reports another cluster id) and the servers that could not be asked.
func judgeCluster(rep *clusterReport) {
	var problems []string
	leaders, clusterIDs, voters := map[string][]string{}, map[string][]string{}, map[string][]string{}
	seen := map[string]bool{}
	for _, v := range rep.Masters {
		st := v.Status
		if st == nil {
			// A URL given that did not answer: name the server it is, so
			// that it is not also reported as not checked.
			if id := serverAt(rep.Masters, v.URL); id != "" {
				seen[id] = true
				problems = append(problems, fmt.Sprintf("master %s (%s): down or unreachable: %s", id, v.URL, v.Error))
				continue
			}
			problems = append(problems, fmt.Sprintf("master %s: unreachable: %s", v.URL, v.Error))
			continue
		}
		voters[voterSet(st.Servers)] = append(voters[voterSet(st.Servers)], st.ID)
		seen[st.ID] = true
		name := fmt.Sprintf("master %s (%s)", st.ID, v.URL)
		if st.Leader == nil || st.Leader.ID == "" {
			problems = append(problems, name+": sees no leader")
		} else {
			leaders[st.Leader.ID] = append(leaders[st.Leader.ID], st.ID)
		}
		if st.DataDirError != "" {
			problems = append(problems, name+": "+st.DataDirError+" (docs/troubleshooting.md, a master behind)")
		}
		if !st.CaughtUp {
			problems = append(problems, name+": has not caught up with the log (it answers state reads with 503)")
		}
		if st.ClusterID == "" {
			problems = append(problems, name+": has no cluster id yet")
		} else {
			clusterIDs[st.ClusterID] = append(clusterIDs[st.ClusterID], st.ID)
		}
	}
	for _, v := range rep.Masters {
		if v.Status == nil {
			continue
		}
		for _, s := range v.Status.Servers {
			if !seen[s.ID] && s.URL == "" {
				seen[s.ID] = true
				rep.Unchecked = append(rep.Unchecked, s.ID)
			}
		}
	}
	switch len(leaders) {
	case 0:
		problems = append(problems, "no leader")
	case 1:
		for id := range leaders {
			rep.Leader = id
		}
	default:
		problems = append(problems, "the masters disagree on the leader: "+describeGroups(leaders, "seen by"))
	}
	if len(voters) > 1 {
		problems = append(problems, "the masters disagree on the voters (a master started with another --peers, or a removal it missed): "+
			describeGroups(voters, "seen by")+"; give every master the same --peers, and join or remove masters with carve cluster join|remove")
	}
	switch len(clusterIDs) {
	case 1:
		for id := range clusterIDs {
			rep.ClusterID = id
		}
	case 0:
	default:
		problems = append(problems, "the masters report different cluster ids (a rebuilt cluster?): "+describeGroups(clusterIDs, "on"))
	}
	problems = append(problems, judgeHistories(rep)...)
	problems = append(problems, judgeDigests(rep)...)
	problems = append(problems, judgeLag(rep)...)
	problems = append(problems, judgeExhaustion(rep)...)
	rep.Problems, rep.Healthy = problems, len(problems) == 0
	for _, v := range rep.Masters {
		if v.Status != nil && v.Status.ConfigDiffers != "" {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("master %s (%s): %s", v.Status.ID, v.URL, v.Status.ConfigDiffers))
		}
	}
	judgeVersions(rep)
	judgeSilence(rep)
	judgeAgentTrust(rep)
}

// judgeHistories reports masters of different histories (a master
// started on a data directory from before a whole-cluster restore: its
// Raft log reuses the indexes and terms of the restored one, and the
// masters' transports refuse each other), and a master that refused a
// Raft peer of another history which this report did not ask.
func judgeHistories(rep *clusterReport) []string {
	histories := map[string][]string{}
	var leaderHistory string
	for _, v := range rep.Masters {
		if v.Status == nil || v.Status.History == "" {
			continue
		}
		histories[v.Status.History] = append(histories[v.Status.History], v.Status.ID)
		if v.Status.Role == "leader" {
			leaderHistory = v.Status.History
		}
	}
	if len(histories) == 1 {
		for h := range histories {
			rep.History = h
		}
	}
	if len(histories) > 1 {
		var stale []string
		for h, ids := range histories {
			if h != leaderHistory {
				stale = append(stale, ids...)
			}
		}
		fix := "stop the master of the older history (the lower restore epoch after the cluster id, or none)"
		if leaderHistory != "" {
			slices.Sort(stale)
			fix = "stop " + strings.Join(stale, ",") + " (not of the leader's history)"
		}
		return []string{"the masters are of different histories (a master started on a data directory from before a whole-cluster restore; " +
			"they refuse each other's Raft log): " + describeGroups(histories, "on") + "; " + fix +
			", move its data directory away and start it on an empty one (docs/operations.md, section 9a)"}
	}
	var problems []string
	for _, v := range rep.Masters {
		if v.Status != nil && v.Status.HistoryConflict != "" {
			problems = append(problems, fmt.Sprintf("master %s (%s): %s", v.Status.ID, v.URL, v.Status.HistoryConflict))
		}
	}
	return problems
}

// followerLagLimit is how many entries a master may have applied fewer than
// its leader committed before it counts as behind: a follower catches up in
// far less under any load carve sees, and one that cannot write (a full
// disk) or is too slow falls further behind for good.
const followerLagLimit = 5000

// judgeLag reports the masters whose applied index is followerLagLimit or
// more behind their leader's commit index, as that leader reports it.
func judgeLag(rep *clusterReport) []string {
	var leader *api.ClusterStatus
	for _, v := range rep.Masters {
		if v.Status != nil && v.Status.Role == "leader" {
			leader = v.Status
		}
	}
	if leader == nil {
		return nil
	}
	var problems []string
	for _, v := range rep.Masters {
		st := v.Status
		if st == nil || st.ID == leader.ID || st.AppliedIndex+followerLagLimit > leader.CommitIndex {
			continue
		}
		problems = append(problems, fmt.Sprintf("master %s (%s) is %d entries behind (applied %d, leader %s committed %d): a follower that cannot write (a full disk) or keep up; journalctl -u carve-master on it, docs/troubleshooting.md (a master behind)",
			st.ID, v.URL, leader.CommitIndex-st.AppliedIndex, st.AppliedIndex, leader.ID, leader.CommitIndex))
	}
	return problems
}

// judgeDigests compares the masters' state digests where two or more
// took one at the same Raft index: a replicated state machine's replicas
// never differ at the same index, so any difference is a problem, named
// with the masters on each side.
func judgeDigests(rep *clusterReport) []string {
	byIndex := map[uint64]map[string][]string{} // index -> digest -> master ids
	for _, v := range rep.Masters {
		if v.Status == nil {
			continue
		}
		for _, d := range v.Status.StateDigests {
			if byIndex[d.Index] == nil {
				byIndex[d.Index] = map[string][]string{}
			}
			byIndex[d.Index][d.Digest] = append(byIndex[d.Index][d.Digest], v.Status.ID)
		}
	}
	for _, index := range slices.Sorted(maps.Keys(byIndex)) {
		if groups := byIndex[index]; len(groups) > 1 {
			short := map[string][]string{}
			for d, ids := range groups {
				short[d[:min(12, len(d))]] = ids
			}
			return []string{fmt.Sprintf("the masters hold different states at Raft index %d (state digests %s): their replicas diverged; "+
				"see docs/troubleshooting.md (masters whose states differ)", index, describeGroups(short, "on"))}
		}
	}
	return nil
}

// judgeSilence warns of the agents the leader has not heard from.
func judgeSilence(rep *clusterReport) {
	for _, v := range rep.Masters {
		if v.Status == nil || v.Status.Role != "leader" {
			continue
		}
		rep.SilentAgents, rep.SilentAfter = v.Status.SilentAgents, v.Status.SilentAfter
		if len(rep.SilentAgents) == 0 {
			return
		}
		var names []string
		for _, a := range rep.SilentAgents {
			name := a.AgentID
			if a.LastHeard != "" {
				name += " (last heard " + a.LastHeard + ")"
			}
			names = append(names, name)
		}
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%d agents not heard from for over %s, as leader %s sees it (their overlays show STATUS_FAILED): %s; is carve agent running there? (docs/troubleshooting.md)",
			len(names), v.Status.SilentAfter, v.Status.ID, strings.Join(names, ", ")))
		return
	}
}

// judgeVersions fills the agents' versions and warns of the masters' and
// agents' versions beyond the supported skew (buildinfo.SkewProblems).
func judgeVersions(rep *clusterReport) {
	masters, agents := buildinfo.Running{}, buildinfo.Running{}
	for _, v := range rep.Masters {
		if v.Status == nil {
			continue
		}
		if rep.AgentVersions == nil && v.Status.AgentVersions != nil {
			rep.AgentVersions = v.Status.AgentVersions
		}
		if v.Status.Build != nil {
			masters[v.Status.Build.Version] = append(masters[v.Status.Build.Version], "master "+v.Status.ID)
		}
	}
	for ver, n := range rep.AgentVersions {
		if ver != state.UnknownVersion {
			agents[ver] = append(agents[ver], fmt.Sprintf("%d agents", n))
		}
	}
	for _, p := range buildinfo.SkewProblems(masters, agents) {
		rep.Warnings = append(rep.Warnings, "mixed versions beyond the supported skew: "+p+" (docs/operations.md, section 8)")
	}
}

// serverAt is the id of the server that the answers place at url, a URL
// that did not answer: the server of that URL, or else the one server that
// did not answer either, whose URL is unknown, and whose HTTP or Raft
// address is on url's host; "" when there is no such server.
func serverAt(views []opclient.MasterView, url string) string {
	answered := map[string]bool{}
	for _, v := range views {
		if v.Status != nil {
			answered[v.Status.ID] = true
		}
	}
	host := urlHost(url)
	byHost := map[string]bool{}
	for _, v := range views {
		if v.Status == nil {
			continue
		}
		for _, s := range v.Status.Servers {
			switch {
			case answered[s.ID]:
			case s.URL != "" && s.URL == url:
				return s.ID
			case s.URL == "" && host != "" && (addrHost(s.HTTPAddr) == host || addrHost(s.RaftAddr) == host):
				byHost[s.ID] = true
			}
		}
	}
	if len(byHost) == 1 {
		for id := range byHost {
			return id
		}
	}
	return ""
}

// urlHost is the host of a master URL ("" when it has none).
func urlHost(u string) string {
	parsed, err := neturl.Parse(u)
	if err != nil {
		return ""
	}
	return parsed.Hostname()
}

// addrHost is the host of HOST:PORT ("" when it is not one).
func addrHost(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return host
}

// serverNames names the servers of a Raft configuration, a non-voter
// marked "(nonvoter)".
func serverNames(servers []api.ServerInfo) []string {
	var out []string
	for _, s := range servers {
		id := s.ID
		if !s.Voter {
			id += "(nonvoter)"
		}
		out = append(out, id)
	}
	return out
}

// voterSet renders a Raft configuration's voters, sorted: "m1,m2,m3".
func voterSet(servers []api.ServerInfo) string {
	var ids []string
	for _, s := range servers {
		if s.Voter {
			ids = append(ids, s.ID)
		}
	}
	slices.Sort(ids)
	return strings.Join(ids, ",")
}

// describeGroups renders {"m1": ["m1", "m2"]} as "m1 seen by m1,m2".
func describeGroups(groups map[string][]string, verb string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(groups)) {
		members := slices.Sorted(slices.Values(groups[k]))
		parts = append(parts, k+" "+verb+" "+strings.Join(members, ","))
	}
	return strings.Join(parts, "; ")
}

func printClusterReport(out io.Writer, rep *clusterReport) error {
	fmt.Fprintf(out, "leader %s, cluster id %s, history %s\n", cli.OrDash(rep.Leader), cli.OrDash(rep.ClusterID), cli.OrDash(rep.History))
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MASTER\tURL\tROLE\tLEADER\tTERM\tCOMMIT\tAPPLIED\tLAST\tSNAPSHOT\tCAUGHT UP\tSERVERS\tCARVE")
	for _, v := range rep.Masters {
		st := v.Status
		if st == nil {
			fmt.Fprintf(tw, "?\t%s\tunreachable\t-\t-\t-\t-\t-\t-\t-\t-\t-\n", v.URL)
			continue
		}
		leader := "-"
		if st.Leader != nil {
			leader = st.Leader.ID
		}
		servers := serverNames(st.Servers)
		version := "-"
		if st.Build != nil {
			version = st.Build.Version
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%t\t%s\t%s\n", st.ID, v.URL, st.Role, leader, st.Term,
			st.CommitIndex, st.AppliedIndex, st.LastIndex, st.LastSnapshotIndex, st.CaughtUp, strings.Join(servers, ","), version)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.AgentVersions) > 0 {
		var parts []string
		for _, ver := range slices.Sorted(maps.Keys(rep.AgentVersions)) {
			parts = append(parts, fmt.Sprintf("%s: %d", ver, rep.AgentVersions[ver]))
		}
		fmt.Fprintf(out, "agent versions: %s\n", strings.Join(parts, ", "))
	}
	for _, w := range rep.Warnings {
		fmt.Fprintln(out, "warning: "+w)
	}
	if len(rep.Unchecked) > 0 {
		fmt.Fprintf(out, "not checked: %s (the masters know no URL for them: give them in --masters)\n", strings.Join(rep.Unchecked, ", "))
	}
	if rep.Healthy {
		fmt.Fprintln(out, "healthy")
		return nil
	}
	for _, p := range rep.Problems {
		fmt.Fprintln(out, "problem: "+p)
	}
	return nil
}

package main

import (
	"fmt"

	"github.com/carve-net/carve/internal/cli"
)

// judgeAgentTrust reports, as problems, the agents the leader sees
// refusing the masters' records (they keep their kernel as it was and
// take no change) and those whose kernel holds fewer peers than the
// masters' records give them (api.AgentTrust).
func judgeAgentTrust(rep *clusterReport) {
	for _, v := range rep.Masters {
		if v.Status == nil || v.Status.Role != "leader" {
			continue
		}
		tr := v.Status.AgentTrust
		if tr == nil {
			return
		}
		rep.AgentTrust = tr
		if tr.RefusingCount > 0 {
			var names []string
			for _, a := range tr.Refusing {
				names = append(names, fmt.Sprintf("%s (%s)", a.AgentID, a.Reason))
			}
			rep.Problems = append(rep.Problems, fmt.Sprintf("%d agents refuse the masters' records and keep their kernel as it was, taking no change: %s; "+
				"see docs/troubleshooting.md, \"An agent that refuses the masters\"", tr.RefusingCount, cli.Listed(names, tr.RefusingCount)))
		}
		if tr.FewPeersCount > 0 {
			var names []string
			for _, a := range tr.FewPeers {
				names = append(names, fmt.Sprintf("%s (%d programmed, %d expected at index %d)", a.AgentID, a.Programmed, a.Expected, a.Index))
			}
			rep.Problems = append(rep.Problems, fmt.Sprintf("%d agents program fewer peers than the masters' records give them: %s; "+
				"see their log and carve_agent_netlink_errors_total, and docs/troubleshooting.md, \"An agent that refuses the masters\"", tr.FewPeersCount, cli.Listed(names, tr.FewPeersCount)))
		}
		rep.Healthy = len(rep.Problems) == 0
		return
	}
}

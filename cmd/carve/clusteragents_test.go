package main

import (
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/opclient"
)

// TestJudgeAgentTrust: agents the leader sees refusing the masters'
// records, or programming fewer peers than the records give them, are
// problems (a non-zero exit); agents on another key alone are not.
func TestJudgeAgentTrust(t *testing.T) {
	leader := api.ServerInfo{ID: "m1", URL: "https://m1", Voter: true}
	view := func(tr *api.AgentTrust) []opclient.MasterView {
		return []opclient.MasterView{{URL: "https://m1", Status: &api.ClusterStatus{ID: "m1", Role: "leader", ClusterID: "c", CaughtUp: true,
			Leader: &leader, Servers: []api.ServerInfo{leader}, AgentTrust: tr}}}
	}
	tests := []struct {
		name string
		tr   *api.AgentTrust
		want []string // one problem each, containing these
	}{
		{"none", nil, nil},
		{"another key alone", &api.AgentTrust{OtherKey: []api.AgentKey{{AgentID: "a1"}}, OtherKeyCount: 1}, nil},
		{"refusing", &api.AgentTrust{Refusing: []api.AgentRefusing{{AgentID: "a2", Reason: "the masters sign with key x"}}, RefusingCount: 3},
			[]string{"3 agents refuse the masters' records", "a2 (the masters sign with key x) and 2 more", "An agent that refuses the masters"}},
		{"few peers", &api.AgentTrust{FewPeers: []api.AgentFewPeers{{AgentID: "a3", Programmed: 0, Expected: 3, Index: 42}}, FewPeersCount: 1},
			[]string{"1 agents program fewer peers", "a3 (0 programmed, 3 expected at index 42)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := &clusterReport{Masters: view(tt.tr)}
			judgeCluster(rep)
			if rep.Healthy != (len(tt.want) == 0) || len(rep.Problems) != min(len(tt.want), 1) {
				t.Fatalf("healthy %t, problems %q; want %q", rep.Healthy, rep.Problems, tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(rep.Problems[0], w) {
					t.Errorf("problem %q does not say %q", rep.Problems[0], w)
				}
			}
			if rep.AgentTrust != tt.tr {
				t.Errorf("the report's agent_trust is %+v, want the leader's", rep.AgentTrust)
			}
		})
	}
}

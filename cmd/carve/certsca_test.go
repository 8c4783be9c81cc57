package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestJudgeAgentCAs: a CA rotation's step 3 is allowed when every live
// agent the leader sees presents a certificate of a CA of the new CA
// file, and refused otherwise, naming the agents on another CA (or not
// seen yet) and the fix.
func TestJudgeAgentCAs(t *testing.T) {
	const newCA, oldCA, otherCA = "aaaa000000000000000000000000000000000000000000000000000000000000", "bbbb111111111111111111111111111111111111111111111111111111111111", "cccc2222"
	cas := map[string]bool{newCA: true}
	status := func(agents int, silent int, byCA ...api.AgentCA) *api.ClusterStatus {
		st := &api.ClusterStatus{ID: "m1", Role: "leader", AgentVersions: map[string]int{"v1": agents}}
		for range silent {
			st.SilentAgents = append(st.SilentAgents, api.SilentAgent{AgentID: "gone"})
		}
		if len(byCA) > 0 {
			st.AgentTrust = &api.AgentTrust{ByCA: byCA}
		}
		return st
	}
	tests := []struct {
		name     string
		leader   *api.ClusterStatus
		live     int
		mentions []string // none: allowed
	}{
		{"every agent on the new CA", status(3, 0, api.AgentCA{CA: newCA, Count: 3, Agents: []string{"h1", "h2", "h3"}}), 3, nil},
		{"no agents", status(0, 0), 0, nil},
		{"every agent silent", status(2, 2), 0, nil},
		{"no leader", nil, 0, []string{"no master leads"}},
		{"agents on the old CA", status(3, 0,
			api.AgentCA{CA: newCA, Count: 1, Agents: []string{"h1"}},
			api.AgentCA{CA: oldCA, Count: 2, Agents: []string{"h3", "h2"}}), 3,
			[]string{"2 live agents present a certificate of another CA than NEW/ca.pem: h2 (CA bbbb111111111111), h3 (CA bbbb111111111111)", "carve certs issue --dir NEW", "SIGHUP the agents (step 2)"}},
		{"more agents than listed", status(300, 0,
			api.AgentCA{CA: oldCA, Count: 300, Agents: []string{"h1"}}), 300,
			[]string{"300 live agents", "h1 (CA bbbb111111111111) and 299 more"}},
		{"on two other CAs", status(2, 0,
			api.AgentCA{CA: oldCA, Count: 1, Agents: []string{"h2"}},
			api.AgentCA{CA: otherCA, Count: 1, Agents: []string{"h1"}}), 2,
			[]string{"h1 (CA cccc2222), h2 (CA bbbb111111111111)"}},
		{"agents not seen yet", status(2, 0,
			api.AgentCA{CA: newCA, Count: 1, Agents: []string{"h1"}},
			api.AgentCA{CA: "", Count: 1, Agents: []string{"h2"}}), 2,
			[]string{"1 live agents whose certificate the leader m1 has not seen yet: h2", "retry in a minute"}},
		{"masters that predate the check", status(2, 0), 0, []string{"does not say which CA", "upgrade the masters"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			live, err := judgeAgentCAs(tt.leader, "NEW/ca.pem", cas)
			if len(tt.mentions) == 0 {
				if err != nil || live != tt.live {
					t.Errorf("judged %d live agents, %v; want %d and allowed", live, err, tt.live)
				}
				return
			}
			if !errors.Is(err, errAgentsOnOtherCA) {
				t.Fatalf("judged %v, want errAgentsOnOtherCA", err)
			}
			for _, m := range tt.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
}

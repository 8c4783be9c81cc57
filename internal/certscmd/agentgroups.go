package certscmd

import (
	"fmt"
	"slices"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
)

// agentGroup is one group of the leader's live agents as a check of a
// rotation step sees it (agent_trust's by_ca, by_mesh).
type agentGroup struct {
	count  int
	agents []string // at most 100 named
	// accepted: the check passes them; unreported: they report nothing
	// yet; else label describes what they hold, beside each name.
	accepted, unreported bool
	label                string
}

// agentTally is what a check found among the live agents: how many are
// live, those in a group it refuses (named with their group's label) and
// those that report nothing yet, each sorted.
type agentTally struct {
	live, otherCount, unreportedCount int
	other, unreported                 []string
}

// tallyAgentGroups sorts the leader's groups of live agents (groupsOf)
// for a check whose refusals wrap sentinel. Only the leader knows which
// agents are live, so without one there is no answer; a leader with live
// agents but no groups cannot say either, and noGroups says why that may
// be (it follows "the leader ID has live agents but").
func tallyAgentGroups(leader *api.ClusterStatus, sentinel error, noGroups string, groupsOf func(*api.AgentTrust) []agentGroup) (agentTally, error) {
	if leader == nil {
		return agentTally{}, fmt.Errorf("%w: no master leads, and only the leader knows which agents are live; retry once one does", sentinel)
	}
	var groups []agentGroup
	if leader.AgentTrust != nil {
		groups = groupsOf(leader.AgentTrust)
	}
	if len(groups) == 0 {
		agents := 0
		for _, n := range leader.AgentVersions {
			agents += n
		}
		if agents > len(leader.SilentAgents) {
			return agentTally{}, fmt.Errorf("%w: the leader %s has live agents but %s", sentinel, leader.ID, noGroups)
		}
		return agentTally{}, nil
	}
	var t agentTally
	for _, g := range groups {
		t.live += g.count
		switch {
		case g.accepted:
		case g.unreported:
			t.unreportedCount += g.count
			t.unreported = append(t.unreported, g.agents...)
		default:
			t.otherCount += g.count
			for _, a := range g.agents {
				t.other = append(t.other, fmt.Sprintf("%s (%s)", a, g.label))
			}
		}
	}
	slices.Sort(t.other)
	slices.Sort(t.unreported)
	return t, nil
}

// agentsOffKey names the live agents that do not report verifying with
// key, as the leader sees them (api.AgentTrust.OtherKey).
func agentsOffKey(tr *api.AgentTrust) string {
	var names []string
	for _, a := range tr.OtherKey {
		k := "no key reported"
		if key, err := api.ParseSigningKey(a.SigningKey); err == nil {
			k = "key " + api.SigningKeyFingerprint(key)
		}
		names = append(names, fmt.Sprintf("%s (%s)", a.AgentID, k))
	}
	return cli.Listed(names, tr.OtherKeyCount)
}

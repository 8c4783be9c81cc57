// Package agenttrust judges what the agents say of their trust in the
// masters, for the cluster status (GET /cluster/status, carve cluster
// status): which agents report a signing key other than the masters',
// which refuse the masters' records, which hold fewer peers in their
// kernel than the records give them, and how they group by the mesh
// passwords they report.
//
// It is a package of its own because it is a judgement read off the
// replicated state, not a rule of it: a pure function of the records, the
// reports and the enabled overlays, which master/state hands it under its
// lock. It imports nothing of master/ but record (cmd/carve/deps_test.go
// keeps it so).
package agenttrust

import (
	"slices"
	"sort"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/record"
)

// Judge judges the live agents' last reports (api.ReportRequest; reports,
// by agent id) against their records (agents, by id): those whose key
// differs from key (the one the judging master signs with; "" signs
// nothing and judges no key), those that refuse the masters' records, and
// those whose kernel holds fewer peers than the records at the report's
// index give them. enabled names the configured overlays that are
// enabled; silent are the agents left out (not heard from: their reports
// are old news).
//
// The peers an agent must hold, at its report's PeersIndex, are counted
// as the agents with an IP leased in one of its enabled overlays whose
// record is at or below that index, but itself: the largest such count
// over its overlays, a lower bound of the union that costs no pairwise
// comparison. An agent holds those of them it verified and programmed;
// a record changed after the index is not counted, so a report that is
// older than the table is never judged short for what came after it.
//
// ByMesh groups the live agents by the mesh passwords they report
// (meshGroups).
func Judge(key string, agents map[string]*record.Agent, reports map[string]record.Report, enabled, silent map[string]bool) api.AgentTrust {
	var out api.AgentTrust
	// versions[overlay] are the record versions of the agents with an IP
	// leased in that enabled overlay, sorted.
	versions := map[string][]uint64{}
	for _, rec := range agents {
		if !rec.IP.IsValid() {
			continue
		}
		for name := range rec.Leases {
			if enabled[name] && record.HoldsLease(rec.Leases[name]) {
				versions[name] = append(versions[name], rec.Version)
			}
		}
	}
	for _, v := range versions {
		slices.Sort(v)
	}
	ids := make([]string, 0, len(agents))
	for id := range agents {
		if !silent[id] {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out.ByMesh = meshGroups(ids, reports)
	for _, id := range ids {
		rec, rep := agents[id], reports[id]
		if key != "" && rep.SigningKey != key {
			out.OtherKeyCount++
			if len(out.OtherKey) < api.MaxAgentTrustListed {
				out.OtherKey = append(out.OtherKey, api.AgentKey{AgentID: id, SigningKey: rep.SigningKey})
			}
		}
		if rep.Refusing != "" {
			out.RefusingCount++
			if len(out.Refusing) < api.MaxAgentTrustListed {
				out.Refusing = append(out.Refusing, api.AgentRefusing{AgentID: id, Reason: rep.Refusing})
			}
		}
		if rep.ProgrammedPeers == nil {
			continue
		}
		expected := 0
		for name, l := range rec.Leases {
			v := versions[name]
			if !enabled[name] || !record.HoldsLease(l) || len(v) == 0 {
				continue
			}
			n := sort.Search(len(v), func(i int) bool { return v[i] > rep.PeersIndex })
			if rec.IP.IsValid() && rec.Version <= rep.PeersIndex {
				n-- // itself
			}
			expected = max(expected, n)
		}
		if *rep.ProgrammedPeers < expected {
			out.FewPeersCount++
			if len(out.FewPeers) < api.MaxAgentTrustListed {
				out.FewPeers = append(out.FewPeers, api.AgentFewPeers{AgentID: id, Programmed: *rep.ProgrammedPeers, Expected: expected, Index: rep.PeersIndex})
			}
		}
	}
	return out
}

// meshGroups groups the agents ids (sorted) by the mesh password
// fingerprints of their last reports, sorted by the pair; nil when none
// reports one (agents that predate the report, or a mesh without
// password: nothing to judge).
func meshGroups(ids []string, reports map[string]record.Report) []api.AgentMesh {
	type pair struct{ password, accepted string }
	groups := map[pair]*api.AgentMesh{}
	reported := false
	for _, id := range ids {
		rep := reports[id]
		k := pair{rep.MeshPassword, rep.MeshAccepted}
		reported = reported || k.password != "" || k.accepted != ""
		g := groups[k]
		if g == nil {
			g = &api.AgentMesh{Password: k.password, Accepted: k.accepted}
			groups[k] = g
		}
		g.Count++
		if len(g.Agents) < api.MaxAgentTrustListed {
			g.Agents = append(g.Agents, id)
		}
	}
	if !reported {
		return nil
	}
	out := make([]api.AgentMesh, 0, len(groups))
	for _, g := range groups {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b api.AgentMesh) int {
		if c := strings.Compare(a.Password, b.Password); c != 0 {
			return c
		}
		return strings.Compare(a.Accepted, b.Accepted)
	})
	return out
}

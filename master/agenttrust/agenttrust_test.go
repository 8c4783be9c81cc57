package agenttrust

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/record"
)

// TestJudge: an agent with another key, one refusing, and one holding
// fewer peers than the records at its report's index give it are named;
// a record changed after that index is not counted, nor the agent
// itself, nor agents without an IP or in a disabled overlay; silent
// agents are left out. (master/state's agenttrust tests judge through
// the table.)
func TestJudge(t *testing.T) {
	leased := map[string]record.Lease{"on": {Subnet: netip.MustParsePrefix("10.0.0.0/24")}, "off": {Subnet: netip.MustParsePrefix("10.1.0.0/24")}}
	agent := func(id string, version uint64, ip bool) *record.Agent {
		a := &record.Agent{ID: id, Version: version, Leases: leased}
		if ip {
			a.IP = netip.MustParseAddr("198.18.0.1")
		}
		return a
	}
	agents := map[string]*record.Agent{
		"a1": agent("a1", 5, true), "a2": agent("a2", 6, true), "a3": agent("a3", 7, true),
		"a4": agent("a4", 20, true), // changed after the reports' index
		"a5": agent("a5", 3, false), // no IP
		"a6": agent("a6", 4, true),  // silent
	}
	reports := map[string]record.Report{
		"a1": {SigningKey: "k", ProgrammedPeers: new(3), PeersIndex: 10}, // a2, a3, a6: enough
		"a2": {SigningKey: "other", ProgrammedPeers: new(2), PeersIndex: 10},
		"a3": {SigningKey: "k", Refusing: "bad signature"},
		"a6": {SigningKey: "other"},
	}
	got := Judge("k", agents, reports, map[string]bool{"on": true, "off": false}, map[string]bool{"a6": true})
	want := api.AgentTrust{
		OtherKeyCount: 3, OtherKey: []api.AgentKey{{AgentID: "a2", SigningKey: "other"}, {AgentID: "a4"}, {AgentID: "a5"}},
		RefusingCount: 1, Refusing: []api.AgentRefusing{{AgentID: "a3", Reason: "bad signature"}},
		FewPeersCount: 1, FewPeers: []api.AgentFewPeers{{AgentID: "a2", Programmed: 2, Expected: 3, Index: 10}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if got := Judge("", agents, reports, map[string]bool{"on": true}, nil); got.OtherKeyCount != 0 {
		t.Errorf("no key judged %d agents' keys", got.OtherKeyCount)
	}
}

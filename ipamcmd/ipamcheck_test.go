package ipamcmd

import (
	"fmt"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// leaseRecord is an agent's record with one overlay "carve": the mesos
// bridge on mesos4 (and mesos6), the docker bridge on docker4.
func leaseRecord(id, mesos4, mesos6, docker4 string) api.AgentInfo {
	ov := api.AgentOverlay{Info: api.OverlayNetwork{Name: "carve"}, State: api.OverlayState{Status: api.StatusOK}}
	if mesos4 != "" || mesos6 != "" {
		ov.MesosBridge = &api.BridgeInfo{Name: "m-carve", IP: mesos4, IP6: mesos6}
	}
	if docker4 != "" {
		ov.DockerBridge = &api.BridgeInfo{Name: "d-carve", IP: docker4}
	}
	return api.AgentInfo{AgentID: id, IP: "198.18.0." + strings.TrimPrefix(id, "h"), Overlays: []api.AgentOverlay{ov}}
}

// alloc is an allocation on overlay carve with the given addresses (CIDR).
func alloc(container, bridge, state string, addrs ...string) api.AgentAllocation {
	al := api.AgentAllocation{Allocation: api.Allocation{Network: "carve", ContainerID: container, IfName: "eth0", Bridge: bridge}, Container: state}
	for _, a := range addrs {
		al.IPs = append(al.IPs, api.IPConfig{Address: a})
	}
	return al
}

func TestCheckIPAM(t *testing.T) {
	state := &api.State{Index: 7, Agents: []api.AgentInfo{
		leaseRecord("h1", "10.128.0.1/25", "fd00::1/80", "10.128.0.129/25"),
		leaseRecord("h2", "10.128.1.1/25", "", ""),
	}}
	allocs := func(byAgent map[string][]api.AgentAllocation) map[string]*api.AgentAllocations {
		out := map[string]*api.AgentAllocations{}
		for id, list := range byAgent {
			out[id] = &api.AgentAllocations{AgentID: id, Allocations: list}
		}
		return out
	}
	tests := []struct {
		name   string
		allocs map[string][]api.AgentAllocation
		failed map[string]string
		want   []string // "kind network address holders"
	}{
		{
			name: "clean",
			allocs: map[string][]api.AgentAllocation{
				"h1": {
					alloc("c1", api.BridgeMesos, api.ContainerLive, "10.128.0.2/25", "fd00::2/80"),
					alloc("c2", api.BridgeDocker, api.ContainerUnknown, "10.128.0.130/25"),
				},
				"h2": {alloc("c3", api.BridgeMesos, api.ContainerLive, "10.128.1.2/25")},
			},
		},
		{
			name: "a live container detached from its bridge",
			allocs: map[string][]api.AgentAllocation{
				"h2": {func() api.AgentAllocation {
					a := alloc("c3", api.BridgeMesos, api.ContainerLive, "10.128.1.2/25")
					a.Detached = "its host veth veth1234 is on no bridge (m-carve was removed under it)"
					return a
				}()},
			},
			want: []string{"detached carve 10.128.1.2 h2/c3/eth0"},
		},
		{
			name:   "no allocations",
			allocs: map[string][]api.AgentAllocation{"h1": nil, "h2": nil},
		},
		{
			name: "duplicate on two agents",
			allocs: map[string][]api.AgentAllocation{
				"h1": {alloc("c1", api.BridgeMesos, api.ContainerLive, "10.128.0.2/25")},
				"h2": {alloc("c9", api.BridgeMesos, api.ContainerLive, "10.128.0.2/25")},
			},
			want: []string{
				"duplicate carve 10.128.0.2 h1/c1/eth0,h2/c9/eth0",
				"outside carve 10.128.0.2 h2/c9/eth0",
			},
		},
		{
			name: "duplicate on one agent, IPv6",
			allocs: map[string][]api.AgentAllocation{
				"h1": {
					alloc("c1", api.BridgeMesos, api.ContainerLive, "10.128.0.2/25", "fd00::2/80"),
					alloc("c2", api.BridgeMesos, api.ContainerLive, "10.128.0.3/25", "fd00::2/80"),
				},
			},
			want: []string{"duplicate carve fd00::2 h1/c1/eth0,h1/c2/eth0"},
		},
		{
			name: "outside: the other bridge's range, no such bridge, no such overlay, no IPv6 range, unparsable",
			allocs: map[string][]api.AgentAllocation{
				"h1": {
					alloc("c1", api.BridgeMesos, api.ContainerLive, "10.128.0.130/25"),
					{Allocation: api.Allocation{Network: "other", ContainerID: "c3", IfName: "eth0", Bridge: api.BridgeMesos,
						IPs: []api.IPConfig{{Address: "10.1.0.2/24"}}}, Container: api.ContainerLive},
				},
				"h2": {
					alloc("c2", api.BridgeDocker, api.ContainerUnknown, "10.128.1.130/25"),
					alloc("c4", api.BridgeMesos, api.ContainerLive, "10.128.1.2/25", "fd00:1::2/80"),
					alloc("c5", api.BridgeMesos, api.ContainerLive, "not-an-address"),
				},
			},
			want: []string{
				"outside carve 10.128.0.130 h1/c1/eth0",
				"outside carve 10.128.1.130 h2/c2/eth0",
				"outside carve fd00:1::2 h2/c4/eth0",
				"outside carve not-an-address h2/c5/eth0",
				"outside other 10.1.0.2 h1/c3/eth0",
			},
		},
		{
			name: "duplicate with a record another agent keeps unclaimed",
			allocs: map[string][]api.AgentAllocation{
				"h1": {alloc("c1", api.BridgeMesos, api.ContainerLive, "10.128.0.2/25")},
				"h2": {{Allocation: api.Allocation{Network: "carve", ContainerID: "c9", IfName: "eth0", Bridge: api.BridgeMesos,
					IPs: []api.IPConfig{{Address: "10.128.0.2/32"}}}, Container: api.ContainerLive, Unclaimed: true}},
			},
			want: []string{
				"duplicate carve 10.128.0.2 h1/c1/eth0,h2/c9/eth0",
				"outside carve 10.128.0.2 h2/c9/eth0",
			},
		},
		{
			name: "leak and an agent that could not be read",
			allocs: map[string][]api.AgentAllocation{
				"h1": {
					alloc("c1", api.BridgeMesos, api.ContainerGone, "10.128.0.2/25", "fd00::2/80"),
					alloc("c2", api.BridgeMesos, api.ContainerUnknown, "10.128.0.3/25"),
				},
			},
			failed: map[string]string{"h2": "connection refused"},
			want: []string{
				"leak carve 10.128.0.2,fd00::2 h1/c1/eth0",
				"unreachable   h2",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			problems := checkIPAM(ipamSnapshot{State: state, Allocations: allocs(tc.allocs), Failed: tc.failed})
			var got []string
			for _, p := range problems {
				var hs []string
				for _, h := range p.Holders {
					hs = append(hs, h.String())
				}
				got = append(got, fmt.Sprintf("%s %s %s %s", p.Kind, p.Network, p.Address, strings.Join(hs, ",")))
				if p.Detail == "" {
					t.Errorf("%s: no detail", got[len(got)-1])
				}
			}
			for _, p := range problems {
				for _, h := range p.Holders {
					if h.Unclaimed && !strings.Contains(p.Detail, h.String()+" keeps it in its store without owning it") && p.Kind == problemDuplicate {
						t.Errorf("%s: the detail %q does not say that %s keeps it unclaimed", p.Kind, p.Detail, h)
					}
				}
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("problems:\n%s\nwant:\n%s\n(details: %+v)", strings.Join(got, "\n"), strings.Join(tc.want, "\n"), problems)
			}
		})
	}
}

func TestConfirmProblems(t *testing.T) {
	p := func(kind, addr string, agents ...string) ipamProblem {
		out := ipamProblem{Kind: kind, Network: "carve", Address: addr}
		for _, a := range agents {
			out.Holders = append(out.Holders, holder{AgentID: a, ContainerID: "c", IfName: "eth0"})
		}
		return out
	}
	tests := []struct {
		name                string
		first, second, want []ipamProblem
		firstFailed         map[string]string
	}{
		{
			name:   "seen twice is kept, seen once is dropped",
			first:  []ipamProblem{p(problemLeak, "10.0.0.2", "h1"), p(problemLeak, "10.0.0.3", "h1")},
			second: []ipamProblem{p(problemLeak, "10.0.0.2", "h1"), p(problemLeak, "10.0.0.4", "h1")},
			want:   []ipamProblem{p(problemLeak, "10.0.0.2", "h1")},
		},
		{
			name:   "a resolved problem is gone",
			first:  []ipamProblem{p(problemDuplicate, "10.0.0.2", "h1", "h2")},
			second: nil,
		},
		{
			name:        "an agent unread the first time needs no confirmation",
			first:       []ipamProblem{p(problemUnreachable, "", "h2")},
			firstFailed: map[string]string{"h2": "timeout"},
			second:      []ipamProblem{p(problemDuplicate, "10.0.0.2", "h1", "h2")},
			want:        []ipamProblem{p(problemDuplicate, "10.0.0.2", "h1", "h2")},
		},
		{
			name:   "an unreachable agent is always reported",
			second: []ipamProblem{p(problemUnreachable, "", "h3")},
			want:   []ipamProblem{p(problemUnreachable, "", "h3")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := confirmProblems(tc.first, tc.firstFailed, tc.second)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestCheckIPAMGrownAndGranted: addresses are judged against every block
// the agent holds for the bridge, not its first sub-subnet only. The
// masters' record lists h4's first /28, a block it grew and one granted by
// h2 (learned); h2 granted another block out of its first block that the
// masters have not learned yet, which h4 reports in its IPAM status (the
// ring's ownership): inside a block of the donor's at the masters, so not
// outside either. A grant h4 claims out of space the masters give to
// nobody it names, and an address of the donor inside the block it granted
// away, are outside.
func TestCheckIPAMGrownAndGranted(t *testing.T) {
	blk := func(bridge, prefix, origin, donor string) api.Block {
		return api.Block{Bridge: bridge, Prefix: prefix, Origin: origin, Donor: donor}
	}
	h4 := leaseRecord("h4", "10.128.0.97/28", "fd00::1/80", "10.128.0.113/28")
	h4.Overlays[0].Blocks = []api.Block{
		blk(api.BridgeMesos, "10.128.0.96/28", api.BlockLeased, ""),
		blk(api.BridgeDocker, "10.128.0.112/28", api.BlockLeased, ""),
		blk(api.BridgeMesos, "fd00::/80", api.BlockLeased, ""),
		blk(api.BridgeMesos, "10.128.0.128/28", api.BlockGrown, ""),
		blk(api.BridgeMesos, "10.128.1.4/30", api.BlockGranted, "h2"),
	}
	// h2's first mesos /28 is 10.128.1.0/28: it granted 10.128.1.4/30
	// (learned) and 10.128.1.8/30 (not yet): its record lists what it
	// still holds of the learned state.
	h2 := leaseRecord("h2", "10.128.1.1/28", "", "")
	h2.Overlays[0].Blocks = []api.Block{
		blk(api.BridgeMesos, "10.128.1.0/30", api.BlockLeased, ""),
		blk(api.BridgeMesos, "10.128.1.8/29", api.BlockLeased, ""),
	}
	state := &api.State{Index: 9, Agents: []api.AgentInfo{h2, h4}}
	free := func(n uint64) *uint64 { return &n }
	status := map[string]*api.AgentIPAMStatus{
		"h4": {AgentID: "h4", Networks: []api.IPAMNetworkUsage{{Network: "carve", Ready: true, Bridges: []api.IPAMBridgeUsage{{
			Bridge: api.BridgeMesos, Subnet: "10.128.0.96/28", Free: free(3),
			Blocks: []api.IPAMBlockUsage{
				{Prefix: "10.128.0.96/28", Origin: api.BlockLeased},
				{Prefix: "10.128.0.128/28", Origin: api.BlockGrown},
				{Prefix: "10.128.1.4/30", Origin: api.BlockGranted, Donor: "h2"},
				{Prefix: "10.128.1.8/30", Origin: api.BlockGranted, Donor: "h2"}, // not learned yet
				{Prefix: "10.128.2.0/30", Origin: api.BlockGranted, Donor: "h2"}, // not h2's at the masters
				{Prefix: "10.128.0.144/30", Origin: api.BlockGrown, Donor: "h2"}, // only a grant counts
			},
		}}}}},
	}
	allocs := map[string]*api.AgentAllocations{
		"h4": {AgentID: "h4", Allocations: []api.AgentAllocation{
			alloc("c1", api.BridgeMesos, api.ContainerLive, "10.128.0.98/28", "fd00::2/80"),
			alloc("c2", api.BridgeMesos, api.ContainerLive, "10.128.0.130/28"),
			alloc("c3", api.BridgeMesos, api.ContainerLive, "10.128.1.6/30"),
			alloc("c4", api.BridgeMesos, api.ContainerLive, "10.128.1.10/30"),
			alloc("c5", api.BridgeDocker, api.ContainerLive, "10.128.0.114/28"),
			alloc("c6", api.BridgeMesos, api.ContainerLive, "10.128.2.2/30"),
			alloc("c7", api.BridgeMesos, api.ContainerLive, "10.128.0.146/30"),
			alloc("c8", api.BridgeDocker, api.ContainerLive, "10.128.0.131/28"), // the mesos bridge's block
		}},
		"h2": {AgentID: "h2", Allocations: []api.AgentAllocation{
			alloc("d1", api.BridgeMesos, api.ContainerLive, "10.128.1.2/28"),
			alloc("d2", api.BridgeMesos, api.ContainerLive, "10.128.1.5/28"), // granted away
		}},
	}
	problems := checkIPAM(ipamSnapshot{State: state, Allocations: allocs, Status: status})
	var got []string
	for _, p := range problems {
		got = append(got, fmt.Sprintf("%s %s %s", p.Kind, p.Address, p.Holders[0]))
	}
	want := []string{
		"outside 10.128.0.131 h4/c8/eth0",
		"outside 10.128.0.146 h4/c7/eth0",
		"outside 10.128.1.5 h2/d2/eth0",
		"outside 10.128.2.2 h4/c6/eth0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s\n(details: %+v)", strings.Join(got, "\n"), strings.Join(want, "\n"), problems)
	}
	for _, p := range problems {
		if p.Address == "10.128.1.5" && !strings.Contains(p.Detail, "10.128.1.8/29") {
			t.Errorf("the detail of %s does not list the agent's blocks: %q", p.Address, p.Detail)
		}
	}
}

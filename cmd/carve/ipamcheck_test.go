package main

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

package ipamcmd

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/cli"
)

func TestWhoQuery(t *testing.T) {
	snap := ipamSnapshot{
		State: &api.State{Agents: []api.AgentInfo{{AgentID: "h1", IP: "198.18.0.11"}, {AgentID: "h2", IP: "198.18.0.12"}}},
		Allocations: map[string]*api.AgentAllocations{
			"h1": {AgentID: "h1", Allocations: []api.AgentAllocation{{Allocation: api.Allocation{Network: "ov", ContainerID: "c1", IfName: "eth0", Bridge: "mesos",
				IPs: []api.IPConfig{{Address: "10.1.0.2/25"}}, Owner: &api.Owner{Runtime: api.RuntimeCNI, PodNamespace: "shop", PodName: "web-0"}}, Container: api.ContainerLive}}},
			"h2": {AgentID: "h2", Allocations: []api.AgentAllocation{{Allocation: api.Allocation{Network: "ov", ContainerID: "old", IfName: "eth0", Bridge: "mesos",
				IPs: []api.IPConfig{{Address: "10.1.1.2/25"}}}, Container: api.ContainerGone},
				{Allocation: api.Allocation{Network: "ov", ContainerID: "docker-0242ac110002", IfName: "eth0", Bridge: "docker",
					IPs: []api.IPConfig{{Address: "10.1.1.130/25"}}, Owner: &api.Owner{Runtime: api.RuntimeDocker,
						ContainerID: "4f1c9e0d2b7a63c8e5f4a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6", ContainerName: "web", EndpointID: "e1", MAC: "02:42:ac:11:00:02"}},
					Container: api.ContainerUnknown}}},
		},
		Status: map[string]*api.AgentIPAMStatus{"h2": {AgentID: "h2", Networks: []api.IPAMNetworkUsage{{Network: "ov",
			Bridges: []api.IPAMBridgeUsage{{Bridge: "mesos", Blocks: []api.IPAMBlockUsage{{Prefix: "10.1.1.0/25"}}}}}}}},
	}
	tests := []struct {
		name, ip, owner string
		holders         int
		out             []string
		err             string
	}{
		{name: "address on another host", ip: "10.1.1.2", holders: 1, out: []string{"h2 (198.18.0.12)", "recorded before owners", "gone"}},
		{name: "address with prefix", ip: "10.1.0.2/25", holders: 1, out: []string{"pod shop/web-0", "h1"}},
		{name: "owner substring", owner: "SHOP", holders: 1, out: []string{"10.1.0.2/25"}},
		{name: "owner of an old record: its container id", owner: "old", holders: 1},
		// Every form a table prints finds its owner.
		{name: "pod as namespace/name", owner: "shop/web-0", holders: 1, out: []string{"10.1.0.2/25"}},
		{name: "pod as printed", owner: "pod shop/web-0", holders: 1, out: []string{"10.1.0.2/25"}},
		{name: "docker container by name", owner: "web", holders: 2},
		{name: "docker container by inspect's name", owner: "/web", holders: 2, out: []string{"docker container web [id 4f1c9e0d2b7a", "10.1.1.130/25"}},
		{name: "docker container by id prefix", owner: "4f1c9e0d2b7a", holders: 1, out: []string{"docker container web"}},
		{name: "docker container as printed", owner: "docker container web", holders: 1},
		{name: "docker address", ip: "10.1.1.130", holders: 1, out: []string{"docker container web [id 4f1c9e0d2b7a, endpoint e1]"}},
		{name: "attachment as ipam check prints it", owner: "h2/docker-0242ac110002/eth0", holders: 1},
		{name: "free address: whose range", ip: "10.1.1.9", out: []string{"no allocation holds 10.1.1.9", "agent h2 (198.18.0.12), overlay ov, mesos bridge's 10.1.1.0/25"}},
		{name: "nobody's", ip: "10.7.0.1", out: []string{"no agent read has it"}},
		{name: "bad ip", ip: "10.1", err: "--ip"},
		{name: "control character", owner: "a\x1bb", err: "--owner: non-printable"},
		{name: "too long", owner: strings.Repeat("x", 300), err: "at most 256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := parseWhoQuery(tt.ip, tt.owner)
			if tt.err != "" {
				if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want a usage error saying %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rep := buildWho(snap, q, "")
			if len(rep.Holders) != tt.holders {
				t.Errorf("%d holders, want %d: %+v", len(rep.Holders), tt.holders, rep.Holders)
			}
			var buf bytes.Buffer
			if err := printWho(&buf, rep); err != nil {
				t.Fatal(err)
			}
			for _, s := range tt.out {
				if !strings.Contains(buf.String(), s) {
					t.Errorf("output does not say %q:\n%s", s, buf.String())
				}
			}
		})
	}
}

// FuzzWhoQuery: --ip and --owner are typed by people and scripts; no input
// panics, and what is accepted is printable and bounded.
func FuzzWhoQuery(f *testing.F) {
	for _, s := range [][2]string{{"10.1.0.2", ""}, {"10.1.0.2/25", "shop"}, {"fd00::1", "web-0"}, {"", "\x00"}, {"::ffff:10.0.0.1", "é"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, ip, owner string) {
		q, err := parseWhoQuery(ip, owner)
		if err != nil {
			if !errors.Is(err, cli.ErrUsage) {
				t.Fatalf("error %v is not a usage error", err)
			}
			return
		}
		if len(q.Owner) > maxOwnerQuery || (ip != "" && !q.IP.IsValid()) {
			t.Fatalf("accepted %q %q as %+v", ip, owner, q)
		}
		_ = q.match("h1", api.Allocation{IPs: []api.IPConfig{{Address: "10.1.0.2/25"}}, Owner: &api.Owner{PodName: "x"}})
	})
}

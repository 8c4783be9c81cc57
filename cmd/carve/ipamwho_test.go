package main

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
				IPs: []api.IPConfig{{Address: "10.1.1.2/25"}}}, Container: api.ContainerGone}}},
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
		_ = q.match(api.Allocation{IPs: []api.IPConfig{{Address: "10.1.0.2/25"}}, Owner: &api.Owner{PodName: "x"}})
	})
}

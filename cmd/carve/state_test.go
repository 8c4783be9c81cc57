package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/opclient"
)

// carve state lists every block of every agent with its origin, donor and
// the usage the agent reported, and the quarantined space.
func TestStateShowsBlocks(t *testing.T) {
	used, free := uint64(5), uint64(58)
	st := &api.State{Index: 9, Agents: []api.AgentInfo{{AgentID: "a1", IP: "198.18.0.1", Version: 8,
		Overlays: []api.AgentOverlay{{Info: api.OverlayNetwork{Name: "carve"}, Subnet: "10.128.0.0/24", State: api.OverlayState{Status: api.StatusOK},
			Blocks: []api.Block{
				{Bridge: api.BridgeMesos, Prefix: "10.128.0.0/25", Origin: api.BlockLeased, Version: 2, Used: &used, Free: &free},
				{Bridge: api.BridgeMesos, Prefix: "10.128.7.64/26", Origin: api.BlockGranted, Donor: "a9", Version: 8},
			}}}}},
		Quarantine: []api.QuarantinedBlock{{Overlay: "carve", Prefix: "10.128.3.0/25", From: "a3", Since: 7}}}
	var out bytes.Buffer
	if err := printStateTable(&out, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"AGENT  OVERLAY  BRIDGE  BLOCK           ORIGIN         USED  FREE",
		"a1     carve    mesos   10.128.0.0/25   lease          5     58",
		"a1     carve    mesos   10.128.7.64/26  grant from a9  -     -",
		"quarantined carve 10.128.3.0/25 of deleted agent a3 (since index 7)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// carve state names the agents the leader has not heard from (issue 20,
// finding 7), beside their FAILED overlays.
func TestStateShowsSilentAgents(t *testing.T) {
	overlay := func(st api.OverlayState) []api.AgentOverlay {
		return []api.AgentOverlay{{Info: api.OverlayNetwork{Name: "carve"}, Subnet: "10.128.0.0/24", State: st}}
	}
	st := &api.State{Index: 9, Agents: []api.AgentInfo{
		{AgentID: "a1", IP: "198.18.0.1", Overlays: overlay(api.OverlayState{Status: api.StatusOK})},
		{AgentID: "a2", IP: "198.18.0.2", Overlays: overlay(api.OverlayState{Status: api.StatusFailed, Error: api.SilentPrefix + "not heard from since 2026-11-27T10:00:00Z"})},
	}}
	var out bytes.Buffer
	if err := printStateTable(&out, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"carve=10.128.0.0/24(FAILED: agent silent: not heard from since 2026-11-27T10:00:00Z)", "agents not heard from (the leader's view): a2\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestVersionColumnsSayWhatTheyAre (issue 27): the two tables that had a
// VERSION column, one a record's Raft index and one a carve build, name
// them RECORD and CARVE: carve state shows both per agent, carve cluster
// status the masters' builds.
func TestVersionColumnsSayWhatTheyAre(t *testing.T) {
	st := &api.State{Index: 9, Agents: []api.AgentInfo{
		{AgentID: "a1", IP: "198.18.0.1", Version: 8, CarveVersion: "v0.4.0-3-gabcdef1"},
		{AgentID: "a2", IP: "198.18.0.2", Version: 7}, // registered before agents sent their version
	}}
	var out bytes.Buffer
	if err := printStateTable(&out, st); err != nil {
		t.Fatal(err)
	}
	rep := &clusterReport{Masters: []opclient.MasterView{{URL: "https://m1", Status: &api.ClusterStatus{ID: "m1", Role: "leader",
		Build: &api.BuildInfo{Version: "v0.4.0"}}}, {URL: "https://m2"}}}
	var cluster bytes.Buffer
	if err := printClusterReport(&cluster, rep); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		table string
		out   string
		lines []string // whole lines, the header first
	}{
		{"carve state", out.String(), []string{
			"AGENT  IP          SUBNETS  VTEP IP  VTEP MAC  RECORD  CARVE",
			"a1     198.18.0.1  -        -        -         8       v0.4.0-3-gabcdef1",
			"a2     198.18.0.2  -        -        -         7       -",
		}},
		{"carve cluster status", cluster.String(), []string{
			"MASTER  URL         ROLE         LEADER  TERM  COMMIT  APPLIED  LAST  SNAPSHOT  CAUGHT UP  SERVERS  CARVE",
			"m1      https://m1  leader       -       0     0       0        0     0         false               v0.4.0",
			"?       https://m2  unreachable  -       -     -       -        -     -         -          -        -",
		}},
	}
	for _, tt := range tests {
		got := strings.Split(tt.out, "\n")
		for _, want := range tt.lines {
			if !slices.Contains(got, want) {
				t.Errorf("%s lacks the line %q:\n%s", tt.table, want, tt.out)
			}
		}
		if strings.Contains(tt.out, "VERSION") {
			t.Errorf("%s still has a VERSION column:\n%s", tt.table, tt.out)
		}
	}
}

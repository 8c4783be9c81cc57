package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// tableHarness applies commands to a LeaseTable with increasing Raft indexes,
// as the log would.
type tableHarness struct {
	t     *testing.T
	table *LeaseTable
	index uint64
}

func newHarness(t *testing.T, cfg api.NetworkConfig) *tableHarness {
	t.Helper()
	h := &tableHarness{t: t, table: NewLeaseTable()}
	if res := h.apply(command{Op: opSetConfig, SetConfig: &cfg}); res.Err != nil {
		t.Fatalf("set config: %v", res.Err)
	}
	return h
}

func (h *tableHarness) apply(c command) Result {
	h.t.Helper()
	data, err := encodeCommand(c)
	if err != nil {
		h.t.Fatal(err)
	}
	h.index++
	return h.table.Apply(h.index, data).(Result)
}

func (h *tableHarness) register(id, ip string, mesos, docker bool) Result {
	h.t.Helper()
	return h.apply(command{Op: opRegister, Register: &registerCmd{AgentID: id, IP: ip, Hostname: id + ".example",
		Bridges: api.AgentNetworkConfig{MesosBridge: mesos, DockerBridge: docker}}})
}

func (h *tableHarness) mustRegister(id, ip string) *api.AgentInfo {
	h.t.Helper()
	res := h.register(id, ip, true, true)
	if res.Err != nil {
		h.t.Fatalf("register %s: %v", id, res.Err)
	}
	return res.Agent
}

// releaseAll lifts the quarantine as if every live agent had acknowledged
// its holdings at the current index.
func (h *tableHarness) releaseAll() Result {
	h.t.Helper()
	acks := map[string]holdingsAck{}
	for id, rec := range h.table.agents {
		acks[id] = holdingsAck{Created: rec.Created, Index: h.index}
	}
	return h.apply(command{Op: opRelease, Release: &releaseCmd{Acks: acks}})
}

func cfgWith(overlays ...api.OverlayNetwork) api.NetworkConfig {
	c := DefaultConfig()
	c.Overlays = overlays
	return c
}

func boolp(b bool) *bool { return &b }

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func overlaySubnet(t *testing.T, a *api.AgentInfo, name string) string {
	t.Helper()
	ov := a.Overlay(name)
	if ov == nil {
		t.Fatalf("agent %s has no overlay %q: %+v", a.AgentID, name, a.Overlays)
	}
	return ov.Subnet
}

func TestAllocationRules(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	a := h.mustRegister("a1", "198.18.0.11")
	b := h.mustRegister("a2", "198.18.0.12")

	tests := []struct {
		name, got, want string
	}{
		{"first agent subnet is the lowest /24", overlaySubnet(t, a, "carve"), "10.128.0.0/24"},
		{"second agent subnet is the next", overlaySubnet(t, b, "carve"), "10.128.1.0/24"},
		{"mesos bridge is the first half", a.Overlay("carve").MesosBridge.IP, "10.128.0.0/25"},
		{"mesos bridge name", a.Overlay("carve").MesosBridge.Name, "m-carve"},
		{"docker bridge is the second half", a.Overlay("carve").DockerBridge.IP, "10.128.0.128/25"},
		{"docker bridge name", a.Overlay("carve").DockerBridge.Name, "d-carve"},
		{"first VTEP IP with the subnet's prefix", a.Overlay("carve").Backend.VXLAN.VTEPIP, "100.64.0.1/16"},
		{"second VTEP IP", b.Overlay("carve").Backend.VXLAN.VTEPIP, "100.64.0.2/16"},
		{"MAC derived from the VTEP IP", a.Overlay("carve").Backend.VXLAN.VTEPMAC, "70:b3:d5:40:00:01"},
		{"second MAC", b.Overlay("carve").Backend.VXLAN.VTEPMAC, "70:b3:d5:40:00:02"},
		{"configuring until the agent reports", a.Overlay("carve").State.Status, api.StatusConfiguring},
		{"enabled written", mustJSON(t, a.Overlay("carve").Info), `{"name":"carve","subnet":"10.128.0.0/9","prefix":24,"enabled":true}`},
		{"vtep name", a.Overlay("carve").Backend.VXLAN.VTEPName, "vtep1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
	// vtep_mtu is written only when configured (as DC/OS does): absent,
	// every agent follows the smallest underlay.
	if v := a.Overlay("carve").Backend.VXLAN; v.VNI != 1024 || v.VTEPPort != 4789 || v.VTEPMTU != 0 {
		t.Errorf("vxlan backend = %+v", v)
	}
}

func TestBridgesOnlyWhenAsked(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	tests := []struct {
		id            string
		mesos, docker bool
	}{
		{"none", false, false}, {"mesos", true, false}, {"docker", false, true}, {"both", true, true},
	}
	for i, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			res := h.register(tt.id, fmt.Sprintf("198.18.1.%d", i+1), tt.mesos, tt.docker)
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			ov := res.Agent.Overlay("carve")
			if (ov.MesosBridge != nil) != tt.mesos || (ov.DockerBridge != nil) != tt.docker {
				t.Errorf("bridges mesos=%v docker=%v, want %v %v", ov.MesosBridge, ov.DockerBridge, tt.mesos, tt.docker)
			}
			if ov.Subnet == "" {
				t.Error("a master-only agent still gets its subnet")
			}
		})
	}
}

func TestSameAgentSameLeases(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	first := h.mustRegister("a1", "198.18.0.11")
	stateIdx := h.table.Index()
	again := h.mustRegister("a1", "198.18.0.11")
	if !jsonEqual(first, again) {
		t.Fatalf("re-registration changed the record:\n%+v\n%+v", first, again)
	}
	if h.table.Index() != stateIdx {
		t.Errorf("state index moved from %d to %d on an unchanged registration", stateIdx, h.table.Index())
	}
	if info, changes := h.table.WouldChange(api.RegisterRequest{AgentID: "a1", IP: "198.18.0.11", Hostname: "a1.example",
		NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: true}}); changes || info == nil {
		t.Errorf("WouldChange = %v, want false with the record", changes)
	}
	// The IP is an attribute: a new IP updates the record, not the leases.
	moved := h.mustRegister("a1", "198.18.0.99")
	if moved.IP != "198.18.0.99" || moved.Version <= first.Version {
		t.Errorf("moved = ip %s version %d, want new ip and a higher version than %d", moved.IP, moved.Version, first.Version)
	}
	if overlaySubnet(t, moved, "carve") != overlaySubnet(t, first, "carve") ||
		moved.Overlay("carve").Backend.VXLAN.VTEPIP != first.Overlay("carve").Backend.VXLAN.VTEPIP {
		t.Errorf("an IP change moved the leases")
	}
}

func TestIPTakeover(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	old := h.mustRegister("old", "198.18.0.11")
	newer := h.mustRegister("new", "198.18.0.11")
	if newer.IP != "198.18.0.11" {
		t.Fatalf("newest registration did not take the IP: %q", newer.IP)
	}
	rec, _ := h.table.Agent("old")
	if rec.IP != api.NoIP || rec.HasIP() {
		t.Errorf("older record holds the IP %q, want %s (DC/OS requires an ip)", rec.IP, api.NoIP)
	}
	if overlaySubnet(t, rec, "carve") != overlaySubnet(t, old, "carve") {
		t.Errorf("older record lost its leases")
	}
	if rec.Version <= old.Version {
		t.Errorf("older record's version did not move: %d", rec.Version)
	}
	// Deleting by IP now names the new holder.
	res := h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"198.18.0.11"}}})
	if len(res.Deleted) != 1 || res.Deleted[0] != "new" {
		t.Errorf("delete by IP deleted %v, want [new]", res.Deleted)
	}
	// The old one registers again and gets its IP back with the same leases.
	back := h.mustRegister("old", "198.18.0.11")
	if overlaySubnet(t, back, "carve") != overlaySubnet(t, old, "carve") {
		t.Errorf("re-registration changed leases")
	}
}

func TestVTEPExhaustion(t *testing.T) {
	cfg := DefaultConfig()
	cfg.VTEPSubnet = "100.64.0.0/30" // two hosts: .1 and .2
	h := newHarness(t, cfg)
	h.mustRegister("a1", "198.18.0.1")
	h.mustRegister("a2", "198.18.0.2")
	idx := h.table.Index()
	res := h.register("a3", "198.18.0.3", true, true)
	if !errors.Is(res.Err, ErrVTEPExhausted) {
		t.Fatalf("third agent: err %v, want ErrVTEPExhausted", res.Err)
	}
	if _, ok := h.table.Agent("a3"); ok || h.table.Index() != idx {
		t.Errorf("a failed registration changed the state")
	}
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a1"}}})
	a3 := h.mustRegister("a3", "198.18.0.3")
	if got := a3.Overlays[0].Backend.VXLAN.VTEPIP; got != "100.64.0.1/30" {
		t.Errorf("freed VTEP IP not reused first fit: %s", got)
	}
}

func TestOverlayExhaustionLeavesOthers(t *testing.T) {
	h := newHarness(t, cfgWith(
		api.OverlayNetwork{Name: "small", Subnet: "10.1.0.0/29", Prefix: 30}, // two /30s
		api.OverlayNetwork{Name: "big", Subnet: "10.2.0.0/16", Prefix: 24},
	))
	h.mustRegister("a1", "198.18.0.1")
	h.mustRegister("a2", "198.18.0.2")
	a3 := h.mustRegister("a3", "198.18.0.3")
	small, big := a3.Overlay("small"), a3.Overlay("big")
	if small != nil || len(a3.NotLeased) != 1 || a3.NotLeased[0].Name != "small" || !strings.HasPrefix(a3.NotLeased[0].Reason, "exhausted") {
		t.Fatalf("exhausted overlay should be left out of the record and named in not_leased: %+v, %+v", small, a3.NotLeased)
	}
	if big == nil || big.Subnet != "10.2.2.0/24" || big.Backend == nil {
		t.Fatalf("the other overlay should still be leased: %+v", big)
	}
	// Space freed (once the live agents acknowledged their holdings): the
	// next registration of a3 picks it up.
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a1"}}})
	h.releaseAll()
	a3 = h.mustRegister("a3", "198.18.0.3")
	if got := a3.Overlay("small"); got == nil || got.Subnet != "10.1.0.0/30" || len(a3.NotLeased) != 0 {
		t.Errorf("after a delete a3 should get the freed /30: %+v, not leased %+v", got, a3.NotLeased)
	}
}

func TestDeleteFreesAndTombstones(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	h.mustRegister("a1", "198.18.0.1")
	h.mustRegister("a2", "198.18.0.2")
	h.mustRegister("a3", "198.18.0.3")
	res := h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a2"}}})
	delIndex := h.index
	if len(res.Deleted) != 1 {
		t.Fatalf("deleted %v", res.Deleted)
	}
	if v, ok := h.table.Tombstone("a2"); !ok || v != delIndex {
		t.Errorf("tombstone = %d %v, want index %d", v, ok, delIndex)
	}
	st := h.table.State()
	if len(st.Tombstones) != 1 || st.Tombstones[0].Version != delIndex || st.Index != delIndex {
		t.Errorf("state tombstones %+v index %d", st.Tombstones, st.Index)
	}
	// Other agents are live, so a2's overlay space is quarantined (one of
	// them might hold a grant from a2 the masters have not heard of); its
	// VTEP IP is free at once.
	if len(st.Quarantine) != 2 || st.Quarantine[0].Prefix != "10.128.1.0/25" || st.Quarantine[1].Prefix != "10.128.1.128/25" ||
		st.Quarantine[0].From != "a2" || st.Quarantine[0].Since != delIndex {
		t.Errorf("quarantine after deleting a2: %+v", st.Quarantine)
	}
	a4 := h.mustRegister("a4", "198.18.0.4")
	if overlaySubnet(t, a4, "carve") != "10.128.3.0/24" || a4.Overlays[0].Backend.VXLAN.VTEPIP != "100.64.0.2/16" {
		t.Errorf("a4 got %s %s, want the next free subnet and the freed VTEP IP", overlaySubnet(t, a4, "carve"), a4.Overlays[0].Backend.VXLAN.VTEPIP)
	}
	// Once every live agent acknowledged its holdings past the deletion,
	// the space is leased again, first fit.
	acks := map[string]holdingsAck{}
	for _, id := range []string{"a1", "a3", "a4"} {
		rec := h.table.agents[id]
		acks[id] = holdingsAck{Created: rec.Created, Index: delIndex}
	}
	if res := h.apply(command{Op: opRelease, Release: &releaseCmd{Acks: acks}}); res.Released != 2 {
		t.Errorf("release freed %d blocks, want 2", res.Released)
	}
	a5 := h.mustRegister("a5", "198.18.0.5")
	if overlaySubnet(t, a5, "carve") != "10.128.1.0/24" {
		t.Errorf("freed leases not reused first fit: %s", overlaySubnet(t, a5, "carve"))
	}
	// Strict delete of an unknown agent fails; of a deleted one succeeds (idempotent).
	if res := h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"nobody"}, Strict: true}}); !errors.Is(res.Err, ErrUnknownAgent) {
		t.Errorf("strict delete of unknown: %v", res.Err)
	}
	if res := h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a2"}, Strict: true}}); res.Err != nil {
		t.Errorf("strict delete of an already deleted agent: %v", res.Err)
	}
	// The deleted agent may come back; its record's version exceeds the tombstone.
	back := h.mustRegister("a2", "198.18.0.2")
	if back.Version <= delIndex {
		t.Errorf("returning agent version %d not above tombstone %d", back.Version, delIndex)
	}
	if _, ok := h.table.Tombstone("a2"); ok {
		t.Errorf("tombstone kept after re-registration")
	}
}

func TestDisabledAndAddedOverlays(t *testing.T) {
	one := api.OverlayNetwork{Name: "one", Subnet: "10.1.0.0/16", Prefix: 24}
	two := api.OverlayNetwork{Name: "two", Subnet: "10.2.0.0/16", Prefix: 24}
	h := newHarness(t, cfgWith(one))
	h.mustRegister("a1", "198.18.0.1")

	// Adding an overlay gives existing agents their share at once.
	h.apply(command{Op: opSetConfig, SetConfig: ptr(cfgWith(one, two))})
	a1, _ := h.table.Agent("a1")
	if overlaySubnet(t, a1, "two") != "10.2.0.0/24" {
		t.Fatalf("existing agent did not get the added overlay")
	}
	// Disabling keeps the leases, rendered "enabled": false so that the
	// agent drains the overlay (issue 20, finding 4); new agents get none,
	// and are told why.
	twoOff := two
	twoOff.Enabled = boolp(false)
	h.apply(command{Op: opSetConfig, SetConfig: ptr(cfgWith(one, twoOff))})
	a1, _ = h.table.Agent("a1")
	if ov := a1.Overlay("two"); ov == nil || ov.Info.IsEnabled() || ov.Subnet != "10.2.0.0/24" || len(a1.NotLeased) != 0 {
		t.Fatalf("disabled overlay: %+v, not leased %+v (want it kept with its lease, enabled: false)", ov, a1.NotLeased)
	}
	a2 := h.mustRegister("a2", "198.18.0.2")
	if a2.Overlay("two") != nil || len(a2.NotLeased) != 1 || a2.NotLeased[0].Name != "two" {
		t.Errorf("new agent: %+v, not leased %+v (want no lease in a disabled overlay, named)", a2.Overlay("two"), a2.NotLeased)
	}
	// A config that drops "two" keeps its leases, disabled; never an error.
	res := h.apply(command{Op: opSetConfig, SetConfig: ptr(cfgWith(one))})
	if res.Err != nil || len(res.Warnings) == 0 {
		t.Fatalf("dropping a leased overlay: err %v warnings %v", res.Err, res.Warnings)
	}
	netCfg, _ := h.table.Network()
	if len(netCfg.Overlays) != 2 || netCfg.Overlays[1].Name != "two" || netCfg.Overlays[1].IsEnabled() {
		t.Fatalf("dropped overlay should be kept disabled: %+v", netCfg.Overlays)
	}
	// A new overlay overlapping a kept one is left out, with a warning.
	clash := api.OverlayNetwork{Name: "three", Subnet: "10.2.0.0/16", Prefix: 24}
	res = h.apply(command{Op: opSetConfig, SetConfig: ptr(cfgWith(one, clash))})
	if res.Err != nil || len(res.Warnings) < 2 {
		t.Fatalf("clash: err %v warnings %v", res.Err, res.Warnings)
	}
	netCfg, _ = h.table.Network()
	for _, o := range netCfg.Overlays {
		if o.Name == "three" {
			t.Errorf("overlapping overlay accepted: %+v", netCfg.Overlays)
		}
	}
	// Changing a leased overlay's subnet is refused (kept), with a warning.
	moved := one
	moved.Subnet = "10.9.0.0/16"
	res = h.apply(command{Op: opSetConfig, SetConfig: ptr(cfgWith(moved))})
	netCfg, _ = h.table.Network()
	if netCfg.Overlays[0].Subnet != "10.1.0.0/16" || len(res.Warnings) == 0 {
		t.Errorf("leased overlay subnet changed: %+v, warnings %v", netCfg.Overlays[0], res.Warnings)
	}
}

func ptr[T any](v T) *T { return &v }

func TestIPv6Overlay(t *testing.T) {
	h := newHarness(t, cfgWith(api.OverlayNetwork{Name: "dual", Subnet: "10.1.0.0/16", Prefix: 24,
		Subnet6: "fd00:1::/48", Prefix6: 64}))
	a := h.mustRegister("a1", "198.18.0.1")
	b := h.mustRegister("a2", "198.18.0.2")
	tests := []struct{ name, got, want string }{
		{"first subnet6", a.Overlay("dual").Subnet6, "fd00:1::/64"},
		{"second subnet6", b.Overlay("dual").Subnet6, "fd00:1:0:1::/64"},
		{"mesos ip6 half", a.Overlay("dual").MesosBridge.IP6, "fd00:1::/65"},
		{"docker ip6 half", a.Overlay("dual").DockerBridge.IP6, "fd00:1:0:0:8000::/65"},
		{"v4 alongside", b.Overlay("dual").Subnet, "10.1.1.0/24"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
	// IPv6 only overlay.
	h2 := newHarness(t, cfgWith(api.OverlayNetwork{Name: "six", Subnet6: "fd00:2::/120", Prefix6: 126}))
	for i := range 64 {
		h2.mustRegister(fmt.Sprintf("b%d", i), fmt.Sprintf("198.18.2.%d", i+1))
	}
	last, _ := h2.table.Agent("b63")
	if got := last.Overlay("six").Subnet6; got != "fd00:2::fc/126" {
		t.Errorf("64th /126 = %s", got)
	}
	over := h2.mustRegister("b64", "198.18.3.1")
	if over.Overlay("six") != nil || len(over.NotLeased) != 1 {
		t.Errorf("65th /126 should be exhausted: %+v, not leased %+v", over.Overlay("six"), over.NotLeased)
	}
}

func TestRequestIDDedup(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	cmd := command{Op: opRegister, RequestID: "req-1", Register: &registerCmd{AgentID: "a1", IP: "198.18.0.1"}}
	first := h.apply(cmd)
	idx := h.table.Index()
	// The same request applied again (a retry after an unknown outcome, now
	// committed twice) has no second effect even though a1 changed meanwhile,
	// and is answered with its own outcome.
	h.apply(command{Op: opRegister, Register: &registerCmd{AgentID: "a1", IP: "198.18.0.2"}})
	idx2 := h.table.Index()
	again := h.apply(cmd)
	if again.Err != nil || again.Agent.IP != "198.18.0.1" || h.table.Index() != idx2 || idx2 == idx {
		t.Errorf("duplicate request changed the state or was answered another outcome: %+v (index %d -> %d)", again.Agent, idx2, h.table.Index())
	}
	if cur, _ := h.table.Agent("a1"); cur.IP != "198.18.0.2" {
		t.Errorf("the duplicate undid the later registration: %+v", cur)
	}
	if first.Agent.Overlays[0].Subnet != again.Agent.Overlays[0].Subnet {
		t.Errorf("leases differ")
	}
}

func TestRegisterBeforeConfig(t *testing.T) {
	tbl := NewLeaseTable()
	data, _ := encodeCommand(command{Op: opRegister, Register: &registerCmd{AgentID: "a", IP: "198.18.0.1"}})
	if res := tbl.Apply(1, data).(Result); !errors.Is(res.Err, ErrNoConfig) {
		t.Errorf("register without config: %v", res.Err)
	}
	if res := tbl.Apply(2, []byte("{not json")).(Result); !errors.Is(res.Err, ErrBadCommand) {
		t.Errorf("garbage command: %v", res.Err)
	}
}

func TestSnapshotRestoreIdentical(t *testing.T) {
	h := newHarness(t, cfgWith(
		api.OverlayNetwork{Name: "a", Subnet: "10.1.0.0/16", Prefix: 24, Subnet6: "fd00::/48", Prefix6: 64},
		api.OverlayNetwork{Name: "b", Subnet: "10.2.0.0/29", Prefix: 30},
	))
	for i := range 20 {
		h.apply(command{Op: opRegister, RequestID: fmt.Sprintf("r%d", i), Register: &registerCmd{AgentID: fmt.Sprintf("n%02d", i),
			IP: fmt.Sprintf("198.18.0.%d", i+1), Bridges: api.AgentNetworkConfig{MesosBridge: i%2 == 0}}})
	}
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"n03", "n07"}}})
	h.apply(command{Op: opServerMeta, ServerMeta: &ServerMeta{ID: "m1", RaftAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:2"}})

	restored := restoreCopy(t, h)
	want, _, _ := h.table.StateJSON("m1")
	got, _, _ := restored.StateJSON("m1")
	if !bytes.Equal(want, got) {
		t.Fatalf("restored state differs:\n%s\n%s", want, got)
	}
	// The restored table allocates exactly as the original would.
	h2 := &tableHarness{t: t, table: restored, index: h.index}
	var retried []Result
	for _, hh := range []*tableHarness{h, h2} {
		hh.mustRegister("late", "198.18.9.9")
		// duplicates are still recognised after restore
		retried = append(retried, hh.apply(command{Op: opRegister, RequestID: "r5", Register: &registerCmd{AgentID: "n05", IP: "198.18.0.6"}}))
	}
	if retried[0].Err != nil || !jsonEqual(retried[0], retried[1]) {
		t.Errorf("a retry answered differently after restore:\n%+v\n%+v", retried[0], retried[1])
	}
	want, _, _ = h.table.StateJSON("m1")
	got, _, _ = restored.StateJSON("m1")
	if !bytes.Equal(want, got) {
		t.Fatalf("after restore, the same commands gave different states:\n%s\n%s", want, got)
	}
	if s, ok := restored.Server("m1"); !ok || s.HTTPAddr != "127.0.0.1:2" {
		t.Errorf("server meta lost: %+v", s)
	}
}

func TestStateJSONMatchesState(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	h.mustRegister("a1", "198.18.0.1")
	h.mustRegister("a2", "198.18.0.2")
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"a1"}}})
	data, idx, err := h.table.StateJSON("m2")
	if err != nil {
		t.Fatal(err)
	}
	var fromJSON api.State
	if err := json.Unmarshal(data, &fromJSON); err != nil {
		t.Fatalf("state JSON does not decode: %v\n%s", err, data)
	}
	want := h.table.State()
	want.Leader = "m2"
	if !jsonEqual(fromJSON, want) || idx != want.Index {
		t.Errorf("StateJSON and State disagree:\n%s\n%+v", data, want)
	}
	// An empty table renders a decodable state too.
	empty, _, _ := NewLeaseTable().StateJSON("")
	if err := json.Unmarshal(empty, &fromJSON); err != nil {
		t.Errorf("empty state: %v: %s", err, empty)
	}
}

func jsonEqual(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// The first cluster id committed stays: a second proposal (from a leader
// that had not applied the first) changes nothing, and snapshots keep it.
func TestClusterIDFirstWins(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	if id := h.table.ClusterID(); id != "" {
		t.Fatalf("new table has cluster id %q", id)
	}
	if res := h.apply(command{Op: opSetClusterID, ClusterID: "first"}); res.Err != nil {
		t.Fatal(res.Err)
	}
	idx := h.table.Index()
	if res := h.apply(command{Op: opSetClusterID, ClusterID: "second"}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if id := h.table.ClusterID(); id != "first" || h.table.Index() != idx {
		t.Errorf("cluster id %q at index %d, want %q unchanged at %d", id, h.table.Index(), "first", idx)
	}
	if res := h.apply(command{Op: opSetClusterID}); !errors.Is(res.Err, ErrBadCommand) {
		t.Errorf("empty cluster id: %v", res.Err)
	}
	var st api.State
	data, _, _ := h.table.StateJSON("")
	if err := json.Unmarshal(data, &st); err != nil || st.ClusterID != "first" || h.table.State().ClusterID != "first" {
		t.Errorf("state shows cluster id %q (%v): %s", st.ClusterID, err, data)
	}
	if id := restoreCopy(t, h).ClusterID(); id != "first" {
		t.Errorf("restored cluster id %q", id)
	}
}

// A snapshot written before outcomes and cluster ids were kept (format 1)
// still restores; its request ids still stop a second effect.
func TestRestoreFormat1Snapshot(t *testing.T) {
	legacy := `{"format":1,"index":3,"state_index":2,
		"network":{"vtep_subnet":"100.64.0.0/16","vtep_mac_oui":"70:B3:D5:00:00:00","vtep_name":"vtep1024","vni":1024,"vtep_port":4789,"vtep_mtu":1450,"overlay_mtu":1420,"overlays":[{"name":"carve","subnet":"10.128.0.0/9","prefix":24}]},
		"agents":[{"id":"a1","ip":"198.18.0.1","bridges":{"mesos_bridge":false,"docker_bridge":false},"vtep":"100.64.0.1","leases":{"carve":{"subnet":"10.128.0.0/24"}},"version":2}],
		"tombstones":{},"servers":{},"requests":[{"id":"r1","index":2}]}`
	tbl := NewLeaseTable()
	if err := tbl.Restore(3, strings.NewReader(legacy)); err != nil {
		t.Fatal(err)
	}
	h := &tableHarness{t: t, table: tbl, index: 3}
	res := h.apply(command{Op: opRegister, RequestID: "r1", Register: &registerCmd{AgentID: "a1", IP: "198.18.0.1"}})
	if res.Err != nil || res.Agent.Overlay("carve").Subnet != "10.128.0.0/24" || tbl.Index() != 2 {
		t.Errorf("retry after a format 1 restore: %+v %v (index %d)", res.Agent, res.Err, tbl.Index())
	}
	if id := tbl.ClusterID(); id != "" {
		t.Errorf("format 1 snapshot gave cluster id %q", id)
	}
}

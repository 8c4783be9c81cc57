package state

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/usage"
)

func growCfg() api.NetworkConfig {
	return cfgWith(api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/22", Prefix: 24, Subnet6: "fd09::/62", Prefix6: 64})
}

func blocksOf(t *testing.T, h *tableHarness, id string) []string {
	t.Helper()
	a, ok := h.table.Agent(id)
	if !ok {
		t.Fatalf("no agent %s", id)
	}
	var out []string
	for _, b := range a.Overlay("g").Blocks {
		s := b.Bridge + " " + b.Prefix + " " + b.Origin
		if b.Donor != "" {
			s += " from " + b.Donor
		}
		out = append(out, s)
	}
	return out
}

func TestGrowGrantReturn(t *testing.T) {
	h := newHarness(t, growCfg())
	h.mustRegister("a1", "198.18.0.1")
	h.mustRegister("a2", "198.18.0.2")
	h.mustRegister("a3", "198.18.0.3")
	grow := func(id, fam string) Result {
		return h.apply(command{Op: opGrow, Grow: &growCmd{AgentID: id, Overlay: "g", Bridge: api.BridgeMesos, Family: map[string]int{"4": 4, "6": 6}[fam]}})
	}
	if res := grow("a1", "4"); res.Err != nil || res.Agent.Version != h.index {
		t.Fatalf("grow: %+v", res)
	}
	if got := blocksOf(t, h, "a1"); !slices.Equal(got, []string{
		"docker 10.9.0.128/25 lease", "docker fd09::8000:0:0:0/65 lease",
		"mesos 10.9.0.0/25 lease", "mesos 10.9.3.0/25 grow", "mesos fd09::/65 lease",
	}) {
		t.Errorf("a1 after a grow: %q", got)
	}
	if res := grow("a1", "6"); res.Err != nil || !slices.Contains(blocksOf(t, h, "a1"), "mesos fd09:0:0:3::/65 grow") {
		t.Errorf("grow v6: %v %q", res.Err, blocksOf(t, h, "a1"))
	}
	// a2 gets a ring grant from a1's first lease.
	grant := func(p, donor, recip string) Result {
		return h.apply(command{Op: opGrant, Grant: &grantCmd{Overlay: "g", Prefix: netip.MustParsePrefix(p), Donor: donor, Recipient: recip}})
	}
	res := grant("10.9.0.32/27", "a1", "a2")
	if res.Err != nil || res.Agent.AgentID != "a2" {
		t.Fatalf("grant: %+v", res)
	}
	a1, a2 := blocksOf(t, h, "a1"), blocksOf(t, h, "a2")
	for _, want := range []string{"mesos 10.9.0.0/27 lease", "mesos 10.9.0.64/26 lease"} {
		if !slices.Contains(a1, want) {
			t.Errorf("donor's blocks %q lack %q", a1, want)
		}
	}
	if !slices.Contains(a2, "mesos 10.9.0.32/27 grant from a1") {
		t.Errorf("recipient's blocks %q", a2)
	}
	if ov := h.table.agents["a1"]; ov.Leases["g"].Subnet.String() != "10.9.0.0/24" {
		t.Errorf("the donor's DC/OS subnet changed: %v", ov.Leases["g"].Subnet)
	}
	// Idempotent.
	before := h.table.agents["a2"].Version
	if res := grant("10.9.0.32/27", "a1", "a2"); res.Err != nil || h.table.agents["a2"].Version != before {
		t.Errorf("repeated grant: %v, version %d -> %d", res.Err, before, h.table.agents["a2"].Version)
	}
	// Refusals name both sides.
	for _, tt := range []struct {
		name, prefix, donor, recip string
		want                       error
		msg                        string
	}{
		{"another agent's", "10.9.2.0/27", "a1", "a2", ErrBlockConflict, `10.9.2.0/25 of agent "a3"`},
		{"free space", "10.9.3.128/27", "a1", "a2", ErrBlockConflict, "not inside the donor's holdings"},
		{"unknown donor", "10.9.0.0/27", "zz", "a2", ErrUnknownAgent, "zz"},
		{"outside", "10.10.0.0/27", "a1", "a2", ErrInvalidBlock, "not inside overlay"},
	} {
		res := grant(tt.prefix, tt.donor, tt.recip)
		if !errors.Is(res.Err, tt.want) || !strings.Contains(res.Err.Error(), tt.msg) {
			t.Errorf("%s: %v", tt.name, res.Err)
		}
	}
	// The first lease cannot be returned; the grant goes back to its donor
	// and the donor's lease block is whole again.
	ret := func(id, p string) Result {
		return h.apply(command{Op: opReturn, Return: &returnCmd{AgentID: id, Overlay: "g", Prefix: netip.MustParsePrefix(p)}})
	}
	if res := ret("a2", "10.9.1.0/25"); !errors.Is(res.Err, ErrInvalidBlock) {
		t.Errorf("return of a first lease: %v", res.Err)
	}
	if res := ret("a2", "10.9.0.32/27"); res.Err != nil {
		t.Fatalf("return of the grant: %v", res.Err)
	}
	if a1 := blocksOf(t, h, "a1"); !slices.Contains(a1, "mesos 10.9.0.0/25 lease") {
		t.Errorf("the donor's lease block is not whole again: %q", a1)
	}
	if res := ret("a2", "10.9.0.32/27"); !errors.Is(res.Err, ErrBlockConflict) {
		t.Errorf("second return: %v", res.Err)
	}
	// A grown block goes to the free space.
	if res := ret("a1", "10.9.3.0/25"); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res := grow("a2", "4"); res.Err != nil || !slices.Contains(blocksOf(t, h, "a2"), "mesos 10.9.3.0/25 grow") {
		t.Errorf("the returned block is not leased again first fit: %q", blocksOf(t, h, "a2"))
	}
	// Exhaustion.
	if res := grow("a2", "4"); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res := grow("a2", "4"); !errors.Is(res.Err, ErrOverlayExhausted) {
		t.Errorf("grow in a full overlay: %v", res.Err)
	}
	checkTable(t, h.table)
}

// A donor grants while no master is reachable and is deleted before the
// grant is reported: its space is quarantined, the late report moves the
// granted block to the recipient, and no agent registered meanwhile gets
// any of it.
func TestGrantFromDeletedDonor(t *testing.T) {
	h := newHarness(t, growCfg())
	h.mustRegister("d", "198.18.0.1")
	h.mustRegister("r", "198.18.0.2")
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"d"}}})
	delIndex := h.index
	n := h.mustRegister("n", "198.18.0.3")
	if s := n.Overlay("g").Subnet; s == "10.9.0.0/24" {
		t.Fatalf("the deleted donor's subnet was leased while quarantined: %s", s)
	}
	res := h.apply(command{Op: opGrant, Grant: &grantCmd{Overlay: "g", Prefix: netip.MustParsePrefix("10.9.0.64/26"), Donor: "d", Recipient: "r"}})
	if res.Err != nil {
		t.Fatalf("late grant report: %v", res.Err)
	}
	// Releasing needs every live agent; an acknowledgement of an older
	// index or of another record of the id holds it back.
	acks := map[string]holdingsAck{"r": {Created: h.table.agents["r"].Created, Index: delIndex}}
	if res := h.apply(command{Op: opRelease, Release: &releaseCmd{Acks: acks}}); res.Released != 0 {
		t.Errorf("released %d without n's acknowledgement", res.Released)
	}
	acks["n"] = holdingsAck{Created: h.table.agents["n"].Created + 1, Index: delIndex}
	if res := h.apply(command{Op: opRelease, Release: &releaseCmd{Acks: acks}}); res.Released != 0 {
		t.Errorf("released %d with an acknowledgement of another record", res.Released)
	}
	acks["n"] = holdingsAck{Created: h.table.agents["n"].Created, Index: delIndex - 1}
	if res := h.apply(command{Op: opRelease, Release: &releaseCmd{Acks: acks}}); res.Released != 0 {
		t.Errorf("released %d with an acknowledgement from before the deletion", res.Released)
	}
	if res := h.releaseAll(); res.Released == 0 {
		t.Error("nothing released with every acknowledgement")
	}
	checkTable(t, h.table)
	for i, want := range []string{"10.9.3.0/24", ""} {
		a := h.mustRegister(fmt.Sprint("x", i), netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)}).String())
		if s := a.Overlay("g").Subnet; s != want {
			t.Errorf("agent %s leased %q, want %q (the deleted donor's subnet holds r's grant: not a whole free slice)", a.AgentID, s, want)
		}
	}
	// What is left of d's subnet is leased in pieces by grows.
	res = h.apply(command{Op: opGrow, Grow: &growCmd{AgentID: "r", Overlay: "g", Bridge: api.BridgeDocker, Family: 4}})
	if res.Err != nil || !slices.Contains(blocksOf(t, h, "r"), "docker 10.9.0.128/25 grow") {
		t.Fatalf("grow into the rest of d's space: %v %q", res.Err, blocksOf(t, h, "r"))
	}
	checkTable(t, h.table)
}

// A snapshot written before blocks were kept (format 2) still restores:
// every record gets the lease blocks of its subnets, which the allocator
// holds, so nothing of them is leased again.
func TestRestoreFormat2SnapshotGetsLeaseBlocks(t *testing.T) {
	legacy := `{"format":2,"index":5,"state_index":4,"cluster_id":"c1",
		"network":{"vtep_subnet":"100.64.0.0/16","vtep_mac_oui":"70:B3:D5:00:00:00","vtep_name":"vtep1024","vni":1024,"vtep_port":4789,"vtep_mtu":1450,"overlay_mtu":1420,"overlays":[{"name":"g","subnet":"10.9.0.0/23","prefix":24,"subnet6":"fd09::/63","prefix6":64}]},
		"agents":[{"id":"a1","ip":"198.18.0.1","bridges":{"mesos_bridge":true,"docker_bridge":false},"vtep":"100.64.0.1","leases":{"g":{"subnet":"10.9.0.0/24","subnet6":"fd09::/64"}},"version":4}],
		"tombstones":{},"servers":{},"requests":[{"id":"r1","index":4,"op":"register","digest":"x","current_agent":"a1"}]}`
	tbl := NewLeaseTable()
	if err := tbl.Restore(5, strings.NewReader(legacy)); err != nil {
		t.Fatal(err)
	}
	h := &tableHarness{t: t, table: tbl, index: 5}
	if got := blocksOf(t, h, "a1"); !slices.Equal(got, []string{
		"docker 10.9.0.128/25 lease", "docker fd09::8000:0:0:0/65 lease", "mesos 10.9.0.0/25 lease", "mesos fd09::/65 lease",
	}) {
		t.Errorf("restored blocks %q", got)
	}
	checkTable(t, tbl)
	res := h.apply(command{Op: opGrow, Grow: &growCmd{AgentID: "a1", Overlay: "g", Bridge: api.BridgeMesos, Family: 4}})
	if res.Err != nil || !slices.Contains(blocksOf(t, h, "a1"), "mesos 10.9.1.0/25 grow") {
		t.Errorf("grow after a format 2 restore: %v %q", res.Err, blocksOf(t, h, "a1"))
	}
	if a2 := h.mustRegister("a2", "198.18.0.2"); a2.Overlay("g").Subnet != "" {
		t.Errorf("a2 leased %s, inside space a1 holds", a2.Overlay("g").Subnet)
	}
	checkTable(t, tbl)
}

// Grown blocks take the configured size (netconfig checks grow_prefix).
func TestGrowPrefixConfig(t *testing.T) {
	h := newHarness(t, cfgWith(api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/22", Prefix: 24, GrowPrefix: 27}))
	h.mustRegister("a1", "198.18.0.1")
	if res := h.apply(command{Op: opGrow, Grow: &growCmd{AgentID: "a1", Overlay: "g", Bridge: api.BridgeMesos, Family: 4}}); res.Err != nil ||
		!slices.Contains(blocksOf(t, h, "a1"), "mesos 10.9.1.0/27 grow") {
		t.Errorf("grow with grow_prefix 27: %v %q", res.Err, blocksOf(t, h, "a1"))
	}
}

// A grow retried with its request id has one effect; the id reused for
// another request is refused.
func TestGrowRequestID(t *testing.T) {
	h := newHarness(t, growCfg())
	h.mustRegister("a1", "198.18.0.1")
	grow := command{Op: opGrow, RequestID: "g1", Grow: &growCmd{AgentID: "a1", Overlay: "g", Bridge: api.BridgeMesos, Family: 4}}
	first := h.apply(grow)
	second := h.apply(grow)
	if first.Err != nil || second.Err != nil || !slices.Equal(first.Agent.Overlay("g").Blocks, second.Agent.Overlay("g").Blocks) {
		t.Fatalf("retried grow: %v %v", first, second)
	}
	if n := len(h.table.agents["a1"].Leases["g"].Blocks); n != 5 {
		t.Errorf("a1 holds %d blocks after a retried grow, want 5", n)
	}
	other := grow
	other.Grow = &growCmd{AgentID: "a1", Overlay: "g", Bridge: api.BridgeDocker, Family: 4}
	if res := h.apply(other); !errors.Is(res.Err, ErrRequestIDReused) {
		t.Errorf("request id reused: %v", res.Err)
	}
}

// FuzzGrowthBodies: the decoders and validators of the growth routes'
// bodies never panic, and what they accept applies to a table without
// breaking its invariants.
func FuzzGrowthBodies(f *testing.F) {
	f.Add(0, []byte(`{"overlay":"g","bridge":"mesos","family":"4","request_id":"r"}`))
	f.Add(0, []byte(`{"overlay":"g","bridge":"docker","family":"6"}`))
	f.Add(1, []byte(`{"overlay":"g","prefix":"10.9.3.0/25"}`))
	f.Add(1, []byte(`{"overlay":"g","prefix":"10.9.0.0/24"}`))
	f.Add(1, []byte(`{"overlay":"g","prefix":"10.9.3.0/25","version":12,"restore_epoch":3}`))
	f.Add(1, []byte(`{"overlay":"g","prefix":"10.9.3.0/25","restore_epoch":3}`))
	f.Add(2, []byte(`{"overlay":"g","prefix":"10.9.0.64/26","donor":"a1","recipient":"a2"}`))
	f.Add(2, []byte(`{"overlay":"g","prefix":"fd09::/66","donor":"a2","recipient":"a1","bridge":"docker"}`))
	f.Add(3, []byte(`{"overlays":[{"name":"g","blocks":[{"prefix":"10.9.0.0/25","used":1,"free":2}]}],"state_index":9}`))
	f.Add(3, []byte(`{"overlays":[{"name":"g","blocks":[{"prefix":"10.9.0.1/25"}]}]}`))
	f.Fuzz(func(t *testing.T, kind int, data []byte) {
		h := newHarness(t, growCfg())
		h.mustRegister("a1", "198.18.0.1")
		h.mustRegister("a2", "198.18.0.2")
		decode := func(v any) bool { return api.DecodeStrict(strings.NewReader(string(data)), v) == nil }
		var cmd logcmd.Command
		var err error
		switch kind & 3 {
		case 0:
			var req api.GrowRequest
			if !decode(&req) {
				return
			}
			cmd, err = logcmd.GrowCommand("a1", req)
		case 1:
			var req api.ReturnRequest
			if !decode(&req) {
				return
			}
			cmd, err = logcmd.ReturnCommand("a1", req)
		case 2:
			var req api.GrantReport
			if !decode(&req) {
				return
			}
			cmd, err = logcmd.GrantCommand(req.Recipient, req)
		default:
			var req api.UsageReport
			if !decode(&req) || usage.Validate(&req) != nil {
				return
			}
			if _, err := h.table.RecordUsage("a1", &req); err != nil {
				t.Fatalf("usage of a known agent: %v", err)
			}
		}
		if err == nil && cmd.Op != "" {
			h.apply(cmd)
		}
		checkTable(t, h.table)
	})
}

// TestReRegisteredAgentTakesBackItsQuarantine: an agent deleted while
// others are live and registered again under its id (its data dir, hence
// its ring and its grants, came back with it) is leased its own
// quarantined slice again, so its containers keep their addresses; a
// slice of it holding a reported grant is not a whole slice of its own, and
// another agent never gets the quarantined space.
func TestReRegisteredAgentTakesBackItsQuarantine(t *testing.T) {
	h := newHarness(t, growCfg())
	h.mustRegister("a", "198.18.0.1")
	h.mustRegister("b", "198.18.0.2")
	h.mustRegister("c", "198.18.0.3")
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"b"}}})
	n := h.mustRegister("n", "198.18.0.4")
	if s := subnetIn(n, "g"); s == "10.9.1.0/24" {
		t.Fatalf("another agent was leased b's quarantined subnet %s", s)
	}
	b := h.mustRegister("b", "198.18.0.2")
	if s := subnetIn(b, "g"); s != "10.9.1.0/24" {
		t.Errorf("b registered again was leased %q, want its own 10.9.1.0/24 back", s)
	}
	if q := h.table.quarantine["g"]; len(q) != 0 {
		t.Errorf("b's space is still quarantined: %+v", q)
	}
	checkTable(t, h.table)

	// c grants a /26 to a, is deleted, and the grant is reported late: c
	// coming back gets a fresh slice, not its subnet with a's grant in it.
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"c"}}})
	if res := h.apply(command{Op: opGrant, Grant: &grantCmd{Overlay: "g", Prefix: netip.MustParsePrefix("10.9.2.0/26"), Donor: "c", Recipient: "a"}}); res.Err != nil {
		t.Fatalf("late grant report: %v", res.Err)
	}
	c := h.mustRegister("c", "198.18.0.3")
	if s := subnetIn(c, "g"); s == "10.9.2.0/24" {
		t.Errorf("c was leased its old subnet %s, which holds a's grant", s)
	}
	checkTable(t, h.table)
}

// subnetIn is an agent's subnet of an overlay, "" when it has none.
func subnetIn(a *api.AgentInfo, overlay string) string {
	if ov := a.Overlay(overlay); ov != nil {
		return ov.Subnet
	}
	return ""
}

// TestReRegisteredAgentTakesBackItsGrownBlocks: an agent deleted with
// containers in blocks it grew, and registered again under its id, gets
// those blocks back too (its ring refuses to hand space where it has
// allocations to nobody: without them it could serve nothing, and never
// send the complete usage report that releases a quarantine).
func TestReRegisteredAgentTakesBackItsGrownBlocks(t *testing.T) {
	h := newHarness(t, growCfg())
	h.mustRegister("a", "198.18.0.1")
	h.mustRegister("b", "198.18.0.2")
	if res := h.apply(command{Op: opGrow, Grow: &growCmd{AgentID: "b", Overlay: "g", Bridge: api.BridgeDocker, Family: 4}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	grown := blocksOf(t, h, "b")
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"b"}}})
	b := h.mustRegister("b", "198.18.0.2")
	if got := blocksOf(t, h, "b"); !slices.Equal(got, grown) {
		t.Errorf("b registered again holds %q, want its blocks %q back", got, grown)
	}
	if q := h.table.quarantine["g"]; len(q) != 0 {
		t.Errorf("b's space is still quarantined: %+v", q)
	}
	if subnetIn(b, "g") != "10.9.1.0/24" {
		t.Errorf("b's subnet %q", subnetIn(b, "g"))
	}
	checkTable(t, h.table)
}

// TestGrantStatementUsedOnce (issue 26, item 3): a donor's signed statement
// moves space once. After the block went back and the donor holds it again,
// the recipient posting the same statement under a new request id (the
// request-id memory rolled over, or a restore emptied it) is refused, also
// after a restore of a snapshot from before the grant; a retry while the
// recipient still holds the block is answered as before.
func TestGrantStatementUsedOnce(t *testing.T) {
	h := newHarness(t, growCfg())
	h.mustRegister("donor", "198.18.0.1")
	h.mustRegister("recip", "198.18.0.2")
	var before bytes.Buffer
	if err := h.table.WriteSnapshot(&before); err != nil {
		t.Fatal(err)
	}
	statement := logcmd.StatementID("donor's signature")
	grant := func(requestID string) Result {
		return h.apply(command{Op: opGrant, RequestID: requestID, Grant: &grantCmd{Overlay: "g", Prefix: netip.MustParsePrefix("10.9.0.32/27"),
			Donor: "donor", Recipient: "recip", Statement: statement, Expires: 2_000_000_000}})
	}
	if res := grant("r1"); res.Err != nil {
		t.Fatalf("the first use of the statement: %v", res.Err)
	}
	if res := grant("r2"); res.Err != nil {
		t.Errorf("a retry while the recipient holds the block: %v", res.Err)
	}
	// The block goes back to the donor.
	if res := h.apply(command{Op: opReturn, Return: &returnCmd{AgentID: "recip", Overlay: "g", Prefix: netip.MustParsePrefix("10.9.0.32/27")}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if !slices.Contains(blocksOf(t, h, "donor"), "mesos 10.9.0.0/25 lease") {
		t.Fatalf("the donor does not hold the block again: %q", blocksOf(t, h, "donor"))
	}
	if res := grant("r3"); !errors.Is(res.Err, ErrStatementUsed) {
		t.Errorf("the statement posted again after the block went back: %v, want ErrStatementUsed", res.Err)
	}
	// A restore of the state from before the grant keeps what was used.
	h.apply(command{Op: opRestore, Restore: &restoreCmd{Snapshot: bytes.TrimSpace(before.Bytes())}})
	if res := grant("r4"); !errors.Is(res.Err, ErrStatementUsed) {
		t.Errorf("the statement posted after a restore: %v, want ErrStatementUsed", res.Err)
	}
	// So does a snapshot of the table (a restarted master).
	if res := (&tableHarness{t: t, table: restoreCopy(t, h), index: h.index}).apply(command{Op: opGrant, RequestID: "r5", Grant: &grantCmd{Overlay: "g",
		Prefix: netip.MustParsePrefix("10.9.0.32/27"), Donor: "donor", Recipient: "recip", Statement: statement, Expires: 2_000_000_000}}); !errors.Is(res.Err, ErrStatementUsed) {
		t.Errorf("the statement posted to a master restarted from a snapshot: %v, want ErrStatementUsed", res.Err)
	}
	// Once expired (a compaction past its expiry), it is forgotten.
	h.apply(command{Op: opCompact, Compact: &compactCmd{Now: 2_000_000_001 * 1000, MaxAge: 1}})
	if _, ok := h.table.usedStatements[statement]; ok {
		t.Error("an expired statement is still kept")
	}
}

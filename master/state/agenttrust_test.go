package state

import (
	"crypto/ed25519"
	"crypto/rand"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/record"
)

func intp(n int) *int { return &n }

// TestAgentTrust: the live agents' reports are judged against the table:
// another key (or none) than the masters', a refusal, and fewer peers
// programmed than the records at the report's index give the agent (not
// counting what came after it, nor the agent itself, nor agents of a
// disabled overlay); silent agents are left out.
func TestAgentTrust(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	oldPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, oldKey := api.EncodeSigningKey(pub), api.EncodeSigningKey(oldPub)
	cfg := cfgWith(api.OverlayNetwork{Name: "carve", Subnet: "10.128.0.0/9", Prefix: 24},
		api.OverlayNetwork{Name: "off", Subnet: "10.64.0.0/10", Prefix: 24, Enabled: boolp(false)})
	h := newHarness(t, cfg)
	var versions []uint64
	for _, id := range []string{"a1", "a2", "a3", "a4"} {
		versions = append(versions, h.mustRegister(id, "198.18.0."+id[1:]).Version)
	}
	// a5 registers after every report below: never counted.
	h.mustRegister("a5", "198.18.0.5")
	report := func(id string, rep api.ReportRequest) {
		t.Helper()
		rep.Version = versions[id[1]-'1']
		if res := h.apply(command{Op: opReport, Report: &reportCmd{AgentID: id, Report: rep}}); res.Err != nil {
			t.Fatalf("report of %s: %v", id, res.Err)
		}
	}
	last := versions[3]
	report("a1", api.ReportRequest{SigningKey: key, ProgrammedPeers: intp(3), PeersIndex: last})           // all three others
	report("a2", api.ReportRequest{SigningKey: oldKey, ProgrammedPeers: intp(1), PeersIndex: versions[1]}) // a1 alone existed: enough
	report("a3", api.ReportRequest{SigningKey: key, ProgrammedPeers: intp(1), PeersIndex: last})           // two missing
	report("a4", api.ReportRequest{SigningKey: oldKey, Refusing: "the masters sign with key x"})           // refusing: no count
	tests := []struct {
		name   string
		key    string
		silent map[string]bool
		want   api.AgentTrust
	}{
		{"judged", key, nil, api.AgentTrust{
			OtherKey:      []api.AgentKey{{AgentID: "a2", SigningKey: oldKey}, {AgentID: "a4", SigningKey: oldKey}, {AgentID: "a5"}},
			OtherKeyCount: 3,
			Refusing:      []api.AgentRefusing{{AgentID: "a4", Reason: "the masters sign with key x"}}, RefusingCount: 1,
			FewPeers: []api.AgentFewPeers{{AgentID: "a3", Programmed: 1, Expected: 3, Index: last}}, FewPeersCount: 1,
		}},
		{"silent agents left out", key, map[string]bool{"a3": true, "a4": true, "a5": true}, api.AgentTrust{
			OtherKey: []api.AgentKey{{AgentID: "a2", SigningKey: oldKey}}, OtherKeyCount: 1,
		}},
		{"masters that sign nothing judge no key", "", map[string]bool{"a3": true}, api.AgentTrust{
			Refusing: []api.AgentRefusing{{AgentID: "a4", Reason: "the masters sign with key x"}}, RefusingCount: 1,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := h.table.AgentTrust(tt.key, tt.silent); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %s\nwant %s", mustJSON(t, got), mustJSON(t, tt.want))
			}
		})
	}
}

// TestAgentTrustByMesh: the live agents are grouped by the pair of mesh
// password fingerprints they report, sorted by the pair, with agents
// that report none in the ("", "") group; silent agents are left out,
// and no group is given when no live agent reports a password.
func TestAgentTrustByMesh(t *testing.T) {
	h := newHarness(t, cfgWith(api.OverlayNetwork{Name: "carve", Subnet: "10.128.0.0/9", Prefix: 24}))
	versions := map[string]uint64{}
	for _, id := range []string{"a1", "a2", "a3", "a4"} {
		versions[id] = h.mustRegister(id, "198.18.0."+id[1:]).Version
	}
	oldFP, nextFP := api.MeshPasswordFingerprint([]byte("old")), api.MeshPasswordFingerprint([]byte("next"))
	for id, rep := range map[string]api.ReportRequest{
		"a1": {MeshPassword: oldFP, MeshAccepted: nextFP},
		"a2": {MeshPassword: oldFP},
		"a3": {MeshPassword: oldFP, MeshAccepted: nextFP},
		// a4 reports no password (an agent that predates the field).
	} {
		rep.Version = versions[id]
		if res := h.apply(command{Op: opReport, Report: &reportCmd{AgentID: id, Report: rep}}); res.Err != nil {
			t.Fatalf("report of %s: %v", id, res.Err)
		}
	}
	tests := []struct {
		name   string
		silent map[string]bool
		want   []api.AgentMesh
	}{
		{"grouped", nil, sortedMesh([]api.AgentMesh{
			{Count: 1, Agents: []string{"a4"}},
			{Password: oldFP, Count: 1, Agents: []string{"a2"}},
			{Password: oldFP, Accepted: nextFP, Count: 2, Agents: []string{"a1", "a3"}},
		})},
		{"silent agents left out", map[string]bool{"a1": true, "a4": true}, sortedMesh([]api.AgentMesh{
			{Password: oldFP, Count: 1, Agents: []string{"a2"}},
			{Password: oldFP, Accepted: nextFP, Count: 1, Agents: []string{"a3"}},
		})},
		{"no live agent reports a password", map[string]bool{"a1": true, "a2": true, "a3": true}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := h.table.AgentTrust("", tt.silent).ByMesh; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %s\nwant %s", mustJSON(t, got), mustJSON(t, tt.want))
			}
		})
	}
}

// sortedMesh sorts groups by (password, accepted), as AgentTrust does.
func sortedMesh(g []api.AgentMesh) []api.AgentMesh {
	slices.SortFunc(g, func(a, b api.AgentMesh) int {
		return strings.Compare(a.Password+"/"+a.Accepted, b.Password+"/"+b.Accepted)
	})
	return g
}

// FuzzReportDecode: an agent's report (with the key, refusal and peer
// count it carries) never panics the decoder, the validator or the
// table, and what the validator accepts applies and is judged.
func FuzzReportDecode(f *testing.F) {
	f.Add([]byte(`{"version":2,"overlays":[{"name":"carve","status":"STATUS_OK"}],"signing_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","programmed_peers":0,"peers_index":2}`))
	f.Add([]byte(`{"version":2,"refusing":"the masters sign with key x"}`))
	f.Add([]byte(`{"version":2,"programmed_peers":-1}`))
	f.Add([]byte(`{"version":2,"signing_key":"x"}`))
	f.Add([]byte(`{"version":2,"mesh_password":"0123456789abcdef","mesh_accepted":"fedcba9876543210"}`))
	f.Add([]byte(`{"version":2,"mesh_accepted":"0123456789abcdef"}`))
	f.Add([]byte(`{"version":2,"mesh_password":"0123456789abcdeF"}`))
	f.Add([]byte(`{"version":99,"peers_index":18446744073709551615,"programmed_peers":9223372036854775807}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var req api.ReportRequest
		if err := api.DecodeStrict(strings.NewReader(string(data)), &req); err != nil {
			return
		}
		tbl := NewLeaseTable()
		cfg := DefaultConfig()
		for i, c := range []command{{Op: opSetConfig, SetConfig: &cfg}, {Op: opRegister, Register: &registerCmd{AgentID: "a1", IP: "198.18.0.1"}},
			{Op: opReport, Report: &reportCmd{AgentID: "a1", Report: req}}} {
			b, err := encodeCommand(c)
			if err != nil {
				t.Fatal(err)
			}
			res := tbl.Apply(uint64(i+1), b).(Result)
			if _, verr := record.ReportOf(req); c.Op == opReport && verr == nil && req.Version <= 2 && res.Err != nil {
				t.Fatalf("a valid report refused: %v", res.Err)
			}
		}
		_ = tbl.AgentTrust("", nil)
	})
}

package logcmd

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
)

// goldenCommands builds one command of every kind, as the masters propose
// them.
func goldenCommands(t testing.TB) map[string]Command {
	t.Helper()
	out := map[string]Command{}
	add := func(name string, c Command, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = c
	}
	c, err := RegisterCommand(api.RegisterRequest{AgentID: "a1", IP: "198.18.0.1", Hostname: "h1", MeshAddr: "198.18.0.1:6783",
		NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}, UnderlayMTU: 1500, CarveVersion: "v0.4.0", RequestID: "r1"})
	add("register", c, err)
	c, err = ReportCommand("a1", api.ReportRequest{Version: 3, ConfigurationAttempts: 1, RequestID: "r2", Overlays: []api.OverlayReport{{Name: "carve", Status: api.StatusOK}}})
	add("report", c, err)
	add("delete agent", DeleteAgentCommand("a1"), nil)
	c, err = DeleteAgentsCommand(api.DeleteAgentsRequest{Agents: []string{"a1", "198.18.0.2"}, RequestID: "r3"})
	add("delete agents", c, err)
	c, err = GrowCommand("a1", api.GrowRequest{Overlay: "carve", Bridge: api.BridgeDocker, Family: "6", RequestID: "r4"})
	add("grow", c, err)
	c, err = ReturnCommand("a1", api.ReturnRequest{Overlay: "carve", Prefix: "10.128.3.0/26", RequestID: "r5"})
	add("return", c, err)
	c, err = ReturnCommand("a1", api.ReturnRequest{Overlay: "carve", Prefix: "10.128.3.0/26", RequestID: "r8", Version: 41, RestoreEpoch: 1800000000000000000})
	add("return naming its lease", c, err)
	c, err = GrantCommand("a2", api.GrantReport{Overlay: "carve", Prefix: "10.128.1.128/25", Donor: "a1", Recipient: "a2", Bridge: api.BridgeMesos,
		DonorSignature: "c2lnbmF0dXJl", Expires: 1800000000, RequestID: "r6"})
	add("grant", c, err)
	add("set config", SetConfigCommand(api.NetworkConfig{VTEPSubnet: "100.64.0.0/16", Overlays: []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/16", Prefix: 24}}}), nil)
	add("server meta", ServerMetaCommand(ServerMeta{ID: "m1", RaftAddr: "198.18.0.100:7000", HTTPAddr: "198.18.0.100:7001"}), nil)
	add("cluster id", ClusterIDCommand("c1"), nil)
	add("compact", CompactCommand(time.UnixMilli(1800000000000), time.Hour), nil)
	c, err = RevokeCommand(api.RevokeRequest{Serial: "0A:1B:2C", Identity: "agent/a1", NotAfter: 1900000000, RequestID: "r7"})
	add("revoke", c, err)
	// A restore as masters of v0.4 proposed it (no quarantine), as masters
	// built between v0.4 and the keep_live field proposed it, and as
	// RestoreCommand proposes it now: each replays as it was applied.
	add("restore", Command{Op: OpRestore, Restore: &Restore{Epoch: 1800000000000000000, Snapshot: []byte(`{"format":3,"index":7}`)}}, nil)
	add("restore that quarantines", Command{Op: OpRestore, Restore: &Restore{Epoch: 1800000000000000000, Snapshot: []byte(`{"format":3,"index":7}`), Quarantine: true}}, nil)
	add("restore that keeps live agents' blocks", RestoreCommand([]byte(`{"format":3,"index":7}`), time.Unix(1800000000, 0)), nil)
	add("release", ReleaseCommand(map[string]HoldingsAck{"a1": {Created: 4, Index: 9}, "a2": {Created: 5, Index: 8}}), nil)
	return out
}

// TestGoldenEntries: every kind of command encodes to the bytes, and has
// the digest, that master/state wrote before the commands moved here
// (issue 30; master/state's TestGoldenTableBytes covers them in a table's
// history too). A difference is a change of the Raft log's format: masters
// of mixed versions would read each other's entries differently, and a
// retry's digest would no longer match its request's.
func TestGoldenEntries(t *testing.T) {
	golden := []struct{ name, entry, digest string }{
		{"register", `{"op":"register","request_id":"r1","register":{"agent_id":"a1","hostname":"h1","ip":"198.18.0.1","mesh_addr":"198.18.0.1:6783","bridges":{"mesos_bridge":true,"docker_bridge":false},"underlay_mtu":1500,"carve_version":"v0.4.0"}}`, "03254c61aee4b49bf6ff3fba47c2cbd8"},
		{"report", `{"op":"report","request_id":"r2","report":{"agent_id":"a1","report":{"version":3,"overlays":[{"name":"carve","status":"STATUS_OK"}],"configuration_attempts":1}}}`, "6f3660440fe31b345ad90319b91fdc5b"},
		{"delete agent", `{"op":"delete","delete":{"agents":["a1"],"strict":true}}`, "63f8ef3766e85ae5a3f1c386dc5ed768"},
		{"delete agents", `{"op":"delete","request_id":"r3","delete":{"agents":["a1","198.18.0.2"]}}`, "209b5cc449eba770556669196de31cdf"},
		{"grow", `{"op":"grow","request_id":"r4","grow":{"agent_id":"a1","overlay":"carve","bridge":"docker","family":6}}`, "0f256c6afae565fe2fb45614b382ec6b"},
		{"return", `{"op":"return","request_id":"r5","return":{"agent_id":"a1","overlay":"carve","prefix":"10.128.3.0/26"}}`, "d58fd89ce5b306189b8b3a93a73944ca"},
		{"return naming its lease", `{"op":"return","request_id":"r8","return":{"agent_id":"a1","overlay":"carve","prefix":"10.128.3.0/26","version":41,"restore_epoch":1800000000000000000}}`, "1429f813023a4b73d0a966944f6dd98b"},
		{"grant", `{"op":"grant","request_id":"r6","grant":{"overlay":"carve","prefix":"10.128.1.128/25","donor":"a1","recipient":"a2","bridge":"mesos","statement":"5b46b2821536f0a33e3459a1492479c048f3262e423aaf0536c17b89ac1e6d11","expires":1800000000}}`, "fc8d0857de38e1c7ef1b7317d1ba19b1"},
		{"set config", `{"op":"set_config","set_config":{"vtep_subnet":"100.64.0.0/16","overlays":[{"name":"carve","subnet":"10.128.0.0/16","prefix":24,"enabled":true}]}}`, "925540bff510f63dab70d142da979ed6"},
		{"server meta", `{"op":"server_meta","server_meta":{"id":"m1","raft_addr":"198.18.0.100:7000","http_addr":"198.18.0.100:7001"}}`, "adee667c3812f61a4b0750156a398971"},
		{"cluster id", `{"op":"set_cluster_id","cluster_id":"c1"}`, "b68b3285e5366345f2170d54db2adc12"},
		{"compact", `{"op":"compact","compact":{"now":1800000000000,"max_age":3600000}}`, "71df7994f13872ef8acf323dba3c267f"},
		{"revoke", `{"op":"revoke","request_id":"r7","revoke":{"serial":"a1b2c","identity":"agent/a1","not_after":1900000000}}`, "d7da8d0d1a91fc188006754a79213438"},
		{"restore", `{"op":"restore","restore":{"epoch":1800000000000000000,"snapshot":{"format":3,"index":7}}}`, "bd7ff96e287e9e98333dd7e0b4d6c888"},
		{"restore that quarantines", `{"op":"restore","restore":{"epoch":1800000000000000000,"snapshot":{"format":3,"index":7},"quarantine":true}}`, "001774f9e7602766ee3863e6a6bf34da"},
		{"restore that keeps live agents' blocks", `{"op":"restore","restore":{"epoch":1800000000000000000,"snapshot":{"format":3,"index":7},"quarantine":true,"keep_live":true}}`, "8686560655432fbbf2b4c060206684fe"},
		{"release", `{"op":"release_quarantine","release":{"acks":{"a1":{"created":4,"index":9},"a2":{"created":5,"index":8}}}}`, "008012d02d0bb18c3a164f07cd1d34bb"},
	}
	cmds := goldenCommands(t)
	if len(cmds) != len(golden) {
		t.Fatalf("%d commands built, %d golden entries", len(cmds), len(golden))
	}
	for _, g := range golden {
		t.Run(g.name, func(t *testing.T) {
			c := cmds[g.name]
			b, err := c.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != g.entry {
				t.Errorf("entry\n got %s\nwant %s", b, g.entry)
			}
			if d := c.Digest(); d != g.digest {
				t.Errorf("digest %s, want %s", d, g.digest)
			}
			back, err := Decode(b)
			if err != nil {
				t.Fatalf("Decode(%s): %v", b, err)
			}
			if d := back.Digest(); d != g.digest {
				t.Errorf("decoded digest %s, want %s", d, g.digest)
			}
		})
	}
}

// TestDigestIgnoresRequestID: a retry (same body, any request id) has the
// request's digest; another body has another.
func TestDigestIgnoresRequestID(t *testing.T) {
	a := DeleteAgentCommand("a1")
	b := a
	b.RequestID = "r9"
	if a.Digest() != b.Digest() {
		t.Errorf("the request id changed the digest")
	}
	if a.Digest() == DeleteAgentCommand("a2").Digest() {
		t.Errorf("another body has the same digest")
	}
}

// TestDecodeRefuses: an entry that is not JSON, of an unknown op, or
// without the body its op needs is refused with ErrBadCommand, naming why.
func TestDecodeRefuses(t *testing.T) {
	tests := []struct{ name, entry, want string }{
		{"not json", `{"op":`, "undecodable"},
		{"not an object", `[1]`, "undecodable"},
		{"unknown op", `{"op":"explode"}`, `unknown op "explode"`},
		{"no op", `{}`, `unknown op ""`},
		{"register without body", `{"op":"register"}`, "register without body"},
		{"restore without body", `{"op":"restore"}`, "restore without body"},
		{"compact in the past", `{"op":"compact","compact":{"now":0,"max_age":5}}`, "want both positive"},
		{"compact without age", `{"op":"compact","compact":{"now":5,"max_age":0}}`, "want both positive"},
		{"empty cluster id", `{"op":"set_cluster_id"}`, "set_cluster_id without body"},
		{"long cluster id", `{"op":"set_cluster_id","cluster_id":"` + strings.Repeat("c", 65) + `"}`, "longer than 64"},
		{"bad prefix", `{"op":"return","return":{"agent_id":"a","overlay":"o","prefix":"10.0.0.0/33"}}`, "undecodable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.entry))
			if !errors.Is(err, ErrBadCommand) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Decode(%s) = %v, want ErrBadCommand naming %q", tt.entry, err, tt.want)
			}
		})
	}
}

// FuzzDecode: any log entry is either refused with ErrBadCommand or gives
// a command with its op's body that encodes, decodes again and keeps its
// digest (so a replica that replays it, or a retry of it, sees the same
// request). The seeds are one entry of every kind and broken ones.
func FuzzDecode(f *testing.F) {
	for _, c := range goldenCommands(f) {
		b, err := c.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{`{"op":"register"}`, `{"op":"compact","compact":{"now":-1,"max_age":1}}`, `{"op":"grant","grant":{"prefix":"::/0"}}`,
		`{"op":"restore","restore":{"snapshot":{"format":99}}}`, `{"op":"release_quarantine","release":{"acks":null}}`, `null`, `"register"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrBadCommand) {
				t.Fatalf("Decode error %v does not wrap ErrBadCommand", err)
			}
			return
		}
		b, err := c.Encode()
		if err != nil {
			t.Fatalf("a decoded command does not encode: %v", err)
		}
		again, err := Decode(b)
		if err != nil {
			t.Fatalf("a re-encoded command does not decode: %v\n%s", err, b)
		}
		if again.Digest() != c.Digest() {
			t.Fatalf("the digest changed through an encoding:\n%s", b)
		}
	})
}

// TestValidateRegistration: a registration is refused with an error naming
// its bad field.
func TestValidateRegistration(t *testing.T) {
	ok := api.RegisterRequest{AgentID: "a1-S0", IP: "198.18.0.1", Hostname: "h1", MeshAddr: "198.18.0.1:6783"}
	if err := ValidateRegistration(&ok); err != nil {
		t.Fatalf("valid request refused: %v", err)
	}
	tests := []struct {
		name  string
		mod   func(r *api.RegisterRequest)
		field string
	}{
		{"missing agent_id", func(r *api.RegisterRequest) { r.AgentID = "" }, "agent_id"},
		{"agent_id with slash", func(r *api.RegisterRequest) { r.AgentID = "a/b" }, "agent_id"},
		{"agent_id with space", func(r *api.RegisterRequest) { r.AgentID = "a b" }, "agent_id"},
		{"missing ip", func(r *api.RegisterRequest) { r.IP = "" }, "ip"},
		{"invalid ip", func(r *api.RegisterRequest) { r.IP = "198.18.0.300" }, "ip"},
		{"loopback ip", func(r *api.RegisterRequest) { r.IP = "127.0.0.1" }, "ip"},
		{"unspecified ip", func(r *api.RegisterRequest) { r.IP = "0.0.0.0" }, "ip"},
		{"multicast ip", func(r *api.RegisterRequest) { r.IP = "224.0.0.1" }, "ip"},
		{"mapped ip", func(r *api.RegisterRequest) { r.IP = "::ffff:198.18.0.1" }, "ip"},
		{"mesh_addr no port", func(r *api.RegisterRequest) { r.MeshAddr = "198.18.0.1" }, "mesh_addr"},
		{"mesh_addr bad port", func(r *api.RegisterRequest) { r.MeshAddr = "198.18.0.1:99999" }, "mesh_addr"},
		{"hostname control char", func(r *api.RegisterRequest) { r.Hostname = "a\nb" }, "hostname"},
		{"request id too long", func(r *api.RegisterRequest) { r.RequestID = strings.Repeat("x", 129) }, "request_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.mod(&r)
			err := ValidateRegistration(&r)
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("error %v, want one naming %s", err, tt.field)
			}
		})
	}
}

// TestReturnNamesItsLease: a return's restore epoch comes with the
// block's version (what names the lease it gives back); one without the
// other is refused, naming the field.
func TestReturnNamesItsLease(t *testing.T) {
	_, err := ReturnCommand("a1", api.ReturnRequest{Overlay: "carve", Prefix: "10.128.3.0/26", RestoreEpoch: 3})
	if err == nil || !strings.Contains(err.Error(), "restore_epoch") || !strings.Contains(err.Error(), "version") {
		t.Fatalf("a restore epoch without a version: %v, want it refused naming both", err)
	}
	c, err := ReturnCommand("a1", api.ReturnRequest{Overlay: "carve", Prefix: "10.128.3.0/26", Version: 7})
	if err != nil || c.Return.Version != 7 || c.Return.RestoreEpoch != 0 {
		t.Fatalf("a version without an epoch (no restore yet): %+v, %v", c.Return, err)
	}
}

package state

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(cfg, DefaultConfig()) {
		t.Errorf("defaults = %+v", cfg)
	}
	cfg, err = ParseConfig([]byte(`{"vni": 7, "overlays": [{"name": "x", "subnet": "10.0.0.0/16", "prefix": 24, "enabled": false}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.VNI != 7 || cfg.VTEPName != DefaultVTEPName || cfg.Overlays[0].IsEnabled() {
		t.Errorf("partial config = %+v", cfg)
	}
}

// TestMTUsFollowTheUnderlayUnlessSet: absent MTUs stay 0 (the agents follow
// the smallest registered underlay), set ones are kept as they are.
func TestMTUsFollowTheUnderlayUnlessSet(t *testing.T) {
	tests := []struct {
		json          string
		vtep, overlay int
	}{
		{`{}`, 0, 0},
		{`{"overlay_mtu": 8900}`, 0, 8900},
		{`{"vtep_mtu": 1450, "overlay_mtu": 1420}`, 1450, 1420},
	}
	for _, tt := range tests {
		cfg, err := ParseConfig([]byte(tt.json))
		if err != nil {
			t.Fatalf("%s: %v", tt.json, err)
		}
		if cfg.VTEPMTU != tt.vtep || cfg.OverlayMTU != tt.overlay {
			t.Errorf("%s: vtep_mtu %d overlay_mtu %d, want %d %d", tt.json, cfg.VTEPMTU, cfg.OverlayMTU, tt.vtep, tt.overlay)
		}
	}
}

// TestInvalidConfigs has one case per validation rule of DESIGN.md; each
// error must name the offending field.
func TestInvalidConfigs(t *testing.T) {
	tests := []struct {
		name, json, field string
	}{
		{"malformed", `{"vni": `, "malformed JSON"},
		{"unknown field", `{"vtep_subnett": "100.64.0.0/16"}`, `"vtep_subnett"`},
		{"wrong type", `{"vni": "1024"}`, `"vni"`},
		{"trailing data", `{} {}`, "after the JSON object"},
		{"name too long", `{"overlays":[{"name":"abcdefghijklmn","subnet":"10.0.0.0/8","prefix":24}]}`, "overlays[0].name"},
		{"name empty", `{"overlays":[{"name":"","subnet":"10.0.0.0/8","prefix":24}]}`, "overlays[0].name"},
		{"name uppercase", `{"overlays":[{"name":"Dcos","subnet":"10.0.0.0/8","prefix":24}]}`, "overlays[0].name"},
		{"name reserved host", `{"overlays":[{"name":"host","subnet":"10.0.0.0/8","prefix":24}]}`, "reserved"},
		{"name reserved bridge", `{"overlays":[{"name":"bridge","subnet":"10.0.0.0/8","prefix":24}]}`, "reserved"},
		{"name reserved default", `{"overlays":[{"name":"default","subnet":"10.0.0.0/8","prefix":24}]}`, "reserved"},
		{"name reserved none", `{"overlays":[{"name":"none","subnet":"10.0.0.0/8","prefix":24}]}`, "reserved"},
		{"name duplicate", `{"overlays":[{"name":"a","subnet":"10.0.0.0/16","prefix":24},{"name":"a","subnet":"10.1.0.0/16","prefix":24}]}`, "overlays[1].name"},
		{"no subnet", `{"overlays":[{"name":"a"}]}`, "neither subnet nor subnet6"},
		{"subnet invalid", `{"overlays":[{"name":"a","subnet":"10.0.0/8","prefix":24}]}`, "overlays[0].subnet"},
		{"subnet host bits", `{"overlays":[{"name":"a","subnet":"10.0.0.1/8","prefix":24}]}`, "host bits"},
		{"subnet is v6", `{"overlays":[{"name":"a","subnet":"fd00::/8","prefix":24}]}`, "overlays[0].subnet"},
		{"vtep_subnet6 is v4", `{"vtep_subnet6":"10.0.0.0/8"}`, "vtep_subnet6"},
		{"vtep_subnet6 host bits", `{"vtep_subnet6":"fd01:a::1/64"}`, "host bits"},
		{"vtep_subnet6 too small", `{"vtep_subnet6":"fd01:a::/127"}`, "vtep_subnet6"},
		{"vtep_subnet6 overlaps subnet6", `{"vtep_subnet6":"fd01::/16","overlays":[{"name":"a","subnet6":"fd01:b::/64","prefix6":80}]}`, "overlaps vtep_subnet6"},
		{"vtep_subnet6 misspelt", `{"vtep_subnet_6":"fd01:a::/64"}`, `"vtep_subnet_6"`},
		{"subnets overlap", `{"overlays":[{"name":"a","subnet":"10.0.0.0/8","prefix":24},{"name":"b","subnet":"10.1.0.0/16","prefix":24}]}`, "overlaps"},
		{"subnet overlaps vtep", `{"overlays":[{"name":"a","subnet":"100.64.0.0/10","prefix":24}]}`, "overlaps vtep_subnet"},
		{"subnet6 overlap", `{"overlays":[{"name":"a","subnet6":"fd00::/16","prefix6":64},{"name":"b","subnet6":"fd00:1::/32","prefix6":64}]}`, "overlays[1].subnet6"},
		{"prefix not longer", `{"overlays":[{"name":"a","subnet":"10.0.0.0/24","prefix":24}]}`, "overlays[0].prefix"},
		{"prefix too long", `{"overlays":[{"name":"a","subnet":"10.0.0.0/24","prefix":31}]}`, "overlays[0].prefix"},
		{"prefix missing", `{"overlays":[{"name":"a","subnet":"10.0.0.0/16"}]}`, "overlays[0].prefix"},
		{"prefix without subnet", `{"overlays":[{"name":"a","subnet6":"fd00::/48","prefix6":64,"prefix":24}]}`, "overlays[0].prefix"},
		{"prefix6 too long", `{"overlays":[{"name":"a","subnet6":"fd00::/64","prefix6":127}]}`, "overlays[0].prefix6"},
		{"subnet6 is v4", `{"overlays":[{"name":"a","subnet6":"10.0.0.0/8","prefix6":24}]}`, "overlays[0].subnet6"},
		{"oui low bytes", `{"vtep_mac_oui":"70:B3:D5:00:00:01"}`, "vtep_mac_oui"},
		{"oui invalid", `{"vtep_mac_oui":"zz"}`, "vtep_mac_oui"},
		{"oui multicast", `{"vtep_mac_oui":"71:B3:D5:00:00:00"}`, "vtep_mac_oui"},
		{"vtep subnet too small prefix", `{"vtep_subnet":"100.0.0.0/7"}`, "vtep_subnet"},
		{"vtep subnet invalid", `{"vtep_subnet":"100.64.0.0"}`, "vtep_subnet"},
		{"vtep subnet v6", `{"vtep_subnet":"fd00::/64"}`, "vtep_subnet"},
		{"vtep mtu low", `{"vtep_mtu":551}`, "vtep_mtu"},
		{"overlay mtu low", `{"overlay_mtu":500}`, "overlay_mtu"},
		{"mtu v6 minimum", `{"overlay_mtu":1000,"overlays":[{"name":"a","subnet6":"fd00::/48","prefix6":64}]}`, "overlay_mtu"},
		{"vni too large", `{"vni":16777216}`, "vni"},
		{"vtep name too long", `{"vtep_name":"averyveryverylongname"}`, "vtep_name"},
		{"vtep name slash", `{"vtep_name":"a/b"}`, "vtep_name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.json))
			if err == nil {
				t.Fatalf("accepted %s", tt.json)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("error %q does not name %q", err, tt.field)
			}
		})
	}
}

func TestValidIPv6Config(t *testing.T) {
	_, err := ParseConfig([]byte(`{"overlays":[{"name":"dual","subnet":"10.0.0.0/8","prefix":24,"subnet6":"fd00::/48","prefix6":64},{"name":"six","subnet6":"fd01::/48","prefix6":80}]}`))
	if err != nil {
		t.Fatal(err)
	}
}

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

// FuzzParseConfig: any input is either refused with an error or gives a
// configuration that validates again and allocates without panicking.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"vtep_subnet":"100.64.0.0/30","overlays":[{"name":"a","subnet":"10.0.0.0/29","prefix":30}]}`))
	f.Add([]byte(`{"overlays":[{"name":"dual","subnet":"10.0.0.0/8","prefix":24,"subnet6":"fd00::/8","prefix6":126}]}`))
	f.Add([]byte(`{"vtep_mac_oui":"70:B3:D5:00:00:01"}`))
	f.Add([]byte(`{"overlays":[{"name":"a","subnet":"10.0.0.0/8","prefix":9,"enabled":false}]}`))
	// DC/OS's default configuration, and with dcos-net's VTEP port.
	dcos, err := os.ReadFile("testdata/dcos-default-network.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(dcos)
	f.Add([]byte(strings.Replace(string(dcos), `{"vtep_subnet"`, `{"vtep_port": 64000, "vtep_subnet"`, 1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			return
		}
		again, _ := json.Marshal(cfg)
		if _, err := ParseConfig(again); err != nil {
			t.Fatalf("accepted config does not re-validate: %v\n%s", err, again)
		}
		tbl := NewLeaseTable()
		c, _ := encodeCommand(command{Op: opSetConfig, SetConfig: &cfg})
		if res := tbl.Apply(1, c).(Result); res.Err != nil {
			t.Fatalf("valid config refused by the table: %v", res.Err)
		}
		for i := range 3 {
			r, _ := encodeCommand(command{Op: opRegister, Register: &registerCmd{AgentID: string(rune('a' + i)), IP: "198.18.0.1"}})
			tbl.Apply(uint64(2+i), r)
		}
		if _, _, err := tbl.StateJSON(""); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzRegistrationDecode: the registration decoder and validator never
// panic, and what they accept applies cleanly.
func FuzzRegistrationDecode(f *testing.F) {
	f.Add([]byte(`{"agent_id":"a1","ip":"198.18.0.1","network_config":{"mesos_bridge":true,"docker_bridge":false}}`))
	f.Add([]byte(`{"agent_id":"a1","ip":"fd00::1","mesh_addr":"[fd00::1]:6783"}`))
	f.Add([]byte(`{"agent_id":"","ip":""}`))
	f.Add([]byte(`{"agent_id":"a","ip":"1.2.3.4","extra":1}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var req api.RegisterRequest
		if err := api.DecodeStrict(strings.NewReader(string(data)), &req); err != nil {
			return
		}
		if err := ValidateRegistration(&req); err != nil {
			return
		}
		tbl := NewLeaseTable()
		cfg := DefaultConfig()
		c, _ := encodeCommand(command{Op: opSetConfig, SetConfig: &cfg})
		tbl.Apply(1, c)
		r, _ := encodeCommand(command{Op: opRegister, RequestID: req.RequestID, Register: &registerCmd{
			AgentID: req.AgentID, Hostname: req.Hostname, IP: req.IP, MeshAddr: req.MeshAddr, Bridges: req.NetworkConfig}})
		res := tbl.Apply(2, r).(Result)
		if res.Err != nil {
			t.Fatalf("validated registration refused by the table: %v", res.Err)
		}
		if res.Agent.AgentID != req.AgentID {
			t.Fatalf("agent id %q became %q", req.AgentID, res.Agent.AgentID)
		}
	})
}

// TestUnusableConfigs: issue 20, finding 6. Configurations that parse but
// cannot work are refused, the error naming the field and the fix.
func TestUnusableConfigs(t *testing.T) {
	tests := []struct {
		name, json, field, fix string
	}{
		{"empty overlays", `{"overlays":[]}`, "overlays: the list is empty", `"enabled": false`},
		{"overlay mtu above vtep mtu", `{"vtep_mtu":1450,"overlay_mtu":1500}`, "overlay_mtu: 1500 is above vtep_mtu 1450", "set overlay_mtu to at most 1450"},
		{"prefix 30", `{"overlays":[{"name":"a","subnet":"10.0.0.0/16","prefix":30}]}`, "overlays[0].prefix: 30 leaves overlay \"a\" no container address", "use at most 29"},
		{"prefix6 126", `{"overlays":[{"name":"a","subnet6":"fd00::/64","prefix6":126}]}`, "overlays[0].prefix6: 126 leaves", "use at most 125"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.json))
			if err == nil {
				t.Fatalf("accepted %s", tt.json)
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) || !strings.Contains(err.Error(), tt.fix) {
				t.Errorf("error %q: want ErrInvalidConfig naming %q and the fix %q", err, tt.field, tt.fix)
			}
		})
	}
	for _, ok := range []string{
		`{"vtep_mtu":1450,"overlay_mtu":1450}`,
		`{"overlays":[{"name":"a","subnet":"10.0.0.0/16","prefix":29}]}`,
		`{"overlays":[{"name":"a","subnet6":"fd00::/64","prefix6":125}]}`,
		`{"overlays":[{"name":"a","subnet":"10.0.0.0/16","prefix":24,"enabled":false}]}`,
	} {
		if _, err := ParseConfig([]byte(ok)); err != nil {
			t.Errorf("refused %s: %v", ok, err)
		}
	}
}

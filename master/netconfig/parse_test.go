package netconfig

import (
	"errors"
	"strings"
	"testing"
)

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := Parse([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if !Equal(cfg, Default()) {
		t.Errorf("defaults = %+v", cfg)
	}
	cfg, err = Parse([]byte(`{"vni": 7, "overlays": [{"name": "x", "subnet": "10.0.0.0/16", "prefix": 24, "enabled": false}]}`))
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
		cfg, err := Parse([]byte(tt.json))
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
			_, err := Parse([]byte(tt.json))
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
	_, err := Parse([]byte(`{"overlays":[{"name":"dual","subnet":"10.0.0.0/8","prefix":24,"subnet6":"fd00::/48","prefix6":64},{"name":"six","subnet6":"fd01::/48","prefix6":80}]}`))
	if err != nil {
		t.Fatal(err)
	}
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
			_, err := Parse([]byte(tt.json))
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
		if _, err := Parse([]byte(ok)); err != nil {
			t.Errorf("refused %s: %v", ok, err)
		}
	}
}

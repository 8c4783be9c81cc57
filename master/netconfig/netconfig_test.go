package netconfig

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestMerge: a change never moves what agents hold (the VTEP subnets in
// use, a leased overlay's subnets), keeps a dropped leased overlay
// disabled, leaves out a new overlay that overlaps a kept one, and says
// so in a warning; with nothing in use the new configuration is taken
// as it is.
func TestMerge(t *testing.T) {
	cur, err := New(WithDefaults(api.NetworkConfig{VTEPSubnet6: "fd01:a::/64", Overlays: []api.OverlayNetwork{
		{Name: "a", Subnet: "10.1.0.0/16", Prefix: 24},
		{Name: "b", Subnet: "10.2.0.0/16", Prefix: 24},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	next := WithDefaults(api.NetworkConfig{VTEPSubnet: "100.65.0.0/16", Overlays: []api.OverlayNetwork{
		{Name: "a", Subnet: "10.9.0.0/16", Prefix: 24},
		{Name: "c", Subnet: "10.2.0.0/17", Prefix: 24},
	}})
	tests := []struct {
		name     string
		use      InUse
		overlays []string // name subnet enabled, in order
		vtep     string
		warnings []string // substrings, one per warning, in order
	}{
		{"nothing held", InUse{}, []string{"a 10.9.0.0/16 true", "c 10.2.0.0/17 true"}, "100.65.0.0/16", nil},
		{"all held", InUse{VTEP: true, VTEP6: true, Overlays: map[string]bool{"a": true, "b": true}},
			[]string{"a 10.1.0.0/16 true", "b 10.2.0.0/16 false"}, "100.64.0.0/16",
			[]string{"vtep_subnet stays 100.64.0.0/16", `vtep_subnet6 stays "fd01:a::/64"`, `overlay "a" keeps subnet`, `overlay "b" is no longer configured`, `overlay "c" left out`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, warnings, err := Merge(cur, next, tt.use)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for o := range n.Overlays() {
				got = append(got, strings.Join([]string{o.Name(), o.Subnet().String(), map[bool]string{true: "true", false: "false"}[o.Enabled()]}, " "))
			}
			if !slices.Equal(got, tt.overlays) || n.VTEPNet().String() != tt.vtep {
				t.Errorf("overlays %q vtep %s, want %q %s", got, n.VTEPNet(), tt.overlays, tt.vtep)
			}
			if len(warnings) != len(tt.warnings) {
				t.Fatalf("warnings %q, want %d", warnings, len(tt.warnings))
			}
			for i, w := range tt.warnings {
				if !strings.Contains(warnings[i], w) {
					t.Errorf("warning %d %q, want one saying %q", i, warnings[i], w)
				}
			}
		})
	}
	// Nothing committed yet: the configuration as given, defaults filled.
	n, warnings, err := Merge(nil, api.NetworkConfig{}, InUse{})
	if err != nil || len(warnings) > 0 || !Equal(n.Config(), Default()) {
		t.Errorf("first merge: %v %q %+v", err, warnings, n.Config())
	}
}

// TestNetworkIsImmutable: what a Network hands out is a copy; changing it
// changes nothing of the Network (tables and snapshots share one).
func TestNetworkIsImmutable(t *testing.T) {
	cfg := WithDefaults(api.NetworkConfig{Dataplane: api.DataplaneRouted, Segments: []string{"198.18.0.0/24"},
		Overlays: []api.OverlayNetwork{{Name: "a", Subnet: "10.1.0.0/16", Prefix: 24, Enabled: new(true)}}})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := json.Marshal(n.Config())
	c := n.Config()
	c.Segments[0], c.Overlays[0].Name, *c.Overlays[0].Enabled = "x", "x", false
	o, _ := n.Overlay("a")
	oc := o.Config()
	*oc.Enabled = false
	if after, _ := json.Marshal(n.Config()); string(after) != string(before) {
		t.Errorf("the Network changed through a copy: %s, was %s", after, before)
	}
	if o, ok := n.Overlay("a"); !ok || !o.Enabled() || !o.Config().IsEnabled() {
		t.Errorf("overlay a: %v %+v", ok, o.Config())
	}
}

// FuzzParse: any input is either refused with an error wrapping
// ErrInvalidConfig or gives a configuration that validates again (also
// through its JSON) and parses into a Network (master/state's
// FuzzParseConfig applies it to a lease table).
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"vtep_subnet":"100.64.0.0/30","overlays":[{"name":"a","subnet":"10.0.0.0/29","prefix":29}]}`))
	f.Add([]byte(`{"overlays":[{"name":"dual","subnet":"10.0.0.0/8","prefix":24,"subnet6":"fd00::/8","prefix6":120,"grow_prefix6":124,"quota_prefix6":100}]}`))
	f.Add([]byte(`{"dataplane":"routed","segments":["198.18.0.0/24"]}`))
	f.Add([]byte(`{"encryption":"wireguard","wireguard_port":4789}`))
	dcos, err := os.ReadFile("../state/testdata/dcos-default-network.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(dcos)
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		again, _ := json.Marshal(cfg)
		if _, err := Parse(again); err != nil {
			t.Fatalf("accepted config does not re-validate: %v\n%s", err, again)
		}
		n, err := New(cfg)
		if err != nil {
			t.Fatalf("Validate accepted what New refuses: %v", err)
		}
		if !Equal(n.Config(), cfg) {
			t.Fatalf("Network config %+v, parsed %+v", n.Config(), cfg)
		}
	})
}

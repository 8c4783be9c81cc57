package kernel

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/vxlan"
)

// TestRoutedPath: the dataplane is asked for routed mode only by a network
// configuration with dataplane "routed" and no encryption (an encrypted
// network is never routed in the clear, even if a configuration asked).
func TestRoutedPath(t *testing.T) {
	tests := []struct {
		name     string
		network  *api.NetworkConfig
		routed   bool
		segments []netip.Prefix
	}{
		{"no configuration", nil, false, nil},
		{"vxlan by default", &api.NetworkConfig{}, false, nil},
		{"vxlan", &api.NetworkConfig{Dataplane: api.DataplaneVXLAN}, false, nil},
		{"routed", &api.NetworkConfig{Dataplane: api.DataplaneRouted}, true, nil},
		{"routed with segments", &api.NetworkConfig{Dataplane: api.DataplaneRouted, Segments: []string{"198.18.0.0/16", "bad"}},
			true, []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16")}},
		{"routed but encrypted", &api.NetworkConfig{Dataplane: api.DataplaneRouted, Encryption: api.EncryptionWireGuard}, false, nil},
		{"routed but strictly encrypted", &api.NetworkConfig{Dataplane: api.DataplaneRouted, Encryption: api.EncryptionWireGuardStrict}, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := vxlan.Desired{Routed: true, Segments: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}} // stale
			routedPath(&want, tt.network)
			if want.Routed != tt.routed || !slices.Equal(want.Segments, tt.segments) {
				t.Errorf("routed %v segments %v, want %v %v", want.Routed, want.Segments, tt.routed, tt.segments)
			}
		})
	}
}

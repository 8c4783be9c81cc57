package netconfig

import (
	"errors"
	"strings"
	"testing"
)

// TestDataplaneConfig: the routed dataplane and its segments are checked,
// and never accepted together with encryption.
func TestDataplaneConfig(t *testing.T) {
	tests := []struct {
		name string
		json string
		want string // substring of the error; "" for none
	}{
		{"vxlan by default", `{}`, ""},
		{"vxlan", `{"dataplane":"vxlan"}`, ""},
		{"routed", `{"dataplane":"routed"}`, ""},
		{"routed with segments", `{"dataplane":"routed","segments":["198.18.0.0/16","fd10::/64"]}`, ""},
		{"unknown mode", `{"dataplane":"host-gw"}`, "dataplane"},
		{"routed and encrypted", `{"dataplane":"routed","encryption":"wireguard"}`, "never routed in the clear"},
		{"segments without routed", `{"segments":["198.18.0.0/16"]}`, "segments"},
		{"segment with host bits", `{"dataplane":"routed","segments":["198.18.0.1/16"]}`, "segments[0]"},
		{"segment not a prefix", `{"dataplane":"routed","segments":["198.18.0.0/16","eth0"]}`, "segments[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.json))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Parse(%s): %v", tt.json, err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Parse(%s) = %v, want an invalid-config error naming %s", tt.json, err, tt.want)
			}
		})
	}
}
